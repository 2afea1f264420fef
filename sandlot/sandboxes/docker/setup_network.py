"""The network of a container's environment install, taken away before the agent gets it.

A container created with ``network_mode="none"`` cannot be connected to a network later, so a
sandbox whose spec has no network but whose environment recipe must install packages is
created on the engine's default network, and :func:`disconnect_all` takes every network away
once the install is done: from then on the container has only ``lo``, as with ``"none"``.
Docker Engine and Podman (4.3, measured: name resolution fails after the disconnect) both
disconnect a running container (``POST /networks/{id}/disconnect``, Engine API v1.41).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandlot.errors import SandboxError

if TYPE_CHECKING:
    from docker import APIClient


def disconnect_all(api: APIClient, container: str) -> None:
    """Disconnect ``container`` from every network it is attached to. Blocking.

    Args:
        api: the engine's low-level client.
        container: the container's id.

    Raises:
        SandboxError: a network is still attached afterwards (not retryable: the sandbox must
            not be used with a network its spec does not allow).
        docker.errors.APIError: the engine refused a disconnect.
    """
    for network in _networks(api, container):
        api.disconnect_container_from_network(container, network, force=True)
    left = _networks(api, container)
    if left:
        raise SandboxError(
            f"container {container[:12]} is still attached to {', '.join(left)} after the "
            "environment install; the engine did not disconnect it",
            retryable=False,
        )


def _networks(api: APIClient, container: str) -> list[str]:
    settings = api.inspect_container(container).get("NetworkSettings") or {}
    return sorted(settings.get("Networks") or {})
