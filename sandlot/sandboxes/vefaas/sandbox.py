"""``VefaasSandbox``: a sandbox on Volcengine veFaaS, driven through a SWE-ReX server.

Control plane: the veFaaS service package of the Volcengine SDK (``volcenginesdk-vefaas``
5.0.54, see :mod:`sandlot.sandboxes.vefaas.control`). Data plane: the instance runs a SWE-ReX
server (swe-rex 1.4.0, started by :mod:`sandlot.sandboxes.vefaas.bootstrap`), reached at the
function's HTTP route with the header ``x-faas-instance-name: <sandbox id>`` and the server's
``X-API-Key`` through :class:`sandlot.runtimes.swerex.SwerexClient`. Commands run as detached
jobs (:mod:`sandlot.sandboxes.vefaas.jobs`); files move through ``/upload`` (bytes in) and
``base64`` over ``/execute`` (bytes out). Sources: the veFaaS sandbox API docs
(https://www.volcengine.com/docs/6662/1806654), vefaas-dev/code-examples ``sandbox-cookbook``,
and verl-project/uni-agent ``uni_agent/sandbox/vefaas.py`` (instance header, bootstrap ``exec``).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import anyio
import httpx
from pydantic import BaseModel

from sandlot.errors import (
    SandboxError,
    SandboxFileError,
    SandboxStartError,
)
from sandlot.runtimes.swerex import SwerexClient, SwerexHTTPError, SwerexUnavailableError
from sandlot.sandboxes import remote_shell
from sandlot.sandboxes.backoff import poll
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.images import backend_image
from sandlot.sandboxes.labels import OWNER, RUN_ID, SANDBOX_ID, sandbox_labels
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import FILE_TIMEOUT_S, RunOutput, RunRequest
from sandlot.sandboxes.vefaas import jobs
from sandlot.sandboxes.vefaas.bootstrap import bootstrap_command
from sandlot.sandboxes.vefaas.config import FunctionTarget, credentials, pick_target
from sandlot.sandboxes.vefaas.control import (
    GONE,
    RUNNING,
    ControlPlane,
    ControlPlaneError,
    SandboxInfo,
)
from sandlot.sandboxes.vefaas.options import VefaasOptions

log = logging.getLogger("sandlot.sandboxes.vefaas")
T = TypeVar("T")

INSTANCE_HEADER = "x-faas-instance-name"
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.25
_READY_POLL_MAX_S = 0.25
# While waiting for the server: is the instance still coming up? First after 2 s, then ever
# more rarely (x1.5, at most 30 s): DescribeSandbox is rate limited per account, and the
# readiness probe (the data plane) is what ends the wait.
_DESCRIBE_FIRST_S = 2.0
_DESCRIBE_MAX_S = 30.0
# Labels that make a listed instance this sandbox's: checked on every row, whatever the
# service's filter did.
_OWN_LABELS = (SANDBOX_ID, RUN_ID, OWNER)
_PROBE_S = 5.0  # timeout of one /is_alive of the liveness probe
# How long a lost create is looked for after create_settle_s while listings fail (close's
# budget, 60 s, must hold it and the kill).
_LOOK_MORE_S = 20.0
_QUICK_S = 60.0  # timeout of the short data-plane calls (launch, poll, kill, file moves)


class VefaasSandbox(Sandbox):
    """One veFaaS sandbox instance of a sandbox application (function).

    Args:
        spec: ``image`` (canonical SWE-bench names are mapped to the veFaaS mirrors by
            :func:`sandlot.sandboxes.images.backend_image`); ``timeout_s`` is the lifetime
            (``Timeout`` in seconds); ``cpu`` cores become ``CpuMilli``; ``memory_mb`` is
            ``MemoryMB``; ``env`` becomes ``Envs``; ``labels`` plus the ``sandlot.*`` labels
            become ``Metadata``. ``network`` is not enforced: egress is a property of the veFaaS
            function's network configuration (a warning is logged when ``network=False``).
        options: :class:`VefaasOptions`.

    Raises (from ``start``):
        BackendUnavailableError: SDK missing, credentials or function targets missing (the
            message names the variables).
        SandboxStartError: ``CreateSandbox`` refused (``retryable`` for rate limits and
            capacity), the instance failed before its server answered (``retryable`` unless
            veFaaS gives an error code naming a permanent cause, such as a start command that
            exits), or the SWE-ReX server never answered within ``ready_timeout_s``.
    """

    name: ClassVar[str] = "vefaas"
    reaper: ClassVar[str | None] = "sandlot.sandboxes.vefaas.reaper:VefaasReaper"
    Options: ClassVar[type[VefaasOptions]] = VefaasOptions
    options: VefaasOptions
    staging_dir: str = jobs.JOBS_DIR

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._control: ControlPlane | None = None
        self._target: FunctionTarget | None = None
        self._sandbox_id: str | None = None
        self._client: SwerexClient | None = None
        self._labels: dict[str, str] = {}
        # A CreateSandbox whose answer was lost may have created an instance we know no id of.
        self._unanswered_create = False
        self._server_answered = False  # the last probe reached the SWE-ReX server

    @property
    def sandbox_id(self) -> str | None:
        """veFaaS's id of the instance once created, else ``None``."""
        return self._sandbox_id

    backend_id = sandbox_id  # the id leak reports and `sandlot gc --leaked` match

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        spec, opts = self.spec, self.options
        if self._control is None:
            self._control = ControlPlane(credentials(opts), opts)
        self._target = target = pick_target(opts)
        if not spec.network:
            log.debug("vefaas: network=False is not enforced; egress follows the function's config")
        token = secrets.token_urlsafe(24)
        self._labels = sandbox_labels(self.id, spec.labels)
        request = self._control.create_request(
            function_id=target.function_id,
            image=backend_image(spec.image, "vefaas", opts.image_overrides),
            port=opts.port,
            command=bootstrap_command(
                opts.bootstrap,
                workdir=spec.workdir,
                port=opts.port,
                token=token,
                python=opts.swerex_python,
                find_links=opts.swerex_find_links,
            ),
            env=spec.env,
            metadata=self._labels,
            timeout_s=spec.timeout_s,
            cpu=spec.cpu,
            memory_mb=spec.memory_mb,
        )
        try:
            await self._control.create(request, self._record)
        except SandboxStartError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ControlPlaneError) and cause.ambiguous):
                raise
            self._unanswered_create = True  # if cancelled meanwhile, _close looks for it
            lost = await self._find_lost_create()
            if lost is None:
                raise  # it never took effect: the next attempt creates again
            log.info("sandbox %s: adopting %s of an unanswered create", self.id, lost.id)
            self._sandbox_id, self._unanswered_create = lost.id, False
        assert self._sandbox_id is not None
        self._client = SwerexClient(
            target.route,
            api_key=token,
            headers={INSTANCE_HEADER: self._sandbox_id},
            retries=opts.request_retries,
        )
        await self._wait_ready()

    def _record(self, sandbox_id: str) -> None:
        self._sandbox_id = sandbox_id

    async def _wait_ready(self) -> None:
        """Poll ``/is_alive`` until the server answers; the STARTING slot is held meanwhile.

        Now and then (2 s, then x1.5 up to 30 s) ``DescribeSandbox`` tells whether the instance
        failed; a describe that fails (throttled, unreachable, not yet known) tells nothing and
        the wait goes on: only ``ready_timeout_s`` or a failed instance ends it.
        """
        assert self._client is not None and self._control is not None and self._target
        client, control, function_id = self._client, self._control, self._target.function_id
        interval, next_describe = _DESCRIBE_FIRST_S, time.monotonic() + _DESCRIBE_FIRST_S

        async def ready() -> bool | None:
            nonlocal interval, next_describe
            if await client.is_alive(timeout=min(10.0, self.options.ready_timeout_s)):
                return True
            if time.monotonic() < next_describe:
                return None
            interval = min(interval * 1.5, _DESCRIBE_MAX_S)
            next_describe = time.monotonic() + interval
            try:
                info = await control.describe(function_id, self._id)
            except ControlPlaneError as exc:
                log.debug("sandbox %s: DescribeSandbox while waiting: %s", self.id, exc)
                return None
            if info.status in ("", "Creating", "Pending", RUNNING):
                return None
            raise SandboxStartError(
                f"sandbox {self.id}: veFaaS instance {self._id} is {info.status}"
                + (f" ({info.error_code})" if info.error_code else "")
                + (f": {info.error}" if info.error else ""),
                retryable=info.failure_retryable,
            )

        with anyio.move_on_after(self.options.ready_timeout_s):
            await poll(ready, first_s=0.02, max_s=_READY_POLL_MAX_S, factor=1.25)
            return
        raise SandboxStartError(
            f"sandbox {self.id}: the SWE-ReX server of instance {self._id} did not answer "
            f"within ready_timeout_s={self.options.ready_timeout_s:g} s (does the bootstrap "
            "command start it? does the image reach PyPI if it must install swe-rex?)",
            retryable=True,
        )

    @property
    def _id(self) -> str:
        assert self._sandbox_id is not None, "sandbox not created"
        return self._sandbox_id

    async def _close(self) -> None:
        """Close the data-plane client, then ``KillSandbox`` (``close`` tries again: it is what
        stops the bill). After a create whose answer was lost (cancelled while it was looked
        for), the instance it may have made is looked for (:meth:`_find_lost_create`) and
        killed instead."""
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:
                log.warning("sandbox %s: closing the data-plane client failed: %s", self.id, exc)
        if self._control is None or self._target is None:
            return
        if self._sandbox_id is not None:
            await self._kill(self._sandbox_id)
            self._sandbox_id = None
        elif self._unanswered_create and (lost := await self._find_lost_create()) is not None:
            await self._kill(lost.id)
        self._unanswered_create = False

    async def _kill(self, sandbox_id: str) -> None:
        """``KillSandbox`` once.

        Raises:
            SandboxError: it failed (``retryable`` as the control plane said; the message names
                the instance and how ``sandlot gc`` removes it).
        """
        assert self._control is not None and self._target is not None
        try:
            await self._control.kill(self._target.function_id, sandbox_id)
        except SandboxError as exc:
            raise SandboxError(
                f"sandbox {self.id}: KillSandbox {sandbox_id} failed: {exc}; "
                "`sandlot gc --backend vefaas --run-id <run id>` removes it",
                retryable=exc.retryable,
            ) from exc

    def _is_mine(self, row: SandboxInfo) -> bool:
        return row.status not in GONE and all(
            row.metadata.get(k) == self._labels.get(k) for k in _OWN_LABELS
        )

    async def _find_lost_create(self) -> SandboxInfo | None:
        """The instance a CreateSandbox whose answer was lost made, or ``None`` if it made none.

        The service may act on a create after the client gave up on it, so ``ListSandboxes``
        (filtered by the ``sandlot.sandbox_id`` label) is asked again and again (0.1 s, doubling
        up to 2 s) until a live instance appears whose own labels (``sandlot.sandbox_id``,
        ``sandlot.run_id``, ``sandlot.owner``) are this sandbox's, or until a listing begun
        ``create_settle_s`` after now finds none (the create never took effect). The labels of
        every row are checked here, whatever the server's filter did. One create makes at most
        one instance, so the first found ends the search.

        Raises:
            SandboxError: no listing succeeded for ``_LOOK_MORE_S`` after ``create_settle_s``;
                the message says how ``sandlot gc`` removes the instance.
        """
        assert self._control is not None and self._target is not None
        control, function_id = self._control, self._target.function_id
        settled = time.monotonic() + self.options.create_settle_s
        problems: list[Exception] = []

        async def look() -> list[SandboxInfo] | None:
            began = time.monotonic()
            try:
                rows = await control.list(function_id, {SANDBOX_ID: self.id})
            except SandboxError as exc:
                problems.append(exc)
                return None
            mine = [row for row in rows if self._is_mine(row)]
            return mine if mine or began >= settled else None

        with anyio.move_on_after(self.options.create_settle_s + _LOOK_MORE_S):
            found = await poll(look, first_s=0.1, max_s=2.0)
            return found[0] if found else None
        raise SandboxError(
            f"sandbox {self.id}: a CreateSandbox went unanswered and its instance could not be "
            f"looked for ({problems[-1] if problems else 'no listing answered'}); "
            "`sandlot gc --backend vefaas --run-id <run id>` removes it"
        )

    async def _probe(self) -> str | None:
        """Why the instance cannot run commands, else ``None``: the control plane first (not
        ``Running``, unknown), then, unless it found the instance dead, the SWE-ReX server
        (:meth:`_server_gone`)."""
        self._server_answered = False
        if self._control is None or self._target is None or self._sandbox_id is None:
            return "veFaaS instance is gone"
        try:
            info = await self._control.describe(self._target.function_id, self._sandbox_id)
        except ControlPlaneError as exc:
            if exc.not_found:
                return f"veFaaS instance {self._sandbox_id} is unknown to veFaaS ({exc})"
        except Exception as exc:  # an SDK fault not classified: cannot tell
            log.warning("sandbox %s: liveness unknown: %s", self.id, exc)
        else:
            if info.status != RUNNING:
                return f"veFaaS instance {self._sandbox_id} is {info.status or 'gone'}"
        return None if self._client is None else await self._server_gone(self._client)

    async def _server_gone(self, client: SwerexClient) -> str | None:
        """Why the SWE-ReX server is dead, else ``None`` (it answered, or that cannot be told).

        ``GET /is_alive`` (``_PROBE_S`` per try, 0.1 s doubling up to 1 s between tries) while
        the server refuses, for up to ``server_restart_s``: a server that comes back (a
        restart) is alive, one that still refuses then is dead. Refusing is the gateway's 502
        (the answer of a reverse proxy whose upstream refuses the connection), or a refused
        connection when the route is the server itself; a 503, 504 or timeout is the gateway's
        own trouble and tells nothing.
        """
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
            f"the SWE-ReX server of veFaaS instance {self._sandbox_id} has refused requests for "
            f"server_restart_s={self.options.server_restart_s:g} s ({refusal}) although veFaaS "
            "says the instance is Running"
        )

    @property
    def _data_client(self) -> SwerexClient:
        assert self._client is not None, "sandbox not started"
        return self._client

    async def _data(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """A data-plane call (every one sandlot makes is idempotent: see :mod:`.jobs`). When it
        fails for good, one liveness probe (:meth:`_probe`): a dead instance or server becomes
        ``SandboxDeadError``; a server that answered the probe (it restarted, or the gateway
        recovered) gets the call once more; otherwise the error propagates (retryable for
        5xx / unreachable)."""
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

    # ----------------------------------------------------------------- commands

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``command`` as a detached job (see :meth:`Transport._run`).

        No HTTP request lasts as long as the command: a launch that waits up to 50 ms for it,
        then polls (10 ms doubling to 0.25 s). At ``timeout`` or on cancellation every process
        of the command is killed (SIGTERM, ``stop_grace_s``, SIGKILL) and the output printed so
        far is returned (up to ``max_output_bytes`` per stream).

        Raises:
            SandboxDeadError: the instance is no longer running.
            SandboxError: the data plane failed (``retryable`` for 5xx / unreachable).
        """
        client = self._data_client
        job = uuid.uuid4().hex
        if run.stdin:
            await self._data(
                client.write_bytes, jobs.stdin_path(job), run.stdin, timeout=FILE_TIMEOUT_S
            )
        cap = self.options.max_output_bytes
        argv = jobs.launch_argv(job, run.cwd, run.command, run.env, cap)
        launched = await self._data(client.execute, argv, timeout=_QUICK_S)
        first = self._parse(launched.stdout)
        if first is not None:
            return first
        stopped = RunOutput(exit_code=None)

        async def stop() -> None:
            nonlocal stopped
            stopped = await self._stop_job(client, job)

        done = await self._bounded(run.timeout, lambda: self._wait_job(client, job), stop)
        return stopped if done is None else done

    async def _poll(self, client: SwerexClient, job: str, *, force: bool) -> RunOutput | None:
        argv = jobs.poll_argv(job, self.options.max_output_bytes, force=force)
        out = await self._data(client.execute, argv, timeout=_QUICK_S)
        return self._parse(out.stdout)

    def _parse(self, stdout: str) -> RunOutput | None:
        try:
            return jobs.parse_poll(stdout)
        except (jobs.JobLostError, ValueError) as exc:
            raise SandboxError(
                f"sandbox {self.id}: lost the result of a command: {exc} (its answer was lost, "
                "or the instance restarted)"
            ) from exc

    async def _wait_job(self, client: SwerexClient, job: str) -> RunOutput:
        return await poll(
            lambda: self._poll(client, job, force=False), first_s=_POLL_FIRST_S, max_s=_POLL_MAX_S
        )

    async def _stop_job(self, client: SwerexClient, job: str) -> RunOutput:
        """Kill the job's processes and collect what they printed."""
        argv = remote_shell.kill_argv(job, self.options.stop_grace_s)
        try:
            await client.execute(argv, timeout=self.options.stop_grace_s + _QUICK_S)
            result = await self._poll(client, job, force=True)
        except SandboxError as exc:
            log.warning("sandbox %s: could not stop command %s: %s", self.id, job, exc)
            return RunOutput(exit_code=None)
        assert result is not None
        return dataclasses.replace(result, exit_code=None)

    # ----------------------------------------------------------------- files

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """The file's bytes, ``base64`` through ``/execute``."""
        try:
            return await self._data(self._data_client.read_bytes, path, timeout=FILE_TIMEOUT_S)
        except FileNotFoundError as exc:
            raise SandboxFileError(f"read_file {path}: {exc}") from exc

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """Uploaded beside (``/upload``), then moved in place by a command that creates the
        parents and refuses a directory."""
        staging = f"{jobs.JOBS_DIR}/upload-{uuid.uuid4().hex}"
        await self._data(self._data_client.write_bytes, staging, data, timeout=FILE_TIMEOUT_S)
        script = (
            '[ -d "$1" ] && { echo "is a directory" >&2; rm -f -- "$0"; exit 1; }; '
            'mkdir -p -- "$(dirname -- "$1")" && cat -- "$0" >"$1"; rc=$?; rm -f -- "$0"; exit $rc'
        )
        await self._run_checked("write_file", path, ["/bin/sh", "-c", script, staging, path])
