"""An httpx client of the SWE-ReX server protocol (``python -m swerex.server``, swe-rex 1.4.0).

Routes (all ``POST`` with a JSON body except ``GET /is_alive``; read in ``swerex/server.py`` and
``swerex/runtime/abstract.py`` of swe-rex 1.4.0): ``/is_alive``, ``/execute`` (``Command`` →
``CommandResponse``), ``/read_file``, ``/write_file``, ``/upload`` (multipart ``file``,
``target_path``, ``unzip``), ``/create_session``, ``/run_in_session``, ``/close_session``,
``/close``. Every request carries ``X-API-Key`` and an ``X-Request-ID`` that stays the same
across the retries of one call (the server replays its last response for a repeated id). A
server-side exception comes back as HTTP 511 ``{"swerexception": {message, class_path,
traceback, extra_info}}`` and is raised here as :class:`SwerexRemoteError`.

Differences from swe-rex's own ``RemoteRuntime`` (aiohttp):

* a request's timeout is the command's timeout plus ``margin_s`` (no fixed cut-off: aiohttp's
  default 300 s total timeout killed longer commands, SWE-ReX issues #189/#245); calls without
  a command timeout use ``request_timeout_s``, and a command with ``timeout=None`` has no read
  timeout at all;
* every transport failure (``httpx.TransportError``: connection refused or dropped, a
  keep-alive connection the server closed, read/write/pool timeouts of a hung server or
  gateway) and 5xx answers other than 511 are retried ``retries`` times with exponential
  backoff and jitter, then raise :class:`SwerexUnavailableError` (retryable); no ``httpx``
  exception leaves this client (an undecodable body is a :class:`SwerexHTTPError`). A retried
  read timeout repeats a request the server may be running: the server replays its last
  answer for a repeated ``X-Request-ID``, and sandlot's own requests are idempotent (see
  :mod:`sandlot.sandboxes.shared.polled_jobs`);
* bytes round-trip: :meth:`SwerexClient.write_bytes` goes through the binary-safe ``/upload``;
  :meth:`SwerexClient.read_bytes` runs ``base64`` through ``/execute`` and decodes it, since
  ``/read_file`` only returns text;
* a timed-out command raises :class:`SwerexRemoteError` whose ``extra_info`` keeps whatever
  partial output the server put there (swe-rex 1.4.0 puts none).

For a bash-session channel this client offers :meth:`create_session`,
:meth:`run_in_session` (``BashAction``), :meth:`interrupt_session` (``BashInterruptAction``)
and :meth:`close_session`, each with the same per-command timeout rule.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx

from sandlot.errors import SandboxError

log = logging.getLogger("sandlot.runtimes.swerex")

SWEREX_EXCEPTION_STATUS = 511
# Transport failures worth a retry: all of them (httpx 0.28 `TransportError`: timeouts, network
# and protocol errors). ReadError is what a stale keep-alive connection gives: swerex.server
# re-raises after answering 511 and uvicorn then drops the connection; ReadTimeout is a hung
# server or gateway. A request that did reach the server is answered again from its
# X-Request-ID replay cache.
_TRANSIENT = (httpx.TransportError,)
TIMEOUT_CLASS_SUFFIX = "CommandTimeoutError"


class SwerexRemoteError(SandboxError):
    """The server raised an exception (HTTP 511).

    Attributes:
        class_path: dotted name of the server-side exception class.
        remote_message: its message.
        extra_info: its ``extra_info`` dict (may hold partial output).
    """

    def __init__(self, class_path: str, message: str, extra_info: Mapping[str, Any]) -> None:
        self.class_path = class_path
        self.remote_message = message
        self.extra_info = dict(extra_info)
        super().__init__(f"SWE-ReX server raised {class_path}: {message}", retryable=False)

    @property
    def is_timeout(self) -> bool:
        """``True`` for the server's ``CommandTimeoutError``."""
        return self.class_path.endswith(TIMEOUT_CLASS_SUFFIX)


class SwerexUnavailableError(SandboxError):
    """The server could not be reached, or kept answering 5xx, through every retry."""

    retryable = True


class SwerexHTTPError(SandboxError):
    """The server (or a gateway before it) answered with an unexpected status (4xx).

    Attributes:
        status: the HTTP status.
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message, retryable=False)


@dataclass(frozen=True)
class CommandOutput:
    """The ``CommandResponse`` of ``/execute``: text decoded by the server (backslashreplace)."""

    stdout: str
    stderr: str
    exit_code: int | None


@dataclass(frozen=True)
class SessionOutput:
    """The ``BashObservation`` of ``/run_in_session``: merged output and the exit code."""

    output: str
    exit_code: int | None
    failure_reason: str = ""
    expect_string: str = ""


@functools.lru_cache(maxsize=4)
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()


def shared_tls_context() -> ssl.SSLContext:
    """httpx's default verifying SSL context (certifi's bundle, or ``$SSL_CERT_FILE`` /
    ``$SSL_CERT_DIR``), made once per value of those variables: otherwise every client makes
    its own, ~30 ms of CPU parsing the bundle with the event loop blocked, once per sandbox
    (and per start attempt)."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@dataclass
class SwerexClient:
    """Client of one SWE-ReX server.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` or a gateway route.
        api_key: the server's ``--auth-token`` (sent as ``X-API-Key``).
        headers: extra headers for every request (e.g. ``x-faas-instance-name``).
        margin_s: seconds added to a command's timeout to get its request timeout.
        request_timeout_s: timeout in seconds of requests that carry no command timeout.
        connect_timeout_s: TCP/TLS connect timeout in seconds.
        retries: retries after a connection failure or a 5xx (not 511) answer.
        backoff_s: first retry delay in seconds, doubled per retry, with jitter, at most 10 s.
        transport: an ``httpx.AsyncBaseTransport`` (tests); ``None`` for the network.
    """

    base_url: str
    api_key: str
    headers: Mapping[str, str] = field(default_factory=dict)
    margin_s: float = 30.0
    request_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.2
    transport: httpx.AsyncBaseTransport | None = None
    _client: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    @property
    def client(self) -> httpx.AsyncClient:
        """The underlying ``httpx.AsyncClient`` (one connection pool per server)."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url.rstrip("/"),
                headers={"X-API-Key": self.api_key, **self.headers},
                transport=self.transport,
                timeout=self._timeout(self.request_timeout_s),
                verify=shared_tls_context() if self.transport is None else True,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connection pool (not the server: see :meth:`close`)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _timeout(self, read_s: float | None) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_timeout_s, read=read_s, write=self.request_timeout_s, pool=None
        )

    def command_timeout(self, timeout: float | None) -> httpx.Timeout:
        """The request timeout for a command limited to ``timeout`` seconds (``None``: none)."""
        return self._timeout(None if timeout is None else timeout + self.margin_s)

    # ----------------------------------------------------------------- transport

    async def request(
        self,
        method: Literal["GET", "POST"],
        route: str,
        *,
        json: Any = None,
        files: Any = None,
        data: Any = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        """Send one call (with retries) and return its decoded JSON body.

        Raises:
            SwerexRemoteError: HTTP 511 from the server.
            SwerexUnavailableError: connection failures or 5xx through every retry.
            SwerexHTTPError: any other non-2xx status.
        """
        headers = {"X-Request-ID": uuid.uuid4().hex}
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            problem: str
            try:
                response = await self.client.request(
                    method,
                    route,
                    json=json,
                    files=files,
                    data=data,
                    headers=headers,
                    timeout=timeout or self._timeout(self.request_timeout_s),
                )
            except _TRANSIENT as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == SWEREX_EXCEPTION_STATUS:
                    raise _remote_error(response)
                if response.status_code < 300:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise SwerexHTTPError(
                            response.status_code,
                            f"{method} {route}: the answer is not JSON: {response.text[:200]!r}",
                        ) from exc
                if response.status_code < 500:
                    raise SwerexHTTPError(
                        response.status_code,
                        f"{method} {route}: HTTP {response.status_code}: {response.text[:500]}",
                    )
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if attempt == self.retries:
                raise SwerexUnavailableError(
                    f"SWE-ReX server at {self.base_url}: {method} {route} failed after "
                    f"{attempt + 1} attempts: {problem}"
                )
            pause = min(delay, 10.0) * (0.5 + random.random() / 2)
            log.warning(
                "SWE-ReX %s %s: %s; retry %d/%d in %.2f s",
                method,
                route,
                problem,
                attempt + 1,
                self.retries,
                pause,
            )
            await anyio.sleep(pause)
            delay *= 2
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------- stateless calls

    async def is_alive(self, *, timeout: float = 10.0) -> bool:
        """``True`` when the server answers ``/is_alive`` positively. Never raises."""
        try:
            body = await self.client.get(
                "/is_alive",
                timeout=self._timeout(timeout),
                headers={"X-Request-ID": uuid.uuid4().hex},
            )
        except httpx.HTTPError:
            return False
        try:
            return body.status_code == 200 and bool(body.json().get("is_alive"))
        except (ValueError, AttributeError):  # a gateway's HTML page
            return False

    async def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None,
        shell: bool = False,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        merge_output_streams: bool = False,
    ) -> CommandOutput:
        """Run a one-off process (``subprocess.run`` on the server).

        Args:
            command: argv list, or a string (run by ``/bin/sh`` when ``shell``).
            timeout: seconds the server lets it run; ``None`` for no limit. The HTTP request
                waits ``timeout + margin_s``.
            shell: pass the string to the shell.
            cwd: working directory on the server.
            env: the *entire* environment of the process (the server does not merge it).
            merge_output_streams: stderr into stdout.

        Raises:
            SwerexRemoteError: the server raised (``is_timeout`` for ``CommandTimeoutError``).
            SwerexUnavailableError: the server cannot be reached.
        """
        body = {
            "command": command if isinstance(command, str) else list(command),
            "timeout": timeout,
            "shell": shell,
            "check": False,
            "cwd": cwd,
            "env": dict(env) if env is not None else None,
            "merge_output_streams": merge_output_streams,
        }
        out = await self.request(
            "POST", "/execute", json=body, timeout=self.command_timeout(timeout)
        )
        return CommandOutput(out.get("stdout", ""), out.get("stderr", ""), out.get("exit_code"))

    async def read_file(
        self, path: str, *, encoding: str | None = None, errors: str | None = None
    ) -> str:
        """The text of ``path`` on the server (``/read_file``)."""
        body = {"path": path, "encoding": encoding, "errors": errors}
        return str((await self.request("POST", "/read_file", json=body))["content"])

    async def write_file(self, path: str, content: str) -> None:
        """Write text to ``path``, creating parents (``/write_file``)."""
        await self.request("POST", "/write_file", json={"path": path, "content": content})

    async def write_bytes(self, path: str, data: bytes, *, timeout: float | None = None) -> None:
        """Write ``data`` exactly to ``path``, creating parents (multipart ``/upload``).

        Args:
            timeout: seconds for the transfer; ``None`` uses ``request_timeout_s``.
        """
        files = {"file": ("data", data, "application/octet-stream")}
        form = {"target_path": path, "unzip": "false"}
        await self.request(
            "POST", "/upload", files=files, data=form, timeout=self.command_timeout(timeout)
        )

    async def read_bytes(self, path: str, *, timeout: float | None = 300.0) -> bytes:
        """The exact bytes of the file ``path``: ``base64`` run through ``/execute``.

        ``/read_file`` decodes text on the server, so it cannot carry binary data.

        Raises:
            FileNotFoundError: ``base64`` failed (the message carries its stderr).
        """
        import base64

        out = await self.execute(["base64", "-w", "0", "--", path], timeout=timeout)
        if out.exit_code != 0:
            raise FileNotFoundError(out.stderr.strip() or f"cannot read {path}")
        return base64.b64decode(out.stdout)

    async def close(self) -> None:
        """Ask the server to close its runtime (``/close``); the server keeps running."""
        await self.request("POST", "/close")

    # ----------------------------------------------------------------- sessions

    async def create_session(
        self,
        session: str = "default",
        *,
        startup_source: Sequence[str] = (),
        startup_timeout: float = 10.0,
    ) -> str:
        """Start a named bash session; returns its startup output."""
        body = {
            "session": session,
            "session_type": "bash",
            "startup_source": list(startup_source),
            "startup_timeout": startup_timeout,
        }
        out = await self.request(
            "POST", "/create_session", json=body, timeout=self.command_timeout(startup_timeout)
        )
        return str(out.get("output", ""))

    async def run_in_session(
        self,
        command: str,
        *,
        session: str = "default",
        timeout: float | None = None,
        check: Literal["silent", "raise", "ignore"] = "silent",
    ) -> SessionOutput:
        """Run ``command`` in the session (``BashAction``); merged output and exit code.

        Raises:
            SwerexRemoteError: the server raised (a timeout: ``is_timeout``; the session needs
                :meth:`interrupt_session` afterwards).
        """
        body = {
            "action_type": "bash",
            "command": command,
            "session": session,
            "timeout": timeout,
            "check": check,
        }
        out = await self.request(
            "POST", "/run_in_session", json=body, timeout=self.command_timeout(timeout)
        )
        return _session_output(out)

    async def interrupt_session(
        self, *, session: str = "default", timeout: float = 0.2, n_retry: int = 3
    ) -> SessionOutput:
        """Send Ctrl-C to the session's foreground command (``BashInterruptAction``)."""
        body = {
            "action_type": "bash_interrupt",
            "session": session,
            "timeout": timeout,
            "n_retry": n_retry,
        }
        limit = self.command_timeout(timeout * (n_retry + 1) + 5)
        return _session_output(
            await self.request("POST", "/run_in_session", json=body, timeout=limit)
        )

    async def close_session(self, session: str = "default") -> None:
        """Close the named session."""
        await self.request(
            "POST", "/close_session", json={"session": session, "session_type": "bash"}
        )


def _session_output(out: Mapping[str, Any]) -> SessionOutput:
    return SessionOutput(
        output=str(out.get("output", "")),
        exit_code=out.get("exit_code"),
        failure_reason=str(out.get("failure_reason", "")),
        expect_string=str(out.get("expect_string", "")),
    )


def _remote_error(response: httpx.Response) -> SwerexRemoteError:
    try:
        exc = response.json()["swerexception"]
    except (ValueError, KeyError, TypeError):
        return SwerexRemoteError("unknown", response.text[:500], {})
    return SwerexRemoteError(
        str(exc.get("class_path", "unknown")),
        str(exc.get("message", "")),
        exc.get("extra_info") or {},
    )
