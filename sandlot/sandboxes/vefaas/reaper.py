"""``VefaasReaper``: lists and kills the labelled sandboxes of the configured functions.

Uses ``ListSandboxes`` (filtered by ``Metadata`` when a run id is given, every page up to the
reported total) and ``KillSandbox`` of every function id in ``VEFAAS_FUNCTION_ID`` / the
``function_id`` option. The labels of every listed row are checked here too: a service that
ignores the filter must not make gc kill another run's sandboxes. Only the control plane is
used: no function route is needed. A sandbox that expired between listing and killing counts
as killed (the control plane answers 404).
"""

from __future__ import annotations

from typing import Any

from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.reaper import RemoteSandbox
from sandlot.sandboxes.vefaas.config import credentials, function_ids
from sandlot.sandboxes.vefaas.control import GONE, ControlPlane
from sandlot.sandboxes.vefaas.options import VefaasOptions


class VefaasReaper:
    """Reaper of the ``vefaas`` backend.

    Args:
        **options: fields of :class:`VefaasOptions` (credentials, functions, endpoint).

    Raises:
        BackendUnavailableError: SDK, credentials or function ids missing (routes are not
            needed).
    """

    backend = "vefaas"

    def __init__(self, **options: Any) -> None:
        opts = VefaasOptions(**options)
        self._functions = sorted(set(function_ids(opts)))
        self._control = ControlPlane(credentials(opts), opts)

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Live sandboxes with a ``sandlot.run_id`` label (= ``run_id`` if given)."""
        found = []
        for function_id in self._functions:
            rows = await self._control.list(function_id, {RUN_ID: run_id} if run_id else None)
            found += [
                RemoteSandbox("vefaas", row.id, row.metadata, row.status, function_id)
                for row in rows
                if RUN_ID in row.metadata
                and run_id in (None, row.metadata[RUN_ID])
                and row.status not in GONE
            ]
        return found

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """``KillSandbox``; a sandbox already gone is not an error.

        Raises:
            SandboxError: the control plane refused or could not be reached.
        """
        await self._control.kill(sandbox.handle, sandbox.id)
