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
        """Containers (running or not) labelled ``sandlot.run_id`` (= ``run_id`` if given)."""
        label = f"{RUN_ID}={run_id}" if run_id else RUN_ID
        rows = await anyio.to_thread.run_sync(
            lambda: self._api.containers(all=True, filters={"label": label})
        )
        return [
            RemoteSandbox("docker", row["Id"], row.get("Labels") or {}, row.get("State", ""))
            for row in rows
        ]

    async def kill(self, sandbox: RemoteSandbox) -> None:
        """Force-remove the container and its anonymous volumes; gone already is fine."""

        def remove() -> None:
            with contextlib.suppress(self._not_found):
                self._api.remove_container(sandbox.id, force=True, v=True)

        await anyio.to_thread.run_sync(remove)
