"""``DockerReaper``: lists and removes labelled containers of a Docker Engine / Podman API.

Uses the ``docker`` SDK 7.1 low-level ``APIClient`` (``containers(all=True, filters=)``,
``remove_container(force=True, v=True)``; https://docker-py.readthedocs.io/en/7.1.0/api.html),
in worker threads. Label keys are those of :mod:`sandlot.sandboxes.labels`, which the docker
backend puts on every container.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from sandlot._optional import require
from sandlot.sandboxes.docker.commit import force_remove, list_snapshots
from sandlot.sandboxes.labels import RUN_ID
from sandlot.sandboxes.reaper import RemoteSandbox


class DockerReaper:
    """Reaper of the ``docker`` backend.

    Args:
        base_url: engine address; ``None`` reads ``DOCKER_HOST`` like ``docker.from_env()``.

    Raises:
        BackendUnavailableError: the ``docker`` SDK is not installed.
    """

    backend = "docker"

    def __init__(self, base_url: str | None = None) -> None:
        docker = require("docker", "docker")
        client = docker.from_env() if base_url is None else docker.DockerClient(base_url=base_url)
        self._api: Any = client.api
        self._not_found: type[Exception] = docker.errors.NotFound

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        """Containers (running or not) labelled ``sandlot.run_id`` (= ``run_id`` if given),
        then snapshot images (state ``"snapshot"``)."""
        label = f"{RUN_ID}={run_id}" if run_id else RUN_ID
        rows = await anyio.to_thread.run_sync(
            lambda: self._api.containers(all=True, filters={"label": label})
        )
        images = await anyio.to_thread.run_sync(list_snapshots, self._api, run_id)
        return [
            RemoteSandbox("docker", row["Id"], row.get("Labels") or {}, row.get("State", ""))
            for row in rows
        ] + [RemoteSandbox("docker", i["Id"], i.get("Labels") or {}, "snapshot") for i in images]

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Force-remove the container and its anonymous volumes, or the snapshot image (and the
        containers using it); gone already is fine."""
        if sandbox.state == "snapshot":
            await anyio.to_thread.run_sync(force_remove, self._api, sandbox.id)
            return

        def remove() -> None:
            with contextlib.suppress(self._not_found):
                self._api.remove_container(sandbox.id, force=True, v=True)

        await anyio.to_thread.run_sync(remove)
