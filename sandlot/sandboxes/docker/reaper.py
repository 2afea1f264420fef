"""``DockerReaper``: lists and removes labelled containers of a Docker Engine / Podman API.

Uses the ``docker`` SDK 7.1 low-level ``APIClient`` (``containers(all=True, filters=)``,
``remove_container(force=True, v=True)``; https://docker-py.readthedocs.io/en/7.1.0/api.html),
in worker threads. Label keys are those of :mod:`sandlot.sandboxes.labels`, which the docker
backend puts on every container.
"""

from __future__ import annotations

import contextlib

from sandlot.sandboxes.docker.commit import force_remove, list_snapshots
from sandlot.sandboxes.docker.engine import get_client, run_blocking, sdk
from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.reaper import RemoteSandbox


class DockerReaper:
    """Reaper of the ``docker`` backend.

    Args:
        base_url: engine address; ``None`` reads ``DOCKER_HOST`` like ``docker.from_env()``.

    Raises:
        BackendUnavailableError: the ``docker`` SDK is not installed.
        EngineUnreachableError: the engine does not answer.
    """

    backend = "docker"

    def __init__(self, base_url: str | None = None) -> None:
        self._api = get_client(base_url).api

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Containers (running or not) labelled ``sandlot.run_id`` (= ``run_id`` if given),
        then snapshot images (state ``"snapshot"``)."""
        label = f"{RUN_ID}={run_id}" if run_id else RUN_ID
        rows = await run_blocking(lambda: self._api.containers(all=True, filters={"label": label}))
        images = await run_blocking(list_snapshots, self._api, run_id)
        return [
            RemoteSandbox("docker", row["Id"], row.get("Labels") or {}, row.get("State", ""))
            for row in rows
        ] + [RemoteSandbox("docker", i["Id"], i.get("Labels") or {}, "snapshot") for i in images]

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Force-remove the container and its anonymous volumes, or the snapshot image (and the
        containers using it); gone already is fine."""
        if sandbox.state == "snapshot":
            await run_blocking(force_remove, self._api, sandbox.id)
            return

        def remove() -> None:
            with contextlib.suppress(sdk().errors.NotFound):
                self._api.remove_container(sandbox.id, force=True, v=True)

        await run_blocking(remove)
