"""A sandlot backend in one file: a container driven through the ``podman`` command line.

Written against :mod:`sandlot.sandboxes.transport` only (see ``docs/backends.md``): six
primitives, everything else (``exec`` results, timeouts, files, trees, sessions, liveness,
start retries) comes from ``Sandbox``. Commands run under the wrapper of
:mod:`sandlot.sandboxes.shared.remote_shell`, which gives any container the process-tree kill.
Podman CLI 4 (``podman run/exec/inspect/rm``, https://docs.podman.io/en/v4.3.1/Commands.html).
Register it with ``sandlot.register_backend("podman-cli", PodmanSandbox)`` or an entry point.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import ClassVar

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from pydantic import BaseModel, ConfigDict, Field

from sandlot.errors import SandboxError, SandboxFileError, SandboxStartError
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.capped import CappedBuffer, CappedOutput
from sandlot.sandboxes.labels import sandbox_labels
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.transport import RunOutput, RunRequest

_PODMAN_FAILED = 125  # the exit status of `podman exec` when podman itself failed


class PodmanOptions(BaseModel):
    """Options of the ``podman-cli`` backend.

    Attributes:
        podman: the ``podman`` executable (``CONTAINER_HOST`` etc. apply as usual).
        max_output_bytes: bytes of stdout and of stderr kept per exec.
        stop_grace_s: seconds between SIGTERM and SIGKILL for a timed-out command.
    """

    model_config = ConfigDict(extra="forbid")

    podman: str = "podman"
    max_output_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    stop_grace_s: float = Field(default=1.0, ge=0)


class PodmanSandbox(Sandbox):
    """One container (``podman run -d``) whose PID 1 lives ``spec.timeout_s`` seconds."""

    name: ClassVar[str] = "podman-cli"
    Options: ClassVar[type[BaseModel]] = PodmanOptions
    options: PodmanOptions

    async def _podman(self, *args: str) -> tuple[int, str, str]:
        done = await anyio.run_process([self.options.podman, *args], check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode().strip()

    async def _start(self) -> None:
        spec = self.spec
        argv = ["run", "-d", "--name", self.id]
        argv += [f"--label={k}={v}" for k, v in sandbox_labels(self.id, spec.labels).items()]
        argv += [f"--env={k}={v}" for k, v in spec.env.items()]
        if not spec.network:
            argv.append("--network=none")
        if spec.memory_mb:
            argv += [f"--memory={spec.memory_mb}m", f"--memory-swap={spec.memory_mb}m"]
        if spec.cpu:
            argv.append(f"--cpus={spec.cpu}")
        code, _, err = await self._podman(
            *argv, spec.image, *remote_shell.init_argv(spec.timeout_s)
        )
        if code != 0:
            raise SandboxStartError(f"podman run {spec.image!r} failed: {err}", retryable=False)
        code, _, err = await self._podman("exec", self.id, "mkdir", "-p", "--", spec.workdir)
        if code != 0:
            raise SandboxStartError(f"cannot create workdir {spec.workdir}: {err}")

    async def _close(self) -> None:
        # The container is named after the sandbox: found whatever step of `_start` failed.
        code, _, err = await self._podman("rm", "--force", "--time=0", self.id)
        if code != 0 and "no such container" not in err.lower():
            raise SandboxError(f"podman rm {self.id} failed: {err}")

    async def _probe(self) -> str | None:
        fmt = "{{.State.Running}} {{.State.ExitCode}}"
        code, out, err = await self._podman("inspect", "--format", fmt, self.id)
        if code != 0:
            return "container was removed" if "no such" in err.lower() else None
        running, exit_code = out.split()
        return None if running == "true" else f"container exited (exit code {exit_code})"

    async def _run(self, run: RunRequest) -> RunOutput:
        marker = uuid.uuid4().hex
        env = {**run.env, remote_shell.EXEC_MARKER_ENV: marker}
        argv = [self.options.podman, "exec", "-i", *(f"--env={k}={v}" for k, v in env.items())]
        argv += [self.id, *remote_shell.exec_argv(run.command, run.cwd)]
        out = CappedOutput(self.options.max_output_bytes)
        async with await anyio.open_process(argv) as proc:

            async def body() -> int:
                assert proc.stdin and proc.stdout and proc.stderr
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_feed, proc.stdin, run.stdin or b"")
                    tg.start_soon(_drain, proc.stdout, out.stdout)
                    tg.start_soon(_drain, proc.stderr, out.stderr)
                return await proc.wait()

            async def stop() -> None:
                kill = remote_shell.kill_argv(marker, self.options.stop_grace_s)
                await self._podman("exec", self.id, *kill)
                with contextlib.suppress(ProcessLookupError):  # `podman exec` may have ended
                    proc.kill()

            code = await self._bounded(run.timeout, body, stop)
        if code is not None and code >= _PODMAN_FAILED and (dead := await self._gone()):
            raise dead
        return RunOutput.of(code, out)

    async def _put_bytes(self, path: str, data: bytes) -> None:
        script = '[ ! -d "$1" ] && mkdir -p -- "$(dirname -- "$1")" && cat >"$1"'
        await self._file("write_file", path, "sh", "-c", script, "sh", path, stdin=data)

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        return await self._file("read_file", path, "head", "-c", str(max_bytes + 1), "--", path)

    async def _file(self, what: str, path: str, *argv: str, stdin: bytes | None = None) -> bytes:
        proc = await anyio.run_process(
            [self.options.podman, "exec", "-i", self.id, *argv], input=stdin, check=False
        )
        if proc.returncode != 0:
            if proc.returncode >= _PODMAN_FAILED and (dead := await self._gone()):
                raise dead
            detail = proc.stderr.decode("utf-8", "replace").strip() or "is a directory"
            raise SandboxFileError(f"{what} {path}: {detail}")
        return proc.stdout


async def _feed(stream: ByteSendStream, data: bytes) -> None:
    async with stream:
        await stream.send(data)


async def _drain(stream: ByteReceiveStream, buf: CappedBuffer) -> None:
    async for chunk in stream:
        buf.feed(chunk)
