"""The connection to the container engine: lazy SDK import, shared clients, bounded threads.

The ``docker`` SDK (7.x, https://docker-py.readthedocs.io/en/7.1.0/) is blocking. Every call
runs in a worker thread through :func:`run_blocking`, bounded by one capacity limiter per event
loop (in practice per process) so that a thousand sandboxes share a few dozen threads; the
long-running part of ``exec`` (reading the command's output) needs no thread at all.

One ``DockerClient`` per engine address is shared by all sandboxes: its ``requests`` session and
urllib3 connection pool are safe to use from several threads, and each exec attachment takes a
connection of its own out of the pool.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from anyio.lowlevel import RunVar

from sandlot._optional import require
from sandlot.errors import BackendUnavailableError, SandboxError, SandboxStartError
from sandlot.settings import settings

if TYPE_CHECKING:
    from docker import DockerClient

T = TypeVar("T")

_limiter: RunVar[anyio.CapacityLimiter] = RunVar("sandlot_docker_api_limiter")
_clients: dict[str, DockerClient] = {}  # by address; "" is the SDK's default socket
_clients_lock = threading.Lock()


class EngineUnreachableError(BackendUnavailableError, SandboxStartError):
    """The container engine does not answer at its address (not running, wrong DOCKER_HOST).

    Both a ``BackendUnavailableError`` and a ``SandboxStartError``; retryable, since an engine
    that is starting up or restarting answers again shortly.
    """

    retryable = True


def sdk() -> ModuleType:
    """Import the ``docker`` SDK.

    Raises:
        BackendUnavailableError: the SDK is not installed; names the ``sandlot[docker]`` extra.
    """
    return require("docker", "docker")


def api_limiter() -> anyio.CapacityLimiter:
    """The capacity limiter shared by every blocking Docker API call in this event loop.

    Its size is ``$SANDLOT_DOCKER_API_THREADS`` (default 32); its ``total_tokens`` may be
    changed at run time to resize the pool.
    """
    try:
        return _limiter.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(settings().docker_api_threads)
        _limiter.set(limiter)
        return limiter


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run the blocking ``fn(*args)`` in a worker thread under :func:`api_limiter`.

    The call is not abandoned on cancellation: a create or start that already reached the engine
    finishes, so its result (recorded by ``fn`` itself) can still be cleaned up.
    """
    return await anyio.to_thread.run_sync(fn, *args, limiter=api_limiter())


def describe_address(base_url: str | None) -> str:
    """Human description of the engine address, naming ``DOCKER_HOST`` as the knob to turn."""
    env = os.environ.get("DOCKER_HOST")
    if base_url is not None:
        return f"base_url={base_url} (DOCKER_HOST={env or 'unset'})"
    return (
        f"DOCKER_HOST={env}" if env else "DOCKER_HOST unset (default unix:///var/run/docker.sock)"
    )


def unreachable(base_url: str | None, exc: BaseException) -> EngineUnreachableError:
    """The error for an engine that does not answer, with how to start one."""
    return EngineUnreachableError(
        f"cannot reach the container engine at {describe_address(base_url)}: {exc}. "
        "Start a Docker API engine and point DOCKER_HOST at it: Docker (`systemctl start "
        "docker`, or Docker Desktop), or Podman's API (`podman system service --time=0 "
        "unix:///tmp/podman.sock &` and `export DOCKER_HOST=unix:///tmp/podman.sock`); "
        "see docs/docker.md."
    )


def get_client(base_url: str | None) -> DockerClient:
    """The shared client for ``base_url`` (``None``: from the environment). Blocking.

    Creating a client asks the engine for its API version (``GET /version``), so this is also
    the reachability check.

    Raises:
        BackendUnavailableError: no SDK, or an ``ssh://`` address (exec output is read from the
            raw attach socket, which the SDK's ssh transports do not expose).
        EngineUnreachableError: the engine does not answer.
    """
    address = base_url or os.environ.get("DOCKER_HOST", "")
    with _clients_lock:
        if (client := _clients.get(address)) is not None:
            return client
        docker = sdk()
        if address.startswith("ssh://"):
            raise BackendUnavailableError(
                f"{describe_address(base_url)}: ssh:// engine addresses are not supported by "
                "the docker backend; forward the socket (ssh -L /tmp/docker.sock:"
                "/var/run/docker.sock host) and use DOCKER_HOST=unix:///tmp/docker.sock"
            )
        # Exec attachments leave the pool for good, so the pool only has to cover the threads.
        pool = max(settings().docker_api_threads, 10)
        try:
            if base_url is None:
                client = docker.from_env(max_pool_size=pool)
            else:
                client = docker.DockerClient(base_url=base_url, max_pool_size=pool)
        except docker.errors.DockerException as exc:
            raise unreachable(base_url, exc) from exc
        _clients[address] = client
        return client


def is_connection_error(exc: BaseException) -> bool:
    """``True`` for a transport failure (engine gone, socket refused), not an engine answer."""
    import requests  # a dependency of the docker SDK, present whenever sdk() is

    return isinstance(exc, requests.exceptions.ConnectionError)


def api_error(what: str, exc: Exception, base_url: str | None) -> SandboxError:
    """Translate an SDK / transport exception into a ``SandboxError``.

    Connection failures and 5xx answers are retryable, 4xx answers are not.
    """
    import requests  # a dependency of the docker SDK, present whenever sdk() is

    if isinstance(exc, sdk().errors.APIError):
        status = exc.status_code
        retryable = status is None or status >= 500
        return SandboxError(f"{what}: {exc.explanation or exc}", retryable=retryable)
    if isinstance(exc, requests.exceptions.RequestException):
        return SandboxError(
            f"{what}: lost the container engine at {describe_address(base_url)}: {exc}",
            retryable=True,
        )
    return SandboxError(f"{what}: {exc}", retryable=False)
