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

import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import anyio
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
from sandlot.sandboxes.labels import SANDBOX_ID, sandbox_labels
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import FILE_TIMEOUT_S, RunOutput, RunRequest
from sandlot.sandboxes.vefaas import jobs
from sandlot.sandboxes.vefaas.bootstrap import bootstrap_command
from sandlot.sandboxes.vefaas.config import FunctionTarget, credentials, pick_target
from sandlot.sandboxes.vefaas.control import RUNNING, ControlPlane, ControlPlaneError
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
# After a create whose answer was lost, how often to look for the instance by its metadata.
_RECOVER_ATTEMPTS = 8
_RECOVER_BACKOFF_S = 0.05  # doubled per try, at most _RECOVER_BACKOFF_MAX_S: ~4 s over 8 tries
_RECOVER_BACKOFF_MAX_S = 1.0
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
    Options: ClassVar[type[VefaasOptions]] = VefaasOptions
    options: VefaasOptions
    staging_dir: str = jobs.JOBS_DIR

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._control: ControlPlane | None = None
        self._target: FunctionTarget | None = None
        self._sandbox_id: str | None = None
        self._client: SwerexClient | None = None
        # A CreateSandbox whose answer was lost may have created an instance we know no id of.
        self._unanswered_create = False

    @property
    def sandbox_id(self) -> str | None:
        """veFaaS's id of the instance once created, else ``None``."""
        return self._sandbox_id

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        spec, opts = self.spec, self.options
        if self._control is None:
            self._control = ControlPlane(credentials(opts), opts)
        self._target = target = pick_target(opts)
        if not spec.network:
            log.debug("vefaas: network=False is not enforced; egress follows the function's config")
        token = secrets.token_urlsafe(24)
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
            metadata=sandbox_labels(self.id, spec.labels),
            timeout_s=spec.timeout_s,
            cpu=spec.cpu,
            memory_mb=spec.memory_mb,
        )
        try:
            await self._control.create(request, self._record)
        except SandboxStartError as exc:
            cause = exc.__cause__
            if isinstance(cause, ControlPlaneError) and cause.ambiguous:
                self._unanswered_create = True  # _close (after this attempt) looks for it
            raise
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
        deadline = time.monotonic() + self.options.ready_timeout_s
        describe_every = _DESCRIBE_FIRST_S
        delay, next_describe = 0.02, time.monotonic() + describe_every
        while not await self._client.is_alive(timeout=min(10.0, self.options.ready_timeout_s)):
            info = None
            if time.monotonic() >= next_describe:
                describe_every = min(describe_every * 1.5, _DESCRIBE_MAX_S)
                next_describe = time.monotonic() + describe_every
                try:
                    info = await self._control.describe(self._target.function_id, self._id)
                except ControlPlaneError as exc:
                    log.debug("sandbox %s: DescribeSandbox while waiting: %s", self.id, exc)
            if info is not None and info.status not in ("", "Creating", "Pending", RUNNING):
                raise SandboxStartError(
                    f"sandbox {self.id}: veFaaS instance {self._id} is {info.status}"
                    + (f" ({info.error_code})" if info.error_code else "")
                    + (f": {info.error}" if info.error else ""),
                    retryable=info.failure_retryable,
                )
            if time.monotonic() >= deadline:
                raise SandboxStartError(
                    f"sandbox {self.id}: the SWE-ReX server of instance {self._id} did not answer "
                    f"within ready_timeout_s={self.options.ready_timeout_s:g} s (does the "
                    "bootstrap command start it? does the image reach PyPI if it must install "
                    "swe-rex?)",
                    retryable=True,
                )
            await anyio.sleep(delay)
            delay = min(delay * 1.25, _READY_POLL_MAX_S)

    @property
    def _id(self) -> str:
        assert self._sandbox_id is not None, "sandbox not created"
        return self._sandbox_id

    async def _close(self) -> None:
        """Close the data-plane client, then ``KillSandbox`` (``close`` tries again: it is what
        stops the bill).

        After a create whose answer was lost, the instances carrying this sandbox's
        ``sandlot.sandbox_id`` label are listed and killed instead (a few tries: the listing
        may lag the create).
        """
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
        elif self._unanswered_create:
            await self._kill_unanswered()
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

    async def _kill_unanswered(self) -> None:
        """Find, by its labels, the instance an unanswered CreateSandbox may have made; kill it.

        Two listings in a row that find nothing mean nothing was created (the request never
        arrived).

        Raises:
            SandboxError: it could not be looked for; the message says how ``sandlot gc``
                finds it.
        """
        assert self._control is not None and self._target is not None
        function_id = self._target.function_id
        problem: Exception | None = None
        empty = 0
        for attempt in range(_RECOVER_ATTEMPTS):
            try:
                rows = await self._control.list(function_id, {SANDBOX_ID: self.id})
            except SandboxError as exc:
                problem = exc
            else:
                live = [r for r in rows if r.status not in ("Terminating", "Terminated")]
                for row in live:
                    log.info("sandbox %s: killing %s from an unanswered create", self.id, row.id)
                    await self._kill(row.id)
                if live:
                    return
                empty += 1
                if empty == 2:
                    return
            await anyio.sleep(min(_RECOVER_BACKOFF_MAX_S, _RECOVER_BACKOFF_S * 2**attempt))
        raise SandboxError(
            f"sandbox {self.id}: a CreateSandbox went unanswered and its instance could not be "
            f"looked for ({problem}); `sandlot gc --backend vefaas --run-id <run id>` removes it"
        )

    async def _probe(self) -> str | None:
        """Why the instance cannot run commands (not ``Running``, unknown), else ``None``."""
        if self._control is None or self._target is None or self._sandbox_id is None:
            return "veFaaS instance is gone"
        try:
            info = await self._control.describe(self._target.function_id, self._sandbox_id)
        except ControlPlaneError as exc:
            if not exc.not_found:
                return None  # cannot tell
            return f"veFaaS instance {self._sandbox_id} is unknown to veFaaS ({exc})"
        except Exception as exc:  # an SDK fault not classified: cannot tell
            log.warning("sandbox %s: liveness unknown: %s", self.id, exc)
            return None
        if info.status == RUNNING:
            return None
        return f"veFaaS instance {self._sandbox_id} is {info.status or 'gone'}"

    @property
    def _data_client(self) -> SwerexClient:
        assert self._client is not None, "sandbox not started"
        return self._client

    async def _data(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """A data-plane call; when it fails for good, a dead instance becomes
        ``SandboxDeadError``, else the error propagates (retryable for 5xx/unreachable)."""
        try:
            return await fn(*args, **kwargs)
        except (SwerexUnavailableError, SwerexHTTPError) as exc:
            dead = await self._gone()
            if dead is not None:
                raise dead from exc
            raise

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
            raise SandboxError(f"sandbox {self.id}: lost the result of a command: {exc}") from exc

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
        return RunOutput(
            None, result.stdout, result.stderr, result.stdout_dropped, result.stderr_dropped
        )

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
