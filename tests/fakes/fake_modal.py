"""A stand-in ``modal`` module: the subset of the Modal 1.6 SDK the backend uses, run locally.

Shapes follow ``modal`` 1.6.4 (``modal/sandbox/_sandbox.py``, ``container_process.py``,
``io_streams.py``, ``_filesystem.py``, ``exception.py``): every call the backend makes is a
``.aio`` coroutine; ``Sandbox.exec`` returns a process with ``stdout``/``stderr`` streams
(async-iterable chunks, ``read.aio``), ``stdin`` (``write``, ``write_eof``, ``drain.aio``) and
``wait.aio`` (``-1`` when the exec's own ``timeout`` hit, ``128+N`` for a signal).

A fake sandbox is a private root directory; each exec runs in a bubblewrap jail over it
(``block_network`` → no network namespace access), its processes tagged with the sandbox id so
``terminate`` (or :meth:`FakeModal.die`) kills them all. The execs of a sandbox share a PID
namespace, held by a placeholder PID 1 that the first exec starts: a command sees the
sandbox's processes, not the host's (when the tests run as root: see
:func:`fakes.jail.pid_namespace`). Every call is recorded in ``FakeModal.calls`` as
``(name, args, kwargs)``.

Behaviour of the service the fake reproduces (as read in ``modal/sandbox/_common.py`` and
``modal/io_streams.py`` of 1.6.4):

* ``Sandbox.create`` returns before the sandbox is scheduled (``schedule_latency_s``); an exec
  waits for it;
* the argv of an exec may total at most 64 KiB (``ARG_MAX_BYTES``: ``InvalidError``); stdin
  buffers at most 16 MiB between drains (``BufferError``); env keys must match
  ``[A-Za-z_][A-Za-z0-9_]*`` (``InvalidError``), at create and at exec;
* an exec's ``timeout`` counts from the exec's start (``wait`` then reports ``-1``);
* ``terminate`` ends the sandbox with exit code 137, its lifetime (``timeout``) with 124;
* when a sandbox dies, the output streams of its running execs *raise* (grpclib's
  ``StreamTerminatedError``, the worker's gRPC stream breaking) instead of ending;
  :meth:`FakeModal.freeze` makes them hang instead (a worker lost without a word);
* ``Sandbox.snapshot_filesystem(timeout, ttl=)`` returns an image (``object_id`` ``im-...``)
  holding a copy of the sandbox's files at that moment; ``Image.from_id`` names it lazily (an
  unknown or deleted id fails at ``Sandbox.create`` with ``NotFoundError``), a sandbox created
  from it starts with its own copy of them; ``experimental.image_delete`` removes it
  (``NotFoundError`` when unknown).

Fault knobs: ``create_latency_s``, ``rate_limit_rate`` (fraction of creates failing with
``ResourceExhaustedError``), ``known_images`` (others: ``ImageBuildError``),
``terminate_failures`` (terminate raises ``InternalError`` that many times first),
``stream_failures`` (output streams raise ``StreamTerminatedError`` that many times),
``build_failures`` (messages of ``ImageBuildError`` raised by the next creates),
``Image.run_commands`` steps run at create in the sandbox's files with the network (a failing
one: ``ImageBuildError``),
``fault_rate`` (fraction of *every* call, create/exec/poll/terminate/snapshot, failing with a
transient error chosen at random, :data:`TRANSIENT_FAULTS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from fakes.jail import default_signals, default_start, jail_argv, make_root, pid_namespace

_CHUNK = 64 * 1024
_MARKER = "FAKE_MODAL_SANDBOX"
ARG_MAX_BYTES = 2**16
STDIN_BUFFER_BYTES = 16 * 1024 * 1024
_ENV_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

try:  # what Modal's gRPC streams raise when the connection to the worker breaks
    from grpclib.exceptions import StreamTerminatedError
except ImportError:  # pragma: no cover - grpclib comes with modal

    class StreamTerminatedError(Exception):  # type: ignore[no-redef]
        pass


class _Method:
    """An SDK method: the fake only offers its ``.aio`` variant."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.aio = fn


# ----------------------------------------------------------------- exceptions (modal.exception)


class Error(Exception):
    pass


class NotFoundError(Error):
    pass


class InvalidError(Error):
    pass


class InternalError(Error):
    pass


class ResourceExhaustedError(Error):
    pass


class ConnectionError(Error):
    pass


class AuthError(Error):
    pass


class SandboxTerminatedError(Error):
    pass


class ImageBuildError(Error):
    pass


class SandboxFilesystemError(Error):
    pass


class SandboxFilesystemNotFoundError(SandboxFilesystemError):
    pass


class SandboxFilesystemIsADirectoryError(SandboxFilesystemError):
    pass


class SandboxFilesystemNotADirectoryError(SandboxFilesystemError):
    pass


class SandboxFilesystemPermissionError(SandboxFilesystemError):
    pass


def _check_env(env: dict[str, str] | None) -> None:
    for key in env or {}:
        if not _ENV_KEY.match(key):
            raise InvalidError(
                f"Secret key name {key!r} is invalid for environment variables. "
                "Only letters, numbers, and underscores are allowed."
            )


EXCEPTIONS = SimpleNamespace(
    **{
        cls.__name__: cls
        for cls in (
            Error,
            NotFoundError,
            InvalidError,
            InternalError,
            ResourceExhaustedError,
            ConnectionError,
            AuthError,
            SandboxTerminatedError,
            ImageBuildError,
            SandboxFilesystemError,
            SandboxFilesystemNotFoundError,
            SandboxFilesystemIsADirectoryError,
            SandboxFilesystemNotADirectoryError,
            SandboxFilesystemPermissionError,
        )
    }
)


# ----------------------------------------------------------------- processes

# An exec's stdout and stderr: each the reader and writer of our end of its socket pair.
_Output = tuple[
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
    tuple[asyncio.StreamReader, asyncio.StreamWriter],
]


class _Stream:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sandbox: FakeSandbox
    ) -> None:
        self._reader = reader
        self._writer = writer  # our end of the output's socket pair, closed at its end
        self._sandbox = sandbox
        self.read = _Method(self._read_all)

    async def _read_all(self) -> bytes:
        chunks = [chunk async for chunk in self]
        return b"".join(chunks)

    async def _hang_if_frozen(self) -> None:
        if self._sandbox.frozen:
            await asyncio.Event().wait()  # the worker is gone and nobody says so

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            await self._hang_if_frozen()
            chunk = await self._reader.read(_CHUNK)
            await self._hang_if_frozen()
            if self._sandbox.fake.take("stream_failures"):
                raise StreamTerminatedError("Connection lost")
            if not chunk:
                self._writer.close()
                if self._sandbox.returncode is not None:
                    raise StreamTerminatedError("Connection lost")
                return
            yield chunk


class _Stdin:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._eof = False
        self._buffered = 0
        self.drain = _Method(self._drain)

    def write(self, data: bytes | memoryview) -> None:
        if self._buffered + len(data) > STDIN_BUFFER_BYTES:
            raise BufferError("Buffer size exceed limit. Call drain to flush the buffer.")
        self._buffered += len(data)
        self._writer.write(bytes(data))

    def write_eof(self) -> None:
        self._eof = True

    async def _drain(self) -> None:
        self._buffered = 0
        try:
            await self._writer.drain()
            if self._eof:
                self._writer.close()
        except (BrokenPipeError, ConnectionResetError):
            pass


class FakeProcess:
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        output: _Output,
        timeout: int | None,
        sandbox: FakeSandbox,
    ) -> None:
        assert proc.stdin
        self._proc = proc
        # Modal counts an exec's timeout from the exec's start, not from wait().
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.stdout = _Stream(*output[0], sandbox)
        self.stderr = _Stream(*output[1], sandbox)
        self.stdin = _Stdin(proc.stdin)
        self.wait = _Method(self._wait)

    async def _wait(self) -> int:
        left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            code = await asyncio.wait_for(self._proc.wait(), left)
        except asyncio.TimeoutError:
            self._proc.kill()
            await self._proc.wait()
            return -1  # what Modal's wait() reports for an exec past its timeout
        return 128 - code if code < 0 else code


# ----------------------------------------------------------------- sandboxes


class FakeSandbox:
    def __init__(self, fake: FakeModal, app: Any, kwargs: dict[str, Any], args: tuple[str, ...]):
        self.fake = fake
        self.object_id = f"sb-{uuid.uuid4().hex[:16]}"
        self.app = app
        self.name = kwargs.get("name")
        self.tags = dict(kwargs.get("tags") or {})
        self.env = dict(kwargs.get("env") or {})
        self.workdir = kwargs.get("workdir") or "/"
        # The fake cannot route by destination: an egress allowlist gets no network at all,
        # which keeps what the allowlist forbids (the host, private ranges) unreachable.
        self.block_network = bool(kwargs.get("block_network")) or (
            kwargs.get("outbound_cidr_allowlist") is not None
        )
        self.entrypoint = args
        self.returncode: int | None = None
        self.frozen = False
        self.scheduled_at = time.monotonic() + fake.schedule_latency_s
        if kwargs.get("timeout"):
            loop = asyncio.get_running_loop()
            self._lifetime = loop.call_later(float(kwargs["timeout"]), self.kill, 124)
        self.root = make_root(fake.workdir, self.object_id)
        # The container's PID 1 (a placeholder for the entrypoint), started by the first exec,
        # in a PID namespace of its own that every exec joins, as on a worker: an exec sees the
        # sandbox's processes only, not the host's.
        self._holder: subprocess.Popen[bytes] | None = None
        self._pidns: int | Literal["wait"] | None = "wait"  # an fd once known
        self._outputs: list[asyncio.StreamWriter] = []  # the execs' output sockets, our ends
        self.exec = _Method(self._exec)
        self.poll = _Method(self._poll)
        self.terminate = _Method(self._terminate)
        self.get_tags = _Method(self._get_tags)
        self.set_tags = _Method(self._set_tags)
        self.snapshot_filesystem = _Method(self._snapshot_filesystem)
        self.filesystem = SimpleNamespace(
            read_bytes=_Method(self._read_bytes), write_bytes=_Method(self._write_bytes)
        )

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.fake.calls.append((name, args, kwargs))

    def _env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/root",
            **self.env,
            **(env or {}),
            _MARKER: self.object_id,
        }

    def _start_holder(self) -> subprocess.Popen[bytes]:
        if self._holder is None:
            self._holder = subprocess.Popen(
                [
                    *jail_argv(self.root, network=True, own_pids=True, env=self._env()),
                    "sleep",
                    "infinity",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=default_signals,
            )
        return self._holder

    async def _pid_namespace(self) -> int | None:
        """The fd of the PID namespace of the sandbox's PID 1 (``None``: the host's)."""
        if self._pidns == "wait":
            fd = await pid_namespace(self._start_holder().pid)
            if self._pidns == "wait":
                self._pidns = fd
            elif fd is not None:  # a concurrent exec found it first
                os.close(fd)
        return None if self._pidns == "wait" else self._pidns

    async def _spawn_exec(
        self, argv: tuple[str, ...], env: dict[str, str] | None, workdir: str | None
    ) -> tuple[asyncio.subprocess.Process, _Output]:
        """:meth:`_spawn` with stdout and stderr on socket pairs, not pipes: sandlot's exec
        wrapper kills what holds its output (``-ef`` on ``/proc/PID/fd/N``), both ends of a
        pipe are one inode, and this fake's commands may share the host's PID namespace, so after
        a PID wrap-around the wrapper took the test process itself for a holder and killed it
        (an xdist worker "not properly terminated"); the two ends of a socket pair are two."""
        pairs = [socket.socketpair(), socket.socketpair()]
        try:
            proc = await self._spawn(argv, env, workdir, pairs[0][1].fileno(), pairs[1][1].fileno())
        except BaseException:
            for ours, _ in pairs:
                ours.close()
            raise
        finally:
            for _, theirs in pairs:
                theirs.close()
        out = await asyncio.open_unix_connection(sock=pairs[0][0])
        err = await asyncio.open_unix_connection(sock=pairs[1][0])
        self._outputs += [out[1], err[1]]
        return proc, (out, err)

    async def _spawn(
        self,
        argv: tuple[str, ...],
        env: dict[str, str] | None,
        workdir: str | None,
        stdout: int = asyncio.subprocess.PIPE,
        stderr: int = asyncio.subprocess.PIPE,
    ) -> asyncio.subprocess.Process:
        if self.returncode is not None:
            raise SandboxTerminatedError(f"sandbox {self.object_id} has finished")
        wait = self.scheduled_at - time.monotonic()
        if wait > 0:  # created, not yet scheduled on a worker
            await asyncio.sleep(wait)
        pidns = await self._pid_namespace()
        jail = jail_argv(
            self.root,
            network=not self.block_network,
            own_pids=False,
            env=self._env(env),
            cwd=workdir or "/",
            pidns=pidns,
        )
        prefix, setup = default_start()
        return await asyncio.create_subprocess_exec(
            *prefix,
            *jail,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=setup,
            pass_fds=() if pidns is None else (pidns,),
        )

    async def _exec(
        self,
        *args: str,
        timeout: int | None = None,
        env: dict[str, str] | None = None,
        text: bool = True,
        workdir: str | None = None,
    ) -> FakeProcess:
        self._record("Sandbox.exec", *args, timeout=timeout, env=env, text=text, workdir=workdir)
        assert text is False, "the backend reads bytes"
        total = sum(len(a) for a in args)
        if total > ARG_MAX_BYTES:
            raise InvalidError(
                f"Total length of CMD arguments cannot exceed {ARG_MAX_BYTES} bytes (ARG_MAX). "
                f"Got {total} bytes."
            )
        _check_env(env)
        self.fake.maybe_fault("Sandbox.exec")
        proc, output = await self._spawn_exec(args, env, workdir)
        return FakeProcess(proc, output, timeout, self)

    async def _poll(self) -> int | None:
        self._record("Sandbox.poll")
        await self.fake.maybe_unanswered("Sandbox.poll")
        self.fake.maybe_fault("Sandbox.poll")
        return None if self.frozen else self.returncode

    async def _terminate(self) -> None:
        self._record("Sandbox.terminate", self.object_id)
        await self.fake.maybe_unanswered("Sandbox.terminate")
        if self.fake.terminate_failures > 0:
            self.fake.terminate_failures -= 1
            raise InternalError("terminate failed (injected)")
        self.fake.maybe_fault("Sandbox.terminate")
        self.fake.terminated.append(self.object_id)
        self.kill(137)

    async def _snapshot_filesystem(
        self, timeout: int = 55, *, ttl: int | None = 30 * 24 * 3600
    ) -> SimpleNamespace:
        self._record("Sandbox.snapshot_filesystem", timeout=timeout, ttl=ttl)
        await self.fake.maybe_unanswered("Sandbox.snapshot_filesystem")
        self.fake.maybe_fault("Sandbox.snapshot_filesystem")
        if self.returncode is not None:
            raise SandboxTerminatedError(f"sandbox {self.object_id} has finished")
        image_id = f"im-{uuid.uuid4().hex[:16]}"
        await _copy_tree(self.root, self.fake.workdir / "images" / image_id)
        self.fake.images.add(image_id)
        return _image(object_id=image_id)

    def kill(self, returncode: int) -> None:
        """End the sandbox: every process in it dies, its files go."""
        if self.returncode is None:
            self.returncode = returncode
        with contextlib.suppress(AttributeError, RuntimeError):
            self._lifetime.cancel()
        for pid in _pids_with(f"{_MARKER}={self.object_id}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._holder is not None:
            self._holder.kill()  # bwrap, outside the jail: the marker is only inside
            self._holder.wait()
        if isinstance(self._pidns, int):
            os.close(self._pidns)
        self._pidns = None
        for writer in self._outputs:
            writer.close()
        self._outputs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    async def _get_tags(self) -> dict[str, str]:
        return dict(self.tags)

    async def _set_tags(self, tags: dict[str, str]) -> None:
        self.tags = dict(tags)

    async def _run(
        self, script: str, path: str, data: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        proc = await self._spawn(("/bin/sh", "-c", script, path), None, None)
        out, err = await proc.communicate(data)
        return int(proc.returncode or 0), out, err

    async def _read_bytes(self, path: str) -> bytes:
        self._record("filesystem.read_bytes", path)
        await self.fake.maybe_unanswered("filesystem.read_bytes")
        script = '[ -d "$0" ] && exit 21; [ -e "$0" ] || exit 2; cat -- "$0"'
        code, out, err = await self._run(script, path)
        _raise_fs(code, err, path)
        return out

    async def _write_bytes(self, data: bytes, path: str) -> None:
        self._record("filesystem.write_bytes", len(data), path)
        await self.fake.maybe_unanswered("filesystem.write_bytes")
        script = '[ -d "$0" ] && exit 21; mkdir -p -- "$(dirname -- "$0")" || exit 20; cat >"$0"'
        code, _, err = await self._run(script, path, data)
        _raise_fs(code, err, path)


def _image(
    tag: str | None = None,
    secret: Any = None,
    object_id: str | None = None,
    commands: tuple[str, ...] = (),
) -> Any:
    image = SimpleNamespace(
        kind="image", tag=tag, secret=secret, object_id=object_id, commands=commands
    )
    # Image.run_commands: build steps (Dockerfile RUN lines) on top of this image.
    image.run_commands = lambda *cmds: _image(tag, secret, object_id, (*commands, *cmds))
    return image


async def _copy_tree(source: Path, dest: Path) -> None:
    """``dest`` (new) with a copy of ``source``'s files, modes and links kept."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec("cp", "-a", "--", str(source), str(dest))
    if await proc.wait() != 0:
        raise InternalError(f"copying {source} failed")


def _raise_fs(code: int, err: bytes, path: str) -> None:
    if code == 0:
        return
    detail = f"{err.decode(errors='replace').strip()}: {path}"
    if code == 2:
        raise SandboxFilesystemNotFoundError(f"No such file or directory: {path}")
    if code == 21:
        raise SandboxFilesystemIsADirectoryError(f"Is a directory: {path}")
    if code == 20:
        raise SandboxFilesystemNotADirectoryError(detail)
    raise SandboxFilesystemError(detail)


def _pids_with(marker: str) -> list[int]:
    needle = marker.encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


TRANSIENT_FAULTS: tuple[type[Exception], ...] = (
    InternalError,
    ConnectionError,
    ResourceExhaustedError,
    StreamTerminatedError,
)


class FakeModal:
    """The fake module object. Pass it where the backend would import ``modal``."""

    def __init__(self, known_images: set[str] | None = None) -> None:
        self.known_images = known_images
        self.create_latency_s = 0.0
        self.rate_limit_rate = 0.0
        self.terminate_failures = 0
        self.schedule_latency_s = 0.0
        self.stream_failures = 0
        self.build_failures: list[str] = []
        self.fault_rate = 0.0
        self.unanswered: set[str] = set()
        """Calls (``"Sandbox.create"``, ``"Sandbox.from_name"``, ``"Sandbox.poll"``,
        ``"Sandbox.terminate"``, ``"filesystem.read_bytes"``, ``"filesystem.write_bytes"``,
        ``"Sandbox.snapshot_filesystem"``, ``"experimental.image_delete"``) that
        never answer, as against an unresponsive API (a create does its work first)."""
        self.faults_served: list[tuple[str, str]] = []
        self.rng = random.Random(7)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.sandboxes: list[FakeSandbox] = []
        self.terminated: list[str] = []
        self.creating = 0
        self.peak_creating = 0
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-modal-"))
        self.exception = EXCEPTIONS
        self.App = SimpleNamespace(lookup=_Method(self._app_lookup))
        self.Secret = SimpleNamespace(from_name=self._secret_from_name)
        self.Image = SimpleNamespace(
            from_registry=self._image_from_registry, from_id=self._image_from_id
        )
        self.experimental = SimpleNamespace(image_delete=_Method(self._image_delete))
        self.images: set[str] = set()
        """Ids of the snapshot images (their files are under ``workdir/images``)."""
        self.Sandbox = SimpleNamespace(
            create=_Method(self._create),
            from_id=_Method(self._from_id),
            from_name=_Method(self._from_name),
            list=_Method(self._list),
        )
        self.apps: dict[str, SimpleNamespace] = {}

    def close(self) -> None:
        for sb in self.sandboxes:
            sb.kill(137)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def take(self, counter: str) -> bool:
        """Use up one of the ``counter`` injected failures, if any is left."""
        left = getattr(self, counter)
        if left > 0:
            setattr(self, counter, left - 1)
            return True
        return False

    def maybe_fault(self, call: str) -> None:
        """Raise a transient error on ``fault_rate`` of the calls."""
        if self.rng.random() >= self.fault_rate:
            return
        fault = self.rng.choice(TRANSIENT_FAULTS)
        self.faults_served.append((call, fault.__name__))
        raise fault(f"{call}: injected {fault.__name__}, please try again")

    async def maybe_unanswered(self, call: str) -> None:
        """Wait forever (until cancelled) when ``call`` is in :attr:`unanswered`."""
        if call in self.unanswered:
            await asyncio.Event().wait()

    def freeze(self, sb: FakeSandbox) -> None:
        """The sandbox's worker is lost silently: streams hang, poll says running."""
        sb.frozen = True

    def live(self) -> list[FakeSandbox]:
        return [sb for sb in self.sandboxes if sb.returncode is None]

    def die(self, sb: FakeSandbox, returncode: int = 137) -> None:
        """Simulate the sandbox dying (OOM kill, lifetime over, host failure)."""
        sb.kill(returncode)

    def calls_of(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for n, args, kwargs in self.calls if n == name]

    async def _app_lookup(self, name: str, *, create_if_missing: bool = False) -> SimpleNamespace:
        self.calls.append(("App.lookup", (name,), {"create_if_missing": create_if_missing}))
        if name not in self.apps:
            if not create_if_missing:
                raise NotFoundError(f"App {name!r} not found")
            self.apps[name] = SimpleNamespace(name=name, app_id=f"ap-{uuid.uuid4().hex[:12]}")
        return self.apps[name]

    def _secret_from_name(self, name: str) -> SimpleNamespace:
        self.calls.append(("Secret.from_name", (name,), {}))
        return SimpleNamespace(kind="secret", name=name)

    def _image_from_registry(self, tag: str, secret: Any = None) -> SimpleNamespace:
        self.calls.append(("Image.from_registry", (tag,), {"secret": secret}))
        return _image(tag, secret)

    def _image_from_id(self, image_id: str) -> SimpleNamespace:
        self.calls.append(("Image.from_id", (image_id,), {}))
        return _image(object_id=image_id)

    async def _image_delete(self, image_id: str) -> None:
        self.calls.append(("experimental.image_delete", (image_id,), {}))
        await self.maybe_unanswered("experimental.image_delete")
        if image_id not in self.images:
            raise NotFoundError(f"Image {image_id} not found")
        self.images.discard(image_id)
        shutil.rmtree(self.workdir / "images" / image_id, ignore_errors=True)

    async def _create(self, *args: str, **kwargs: Any) -> FakeSandbox:
        self.calls.append(("Sandbox.create", args, kwargs))
        self.creating += 1
        self.peak_creating = max(self.peak_creating, self.creating)
        try:
            await asyncio.sleep(self.create_latency_s)
        finally:
            self.creating -= 1
        if self.rng.random() < self.rate_limit_rate:
            raise ResourceExhaustedError("sandbox creation rate limit exceeded, try again later")
        self.maybe_fault("Sandbox.create")
        if self.build_failures:
            raise ImageBuildError(self.build_failures.pop(0))
        _check_env(kwargs.get("env"))
        image = kwargs["image"]
        if image.tag is None and image.object_id not in self.images:
            raise NotFoundError(f"Image {image.object_id} not found")
        if image.tag and self.known_images is not None and image.tag not in self.known_images:
            raise ImageBuildError(f"image {image.tag} not found in registry")
        sb = FakeSandbox(self, kwargs["app"], kwargs, args)
        if image.tag is None:  # a snapshot's files, copied: siblings' writes stay apart
            shutil.rmtree(sb.root)
            await _copy_tree(self.workdir / "images" / image.object_id, sb.root)
        try:
            for command in image.commands:
                await self._build(sb, command)
        except BaseException:
            sb.kill(1)  # a failed build creates no sandbox
            raise
        self.sandboxes.append(sb)
        await self.maybe_unanswered("Sandbox.create")  # created, but the answer is lost
        return sb

    async def _build(self, sb: FakeSandbox, command: str) -> None:
        """A ``RUN`` step of the image, run (as Modal's builder does) with the network and the
        image's environment only, into the files the sandbox starts from; a failing step is an
        ``ImageBuildError``. Recorded as ``("Image.build", (command,), {"network": True})``."""
        self.calls.append(("Image.build", (command,), {"network": True}))
        jail = jail_argv(
            sb.root,
            network=True,
            own_pids=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"},
        )
        proc = await asyncio.create_subprocess_exec(
            *jail,
            "/bin/sh",
            "-c",
            command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise ImageBuildError(f"Image build failed: {out.decode(errors='replace')[-2000:]}")

    async def _from_id(self, sandbox_id: str) -> FakeSandbox:
        for sb in self.sandboxes:
            if sb.object_id == sandbox_id:
                return sb
        raise NotFoundError(sandbox_id)

    async def _from_name(self, app_name: str, name: str) -> FakeSandbox:
        self.calls.append(("Sandbox.from_name", (app_name, name), {}))
        await self.maybe_unanswered("Sandbox.from_name")
        for sb in self.sandboxes:
            if sb.app.name == app_name and sb.name == name and sb.returncode is None:
                return sb
        raise NotFoundError(f"{app_name}/{name}")

    async def _list(
        self, *, app_id: str | None = None, tags: dict[str, str] | None = None
    ) -> AsyncIterator[FakeSandbox]:
        self.calls.append(("Sandbox.list", (), {"app_id": app_id, "tags": tags}))
        for sb in list(self.sandboxes):
            if sb.returncode is not None or (app_id and sb.app.app_id != app_id):
                continue
            if tags and any(sb.tags.get(k) != v for k, v in tags.items()):
                continue
            yield sb
