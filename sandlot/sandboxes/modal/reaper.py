"""``ModalReaper``: lists and terminates the labelled sandboxes of a Modal App.

Modal 1.6.4: ``App.lookup(name)`` (no create), ``Sandbox.list(app_id=, tags=)`` (running
sandboxes, tags matched server side), ``Sandbox.get_tags()``, ``Sandbox.terminate()``.
"""

from __future__ import annotations

from types import ModuleType

from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.modal.sdk import check_credentials, modal_sdk
from sandlot.sandboxes.reaper import RemoteSandbox


class ModalReaper:
    """Reaper of the ``modal`` backend.

    Args:
        app_name: the App the sandboxes were created in (``ModalOptions.app_name``).
        sdk: the ``modal`` module (tests pass a fake); ``None`` imports it.

    Raises:
        BackendUnavailableError: ``modal`` missing or no credentials.
    """

    backend = "modal"

    def __init__(self, app_name: str = "sandlot", sdk: ModuleType | None = None) -> None:
        self.sdk = sdk or modal_sdk()
        check_credentials()
        self.app_name = app_name

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Running sandboxes of the App that carry ``sandlot.run_id`` (= ``run_id`` if given)."""
        modal = self.sdk
        try:
            app = await modal.App.lookup.aio(self.app_name)
        except modal.exception.NotFoundError:
            return []  # no App, no sandboxes
        tags = {RUN_ID: run_id} if run_id else None
        found = []
        async for sb in modal.Sandbox.list.aio(app_id=app.app_id, tags=tags):
            labels = await sb.get_tags.aio()
            if RUN_ID in labels:
                found.append(RemoteSandbox("modal", sb.object_id, labels, "running", sb))
        return found

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Terminate ``sandbox`` (a no-op on Modal's side if it already finished)."""
        await sandbox.handle.terminate.aio()
