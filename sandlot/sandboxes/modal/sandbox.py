"""``ModalSandbox``: a sandbox on Modal (https://modal.com/docs/guide/sandbox).

Written against the ``modal`` SDK 1.6.4, read in its source (``modal/sandbox/_sandbox.py``,
``_filesystem.py``, ``container_process.py``, ``io_streams.py``, ``app.py``, ``image.py``,
``secret.py``) and the reference at https://modal.com/docs/reference/modal.Sandbox. Calls used,
all through their ``.aio`` async variants: ``App.lookup(name, create_if_missing=True)``,
``Image.from_registry(tag, secret=)``, ``Secret.from_name(name)``, ``Sandbox.create(*cmd,
app=, name=, tags=, image=, env=, timeout=, idle_timeout=, workdir=, cpu=, memory=,
block_network=)``, ``Sandbox.exec(*argv, timeout=, env=, text=False)`` (stdout/stderr read
concurrently, stdin ``write``/``write_eof``/``drain``, ``wait``), ``Sandbox.poll``,
``Sandbox.terminate``, ``Sandbox.from_name``, and
``Sandbox.filesystem.read_bytes``/``write_bytes``. Snapshots (the guide:
https://modal.com/docs/guide/sandbox-snapshots): ``Sandbox.snapshot_filesystem(timeout, ttl=)``
makes an ``Image`` whose ``object_id`` (``im-...``) is the handle, ``Image.from_id`` (lazy,
called without ``.aio``: 1.6.4 deprecates that) names it to ``Sandbox.create``, and
``modal.experimental.image_delete`` removes it.

The SDK is imported when a sandbox starts; subclasses may override :meth:`ModalSandbox.sdk`
(the tests substitute a fake module there).
"""

from __future__ import annotations

import contextlib
import logging
import math
import posixpath
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxDeadError, SandboxError, SandboxFileError, SandboxStartError
from sandlot.runtimes.channel_session import ChannelSession
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes import remote_shell
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.capped import CappedBuffer, CappedOutput
from sandlot.sandboxes.images import backend_image
from sandlot.sandboxes.labels import RUN_ID, sandbox_labels
from sandlot.sandboxes.modal.modal_channel import ModalChannel
from sandlot.sandboxes.modal.options import ModalOptions
from sandlot.sandboxes.modal.sdk import check_credentials, is_modal_error, modal_sdk, translate
from sandlot.sandboxes.network import public_cidrs
from sandlot.sandboxes.reaper import RemoteSandbox
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import RunOutput, RunRequest

log = logging.getLogger("sandlot.sandboxes.modal")
T = TypeVar("T")

# Modal's own exec timeout, a backstop behind ours in case this process dies mid-command.
_BACKSTOP_MARGIN_S = 30
_KILL_BUDGET_S = 15.0
# Modal reports an exec that hit its own timeout with return code -1.
_MODAL_EXEC_TIMEOUT_CODE = -1
# Create failures no retry can fix (the image's or the account's, not the service's).
_PERMANENT_CREATE = ("AuthError", "NotFoundError", "InvalidError")
_PERMANENT_CREATE_WORDS = ("not found", "unknown", "denied", "unauthorized", "invalid", "no such")
# An exec without a timeout still ends this long after the sandbox's lifetime: a worker that
# died without closing the output stream must not hang the caller forever.
_LIFETIME_MARGIN_S = 30.0
# stdin goes down in pieces, each drained: Modal buffers at most 16 MiB between drains
# (TASK_COMMAND_ROUTER_MAX_BUFFER_SIZE in modal/io_streams.py; 2 MiB through the server).
_STDIN_CHUNK = 1024 * 1024
# Commands longer than this go through a file: the whole argv may total 64 KiB, and the exec
# wrapper takes ~1 KiB of it.
_ARGV_COMMAND_BYTES = 60 * 1024


class ModalSandbox(Sandbox):
    """A Modal Sandbox kept alive by a small PID 1; commands run in it with ``Sandbox.exec``.

    Args:
        spec: ``image`` is a registry name (canonical SWE-bench names are mapped by
            :func:`sandlot.sandboxes.images.backend_image`); ``cpu`` (cores) and ``memory_mb``
            (MiB) are Modal's requests; ``timeout_s`` (seconds, rounded up) is the sandbox
            lifetime; ``network=False`` sets ``block_network``, ``network="internet"`` an
            ``outbound_cidr_allowlist`` of the public IPv4 blocks
            (:func:`sandlot.sandboxes.network.public_cidrs`); ``env`` and ``workdir`` go to
            the sandbox; ``labels`` plus the ``sandlot.*`` labels become Modal tags.
        options: :class:`ModalOptions`.

    Raises (from ``start``):
        BackendUnavailableError: ``modal`` not installed, or no credentials (names the
            variables).
        SandboxStartError: the image cannot be pulled (permanent) or Modal refused or timed out
            (``retryable``).
    """

    name: ClassVar[str] = "modal"
    Options: ClassVar[type[ModalOptions]] = ModalOptions
    network_modes: ClassVar[tuple[bool | str, ...]] = (False, True, "internet")
    options: ModalOptions
    supports_snapshot: ClassVar[bool] = True  # Sandbox.snapshot_filesystem, an Image

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._sb: Any = None
        self._attempts = 0
        self._abandoned: str | None = None
        self._lifetime = max(1, math.ceil(self.spec.timeout_s))  # Modal takes whole seconds
        self._ends_at = 0.0

    @classmethod
    def sdk(cls) -> ModuleType:
        """The ``modal`` module every call goes through."""
        return modal_sdk()

    @property
    def _modal_name(self) -> str:
        # Unique per start attempt: Modal names are unique among an App's running sandboxes.
        return f"{self.id}-{self._attempts}"

    @property
    def backend_id(self) -> str | None:
        """Modal's id of the sandbox (``sb-...``) once created, else ``None``."""
        return None if self._sb is None else str(self._sb.object_id)

    # ----------------------------------------------------------------- sandlot gc

    @classmethod
    def _reaper_context(cls, options: ModalOptions) -> tuple[ModuleType, str]:
        """The SDK and the App the sandboxes were created in.

        Raises:
            BackendUnavailableError: ``modal`` missing or no credentials.
        """
        sdk = cls.sdk()
        check_credentials()
        return sdk, options.app_name

    @classmethod
    async def _list_labelled(
        cls, context: tuple[ModuleType, str], run_id: str | None
    ) -> list[RemoteSandbox]:
        """``Sandbox.list(app_id=, tags=)`` of the App (``App.lookup``: no App, no sandboxes):
        running sandboxes, tags matched server side, read with ``get_tags``."""
        modal, app_name = context
        try:
            app = await modal.App.lookup.aio(app_name)
        except modal.exception.NotFoundError:
            return []
        found = []
        async for sb in modal.Sandbox.list.aio(
            app_id=app.app_id, tags={RUN_ID: run_id} if run_id else None
        ):
            found.append(
                RemoteSandbox("modal", sb.object_id, await sb.get_tags.aio(), "running", sb)
            )
        return found

    @classmethod
    async def _kill_listed(cls, context: object, sandbox: RemoteSandbox) -> None:
        """``terminate`` (a no-op on Modal's side if it already finished)."""
        await sandbox.handle.terminate.aio()

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        modal = self.sdk()
        check_credentials()
        spec, opts = self.spec, self.options
        image_name = backend_image(spec.image, "modal", opts.image_overrides)
        if self.origin is not None:  # a fork: the snapshot's image, looked up at create
            image_name = str(self.origin.handle)
        try:
            app = await modal.App.lookup.aio(opts.app_name, create_if_missing=True)
            secret = opts.registry_secret
            if self.origin is not None:
                image = modal.Image.from_id(image_name)
            else:
                image = modal.Image.from_registry(
                    image_name, secret=modal.Secret.from_name(secret) if secret else None
                )
        except Exception as exc:
            raise self._start_error(modal, f"preparing image {image_name!r}", exc) from exc
        self._attempts += 1
        kwargs: dict[str, Any] = {
            "app": app,
            "name": self._modal_name,
            "tags": sandbox_labels(self.id, spec.labels),
            "image": image,
            "env": dict(spec.env) or None,
            "timeout": self._lifetime,
            "idle_timeout": opts.idle_timeout_s,
            "workdir": spec.workdir,
            "cpu": spec.cpu,
            "memory": spec.memory_mb,
            "block_network": spec.network is False,
        }
        if spec.network == "internet":
            kwargs["outbound_cidr_allowlist"] = list(public_cidrs())
        # PID 1 exits on SIGTERM at once (a bare `sleep` would ignore it) and outlives the
        # lifetime Modal enforces.
        init = remote_shell.init_argv(self._lifetime + 60)
        # Shielded: a cancelled caller must still learn the id of a sandbox Modal created, so
        # close() can terminate it.
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(opts.create_timeout_s) as scope:
                try:
                    self._sb = await modal.Sandbox.create.aio(*init, **kwargs)
                except Exception as exc:
                    raise self._start_error(modal, f"creating from {image_name!r}", exc) from exc
            if scope.cancelled_caught:
                self._abandoned = self._modal_name  # it may exist: _close looks for it
                raise SandboxStartError(
                    f"Modal did not create sandbox {self.id} within create_timeout_s="
                    f"{opts.create_timeout_s:g} s",
                    retryable=True,
                )
        self._ends_at = time.monotonic() + self._lifetime
        # The STARTING slot is held until a command works.
        if await self._run_quiet(remote_shell.mkdir_argv(spec.workdir)) != 0:
            raise SandboxStartError(f"sandbox {self.id}: cannot create workdir {spec.workdir}")

    def _start_error(self, modal: ModuleType, what: str, exc: Exception) -> SandboxStartError:
        """Retryable when :func:`translate` says the service's fault ("Image build failed,
        please try again" and build timeouts included), unless the image or account is."""
        err = translate(what, exc)
        permanent = type(exc).__name__ in _PERMANENT_CREATE or any(
            w in str(exc).lower() for w in _PERMANENT_CREATE_WORDS
        )
        return SandboxStartError(
            f"sandbox {self.id}: {err}", retryable=err.retryable and not permanent
        )

    async def _close(self) -> None:
        """``terminate`` (a sandbox whose create was abandoned is first looked up by name), cut
        at ``control_timeout_s``; ``close`` tries again, then reports what is left."""
        modal, limit = self.sdk(), self.options.control_timeout_s
        try:
            with anyio.fail_after(limit):
                if self._sb is None and self._abandoned is not None:
                    with contextlib.suppress(modal.exception.NotFoundError):  # never created
                        self._sb = await modal.Sandbox.from_name.aio(
                            self.options.app_name, self._abandoned
                        )
                    self._abandoned = None
                if self._sb is not None:
                    await self._sb.terminate.aio()
        except Exception as exc:  # whatever failed, another try may work
            detail = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError):
                detail = f"Modal did not answer within control_timeout_s={limit:g} s"
            raise SandboxError(f"sandbox {self.id}: terminate: {detail}", retryable=True) from exc
        self._sb = None

    async def _snapshot(self) -> str:
        """``Sandbox.snapshot_filesystem`` (the files, not the processes), cut at
        ``control_timeout_s`` on both sides (Modal's own ``timeout`` is the same, rounded up, so
        the service stops too); the image's id. Modal images carry no tags: ``sandlot gc`` cannot
        find one a crash left behind, Modal removes it after ``snapshot_ttl_s``.

        Raises:
            SandboxDeadError: the sandbox finished.
            SandboxError: Modal failed or did not answer (``retryable``).
        """
        ttl, sdk_timeout = self.options.snapshot_ttl_s, math.ceil(self.options.control_timeout_s)

        async def snap() -> Any:
            return await self._sb.snapshot_filesystem.aio(sdk_timeout, ttl=ttl)

        image = await self._call("snapshot_filesystem", snap, control=True)
        return str(image.object_id)

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None:
        """``modal.experimental.image_delete(handle)`` (experimental in 1.6.4: the stable form
        may move to ``Image``), cut at ``control_timeout_s``; an image gone already is fine.

        Raises:
            TimeoutError: Modal did not answer; a Modal error as raised (``Snapshot`` logs it).
        """
        modal, limit = cls.sdk(), ModalOptions.model_validate(options).control_timeout_s
        with anyio.fail_after(limit), contextlib.suppress(modal.exception.NotFoundError):
            await modal.experimental.image_delete.aio(handle)

    async def _probe(self) -> str | None:
        """Why the Modal sandbox cannot run commands (it finished), else ``None``."""
        if self._sb is None:
            return "was terminated"
        # A poll that fails or does not answer tells nothing.
        with anyio.move_on_after(self.options.control_timeout_s), contextlib.suppress(Exception):
            code = await self._sb.poll.aio()
            if code is not None:
                return f"Modal sandbox {self.backend_id} finished with exit code {code}"
        return None

    async def _call(
        self, what: str, fn: Callable[..., Awaitable[T]], *args: Any, control: bool = False
    ) -> T:
        """Await ``fn(*args)``, with ``control`` cut after ``options.control_timeout_s`` (the
        SDK's own calls wait as long as its transport does: 155 s measured) as a retryable
        ``SandboxError``. An SDK or transport error (see :func:`is_modal_error`) becomes
        ``SandboxFileError`` (Modal's ``SandboxFilesystemError``), ``SandboxDeadError`` when
        the sandbox has finished, else a ``SandboxError`` (retryable for transient faults)."""
        limit = self.options.control_timeout_s
        try:
            with anyio.move_on_after(limit if control else None):
                return await fn(*args)
            raise SandboxError(
                f"sandbox {self.id}: {what}: Modal did not answer within "
                f"control_timeout_s={limit:g} s",
                retryable=True,
            )
        except SandboxError:
            raise
        except Exception as exc:
            modal = self.sdk()
            if not is_modal_error(modal, exc):
                raise
            if isinstance(exc, modal.exception.SandboxFilesystemError):
                raise SandboxFileError(f"{what}: {exc}") from exc
            raise await self._gone() or translate(f"sandbox {self.id}: {what}", exc) from exc

    # ----------------------------------------------------------------- commands

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``command`` with ``Sandbox.exec`` under :mod:`sandlot.sandboxes.remote_shell`'s
        wrapper (see :meth:`Transport._run`).

        stdout and stderr are read concurrently. At ``timeout`` (or on cancellation) every
        process of the command is killed (SIGTERM, ``stop_grace_s``, SIGKILL) by a second exec;
        Modal's own exec timeout is set ``30 s`` later as a backstop. ``timeout=None`` still
        ends 30 s after the sandbox's lifetime (``spec.timeout_s``) with ``SandboxDeadError``:
        a worker that died without ending the output stream must not hang the caller.

        Raises:
            SandboxDeadError: the sandbox finished (terminated, lifetime over, crashed).
            SandboxError: Modal failed, the output stream included; ``retryable`` for transient
                faults. Never an ``ExceptionGroup``.
        """
        marker = uuid.uuid4().hex
        argv = remote_shell.exec_argv(await self._fit_argv(run.command, marker), run.cwd)
        env = {**run.env, remote_shell.EXEC_MARKER_ENV: marker}
        timeout, out = run.timeout, CappedOutput(self.options.max_output_bytes)
        backstop = None
        if timeout is not None:
            backstop = math.ceil(timeout + self.options.stop_grace_s) + _BACKSTOP_MARGIN_S
        limit = timeout
        if limit is None:
            limit = max(0.0, self._ends_at - time.monotonic()) + _LIFETIME_MARGIN_S
        launched = False

        async def body() -> int:
            nonlocal launched
            proc = await self._call("exec", self._exec, argv, backstop, env)
            launched = True
            return await self._drive(proc, run.stdin, out)

        async def stop() -> None:
            if launched:
                await self._kill(marker)

        code = await self._bounded(limit, body, stop)
        if code is None and timeout is None:
            raise await self._gone() or SandboxDeadError(
                f"sandbox {self.id} ({self.backend_id}): a command without a timeout outlived "
                f"the sandbox's lifetime ({self.spec.timeout_s:g} s) by {_LIFETIME_MARGIN_S:g} s"
            )
        if code is not None and (code == _MODAL_EXEC_TIMEOUT_CODE or code >= 128):
            dead = await self._gone()
            if dead is not None:
                raise dead
        return RunOutput.of(None if code == _MODAL_EXEC_TIMEOUT_CODE else code, out)

    async def _open_shell(self, name: str, config: SessionConfig) -> BashSession:
        """A session whose ``bash`` is an exec with open stdin (:class:`ModalChannel`)."""
        cwd = posixpath.join(self.spec.workdir, config.cwd or "")

        async def open_channel() -> ModalChannel:
            self._check_usable()
            return await self._call(
                "starting a shell", lambda: ModalChannel.start(self._sb, cwd=cwd, run=self.exec)
            )

        return ChannelSession(name, config, open_channel, self.is_alive)

    async def _fit_argv(self, command: str, marker: str) -> str:
        """``command``, or, when it is too long for Modal's 64 KiB argv limit
        (``ARG_MAX_BYTES`` in ``modal/sandbox/_common.py``), a short command that sources it from
        a file written through the filesystem API (and removes the file)."""
        if len(command.encode()) <= _ARGV_COMMAND_BYTES:
            return command
        path = f"/tmp/sandlot-cmd-{marker}"
        await self._put_bytes(path, command.encode())
        quoted = shlex.quote(path)
        # Opened, unlinked, then sourced: nothing is left behind whatever the command does.
        return f"exec 9<{quoted} && rm -f -- {quoted} && . /dev/fd/9"

    async def _exec(
        self, argv: list[str], backstop: int | None = None, env: dict[str, str] | None = None
    ) -> Any:
        return await self._sb.exec.aio(*argv, timeout=backstop, env=env, text=False)

    async def _drive(self, proc: Any, stdin: bytes | None, out: CappedOutput) -> int:
        """Feed ``stdin`` (then EOF), read stdout and stderr to their ends concurrently into
        ``out``, and wait; the exit status.

        Raises:
            SandboxDeadError / SandboxError: a call or a stream failed (a dead sandbox first,
                else the first failure; raised as such, not inside an ``ExceptionGroup``).
        """
        await self._call("exec stdin", self._feed, proc, stdin)
        failures: list[SandboxError] = []

        async def read(what: str, stream: Any, buf: CappedBuffer) -> None:
            try:
                await self._call(what, self._pump, stream, buf)
            except SandboxError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "exec stdout", proc.stdout, out.stdout)
            tg.start_soon(read, "exec stderr", proc.stderr, out.stderr)
        if failures:
            raise next((e for e in failures if isinstance(e, SandboxDeadError)), failures[0])
        return int(await self._call("exec wait", proc.wait.aio))

    @staticmethod
    async def _feed(proc: Any, data: bytes | None) -> None:
        view = memoryview(data or b"")
        for start in range(0, len(view), _STDIN_CHUNK):
            proc.stdin.write(view[start : start + _STDIN_CHUNK])
            await proc.stdin.drain.aio()
        proc.stdin.write_eof()
        await proc.stdin.drain.aio()

    @staticmethod
    async def _pump(stream: Any, buf: CappedBuffer) -> None:
        async for chunk in stream:
            buf.feed(chunk if isinstance(chunk, bytes) else chunk.encode())

    async def _run_quiet(self, argv: list[str]) -> int:
        """Run ``argv`` to completion, output discarded; its exit status."""
        return await self._drive(await self._call("exec", self._exec, argv), None, CappedOutput(0))

    async def _kill(self, marker: str) -> None:
        """Kill the processes carrying ``marker`` (SIGTERM, ``stop_grace_s``, SIGKILL) with a
        second exec, within 15 s more; a failure is logged, not raised."""
        grace = self.options.stop_grace_s
        with anyio.move_on_after(grace + _KILL_BUDGET_S):
            try:
                await self._run_quiet(remote_shell.kill_argv(marker, grace))
                return
            except SandboxError as exc:
                log.warning("sandbox %s: could not kill exec %s: %s", self.id, marker, exc)
                return
        log.warning("sandbox %s: exec %s may still be running", self.id, marker)

    # ----------------------------------------------------------------- files

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """``Sandbox.filesystem.read_bytes`` (whole: Modal's API has no ranged read)."""
        read = self._sb.filesystem.read_bytes.aio
        return bytes(await self._call(f"read_file {path}", read, path, control=True))

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """``Sandbox.filesystem.write_bytes``, which creates the parents."""
        write = self._sb.filesystem.write_bytes.aio
        await self._call(f"write_file {path}", write, data, path, control=True)
