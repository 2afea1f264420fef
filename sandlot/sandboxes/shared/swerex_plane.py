"""A data plane that is a SWE-ReX server (swe-rex 1.4.0) in the sandbox, for any backend.

A backend whose platform only creates and kills instances (veFaaS) starts a SWE-ReX server in
each and reaches it through :class:`sandlot.runtimes.swerex.SwerexClient`: commands run as
polled jobs (:mod:`sandlot.sandboxes.shared.polled_jobs`) over ``/execute``, files move through
``/upload`` (bytes in) and ``base64`` over ``/execute`` (bytes out). :class:`SwerexPlane` is
that half of such a backend; the backend adds the control plane (create, kill, status).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
from pydantic import Field

from sandlot.errors import SandboxDeadError, SandboxFileError, SandboxStartError
from sandlot.runtimes.swerex import SwerexClient, SwerexHTTPError, SwerexUnavailableError
from sandlot.sandboxes.scale.backoff import poll
from sandlot.sandboxes.shared.polled_jobs import JOBS_DIR, PolledJobs
from sandlot.sandboxes.shared.swerex_bootstrap import bootstrap_command
from sandlot.sandboxes.transport import FILE_TIMEOUT_S, ExecOptions

log = logging.getLogger("sandlot.sandboxes")
T = TypeVar("T")

_PROBE_S = 5.0  # timeout of one /is_alive of the liveness probe
_READY_POLL_MAX_S = 0.25
_STATUS_MAX_S = 30.0


class SwerexPlaneOptions(ExecOptions):
    """Options of a SWE-ReX data plane (a backend's options extend them), with
    :class:`~sandlot.sandboxes.transport.ExecOptions`'s.

    Attributes:
        request_retries: data-plane retries after a connection failure or a 5xx answer.
        server_restart_s: seconds the SWE-ReX server of a running instance may refuse
            requests (a restart) before the sandbox is declared dead.
        port: port of the SWE-ReX server in the instance.
        bootstrap: the instance's start command, a template with ``{workdir}``, ``{port}`` and
            ``{token}``; it must end by ``exec``-ing a SWE-ReX server (PID 1). ``None`` uses
            :data:`sandlot.sandboxes.shared.swerex_bootstrap.DEFAULT_BOOTSTRAP`.
        ready_timeout_s: seconds to wait for the SWE-ReX server to answer after creation.
        swerex_python: path, inside the instance, of a Python interpreter that already has
            ``swe-rex`` (pre-staged in the image or on a mounted volume); the default bootstrap
            then starts the server with it and installs nothing. ``None``: the image's
            ``swerex-remote`` / ``python3``.
        swerex_find_links: a directory in the instance or an ``http(s)`` URL holding the wheels
            of ``swe-rex`` and its dependencies (``pip download swe-rex==1.4.0 -d DIR``); when
            the image lacks swe-rex the bootstrap installs from there with ``--no-index``, so
            the platform needs no PyPI egress. ``None``: install from PyPI.
    """

    request_retries: int = Field(default=3, ge=0)
    server_restart_s: float = Field(default=10.0, ge=0)
    port: int = Field(default=8000, gt=0, lt=65536)
    bootstrap: str | None = None
    ready_timeout_s: float = Field(default=300.0, gt=0)
    swerex_python: str | None = None
    swerex_find_links: str | None = None


class SwerexPlane(PolledJobs):
    """The data-plane half of a backend: set ``_client`` once the server is reachable.

    ``_probe`` (the backend's) should end with :meth:`_server_gone`, which also records whether
    the server answered (:meth:`_data` then tries a failed call once more).
    """

    options: SwerexPlaneOptions
    staging_dir: str = JOBS_DIR
    _client: SwerexClient | None = None
    _server_answered = False  # the last probe reached the SWE-ReX server
    status_first_s: float = 2.0
    """Seconds into :meth:`_wait_server` of its first status check."""

    @property
    def job_cap(self) -> int:  # type: ignore[override]
        return self.options.max_output_bytes

    @property
    def job_grace_s(self) -> float:  # type: ignore[override]
        return self.options.stop_grace_s

    @property
    def _data_client(self) -> SwerexClient:
        if self._client is None:  # closed while a command ran
            raise SandboxDeadError(f"sandbox {self.id} is closed")
        return self._client

    async def _close_client(self) -> None:
        """Close the data-plane client; a failure is logged (the instance is killed anyway)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:
                log.warning("sandbox %s: closing the data-plane client failed: %s", self.id, exc)

    def _server_command(self, workdir: str, token: str) -> str:
        """The instance's start command (:mod:`sandlot.sandboxes.shared.swerex_bootstrap`)."""
        o = self.options
        return bootstrap_command(
            o.bootstrap,
            workdir=workdir,
            port=o.port,
            token=token,
            python=o.swerex_python,
            find_links=o.swerex_find_links,
        )

    async def _wait_server(self, failed: Callable[[], Awaitable[None]]) -> None:
        """Poll ``/is_alive`` until the server answers (the STARTING slot is held meanwhile).

        Now and then (``status_first_s``, then x1.5 up to 30 s: the platform's status API is
        rate limited, and the server's answer is what ends the wait) ``failed()`` asks the
        control plane whether the instance failed; it raises ``SandboxStartError`` if so, and
        returns when the instance is still coming up or its status could not be read.

        Raises:
            SandboxStartError: ``failed()``'s, or no answer within ``ready_timeout_s``
                (retryable).
        """
        client, limit = self._data_client, self.options.ready_timeout_s
        interval = self.status_first_s
        next_status = time.monotonic() + interval

        async def ready() -> bool | None:
            nonlocal interval, next_status
            if await client.is_alive(timeout=min(10.0, limit)):
                return True
            if time.monotonic() >= next_status:
                interval = min(interval * 1.5, _STATUS_MAX_S)
                next_status = time.monotonic() + interval
                await failed()
            return None

        with anyio.move_on_after(limit):
            await poll(ready, first_s=0.02, max_s=_READY_POLL_MAX_S, factor=1.25)
            return
        raise SandboxStartError(
            f"sandbox {self.id}: the SWE-ReX server of instance {self.backend_id} did not "
            f"answer within ready_timeout_s={limit:g} s (does the bootstrap command start it? "
            "does the image reach PyPI if it must install swe-rex?)",
            retryable=True,
        )

    async def _server_gone(self) -> str | None:
        """Why the SWE-ReX server is dead, else ``None`` (it answered, or that cannot be told).

        ``GET /is_alive`` (``_PROBE_S`` per try, 0.1 s doubling up to 1 s between tries) while
        the server refuses, for up to ``server_restart_s``: a server that comes back (a
        restart) is alive, one that still refuses then is dead. Refusing is the gateway's 502
        (the answer of a reverse proxy whose upstream refuses the connection), or a refused
        connection when the route is the server itself; a 503, 504 or timeout is the gateway's
        own trouble and tells nothing.
        """
        self._server_answered, client = False, self._client
        if client is None:
            return None
        refusal = ""

        async def ask() -> bool | None:
            nonlocal refusal
            try:
                answer = await client.client.get("/is_alive", timeout=_PROBE_S)
            except httpx.ConnectError as exc:
                refusal = f"{type(exc).__name__}: {exc}"
                return None
            except httpx.HTTPError:
                return False
            if answer.status_code == 502:
                refusal = f"HTTP 502: {answer.text[:200]}"
                return None
            self._server_answered = answer.status_code == 200
            return self._server_answered

        with anyio.move_on_after(self.options.server_restart_s):
            await poll(ask, first_s=0.1, max_s=1.0)
            return None
        return (
            f"the SWE-ReX server of instance {self.backend_id} has refused requests for "
            f"server_restart_s={self.options.server_restart_s:g} s ({refusal}) although the "
            "platform says the instance is running"
        )

    async def _data(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """A data-plane call (every one sandlot makes is idempotent: see
        :mod:`.polled_jobs`). When it fails for good, one liveness probe (``_probe``): a dead
        instance or server becomes ``SandboxDeadError``; a server that answered the probe (it
        restarted, or the gateway recovered) gets the call once more; otherwise the error
        propagates (retryable for 5xx / unreachable)."""
        try:
            return await fn(*args, **kwargs)
        except (SwerexUnavailableError, SwerexHTTPError) as exc:
            dead = await self._gone()
            if dead is not None:
                raise dead from exc
            if not self._server_answered:
                raise
            log.warning("sandbox %s: the SWE-ReX server answers again after: %s", self.id, exc)
        return await fn(*args, **kwargs)

    async def _execute(self, argv: list[str], timeout: float, *, probe: bool = True) -> str:
        client = self._data_client
        if not probe:
            return (await client.execute(argv, timeout=timeout)).stdout
        return (await self._data(client.execute, argv, timeout=timeout)).stdout

    async def _upload(self, path: str, data: bytes) -> None:
        await self._data(self._data_client.write_bytes, path, data, timeout=FILE_TIMEOUT_S)

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """The file's bytes, ``base64`` through ``/execute``."""
        try:
            return await self._data(self._data_client.read_bytes, path, timeout=FILE_TIMEOUT_S)
        except FileNotFoundError as exc:
            raise SandboxFileError(f"read_file {path}: {exc}") from exc

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """Uploaded beside (``/upload``), then moved in place by a command that creates the
        parents and refuses a directory."""
        staging = f"{JOBS_DIR}/upload-{uuid.uuid4().hex}"
        await self._upload(staging, data)
        script = (
            '[ -d "$1" ] && { echo "is a directory" >&2; rm -f -- "$0"; exit 1; }; '
            'mkdir -p -- "$(dirname -- "$1")" && cat -- "$0" >"$1"; rc=$?; rm -f -- "$0"; exit $rc'
        )
        await self._run_checked("write_file", path, ["/bin/sh", "-c", script, staging, path])
