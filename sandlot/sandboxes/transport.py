"""The transport: the few primitives in which one backend really differs from another.

:class:`~sandlot.sandboxes.base.Sandbox` owns the semantics (lifecycle state, start and close
retries, ``exec`` results with their one truncation note, files and trees, the mapping of a
failure to ``SandboxDeadError``, live-sandbox counting) and reaches the platform only through
the methods of :class:`Transport`, which it inherits. A backend is a ``Sandbox`` subclass that
implements them; nothing else is required (``docs/backends.md`` walks through one).

Required: ``_start`` (create), ``_close`` (destroy), ``_run`` (spawn one shell command with
capped output, kill its process tree at the timeout), ``_probe`` (is it still there?),
``_put_bytes`` and ``_get_bytes`` (move one file). Optional, where the platform has something
better than the defaults built on the required ones: ``_put_archive`` / ``_get_archive`` (a
native tar endpoint such as docker's, or a stream) and ``_open_shell`` (a streaming channel
instead of one ``exec`` per shell command), and ``_snapshot`` / ``_delete_snapshot`` (freeze
the filesystem for forks, :mod:`sandlot.sandboxes.snapshot`; with ``supports_snapshot``): one
more method here with a default that refuses, not a code path per backend.

Only ``_start`` and ``_close`` are abstract; the other required primitives raise
``NotImplementedError``, so a test double that overrides the public ``Sandbox`` methods
themselves (``exec``, ``read_file``, ...) need not implement them.
"""

from __future__ import annotations

import abc
import io
import shlex
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, Literal, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from sandlot.errors import SandboxFileError
from sandlot.result import TIMEOUT_EXIT_CODE, ExecResult
from sandlot.sandboxes.archive import tar_create_argv, tar_extract_argv
from sandlot.sandboxes.capped import CappedOutput, clip_tail, with_note
from sandlot.sandboxes.labels import CREATED_AT, OWNER, RUN_ID

T = TypeVar("T")

# A file move that takes this long is stuck (e.g. reading a FIFO planted by a command).
FILE_TIMEOUT_S = 600.0

Reader = Callable[[IO[bytes]], T]
"""A blocking function that reads a tar stream to its end (e.g. ``extract_archive``)."""


@dataclass(frozen=True)
class RunRequest:
    """One command for :meth:`Transport._run`.

    Attributes:
        command: the shell line, run with ``bash -c`` (``sh -c`` without bash).
        cwd: absolute working directory; a missing one is a failed command (non-zero exit,
            message on stderr), not an exception.
        env: variables added to the sandbox's environment for this command.
        stdin: fed to standard input; ``None`` for an empty stream.
        timeout: seconds; ``None`` for no limit. At the limit, and on cancellation, every
            process the command started is killed before ``_run`` returns or re-raises.
    """

    command: str
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class TreeCaps:
    """Caps of one :meth:`Transport._get_archive`, in bytes.

    Attributes:
        max_archive_bytes: the tar stream is cut here (a sparse file costs at most this).
        max_file_bytes: a file above this stops the transfer before it starts, where the
            backend can tell (else the extractor stops at its header).
    """

    max_archive_bytes: int
    max_file_bytes: int


@dataclass(frozen=True)
class RunOutput:
    """What :meth:`Transport._run` collected of one command.

    Attributes:
        exit_code: its exit status (``128 + N`` when killed by signal N), or ``None`` when the
            timeout ran out and its process tree was killed.
        stdout: the first bytes of standard output, at most the backend's output cap.
        stderr: the same for standard error.
        stdout_dropped: bytes of stdout beyond the cap, read and discarded.
        stderr_dropped: the same for stderr.
    """

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    @classmethod
    def of(cls, exit_code: int | None, out: CappedOutput) -> RunOutput:
        """The output gathered in ``out`` with ``exit_code``."""
        return cls(
            exit_code,
            bytes(out.stdout),
            bytes(out.stderr),
            out.stdout.dropped,
            out.stderr.dropped,
        )

    def result(self, duration_s: float) -> ExecResult:
        """The ``ExecResult``: text decoded as UTF-8 (invalid bytes replaced), each truncated
        stream followed by the one truncation note (:func:`sandlot.sandboxes.capped.with_note`)."""
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if self.exit_code is None else self.exit_code,
            stdout=with_note(self.stdout, self.stdout_dropped, "stdout"),
            stderr=with_note(self.stderr, self.stderr_dropped, "stderr"),
            timed_out=self.exit_code is None,
            duration_s=duration_s,
            truncated=bool(self.stdout_dropped or self.stderr_dropped),
        )


class ExecOptions(BaseModel):
    """Options of a backend's ``_run`` that its options model extends (where it runs commands
    through a shared half: :mod:`sandlot.sandboxes.shared.streamed_exec`,
    :mod:`sandlot.sandboxes.shared.swerex_plane`).

    Attributes:
        max_output_bytes: bytes of stdout and of stderr kept per exec; the rest is dropped and
            the result says ``truncated=True``.
        stop_grace_s: seconds a timed-out or cancelled command gets between SIGTERM and SIGKILL.
    """

    model_config = ConfigDict(extra="forbid")

    max_output_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    stop_grace_s: float = Field(default=1.0, ge=0)


@dataclass(frozen=True)
class RemoteSandbox:
    """One sandbox as a backend lists it.

    Attributes:
        backend: backend name.
        id: the backend's id (container id, Modal ``sb-...``, veFaaS sandbox id).
        labels: its labels / tags / metadata.
        state: the backend's status word (``running``, ``Running``, ...), informational.
        handle: what the reaper needs to kill it (backend specific).
    """

    backend: str
    id: str
    labels: Mapping[str, str]
    state: str = ""
    handle: Any = field(default=None, compare=False, repr=False)

    @property
    def run_id(self) -> str:
        """The ``sandlot.run_id`` label."""
        return self.labels.get(RUN_ID, "")

    @property
    def owner(self) -> str:
        """The ``sandlot.owner`` label."""
        return self.labels.get(OWNER, "")

    @property
    def created_at(self) -> float | None:
        """``sandlot.created_at`` in unix seconds, or ``None`` when absent or malformed."""
        try:
            return float(self.labels[CREATED_AT])
        except (KeyError, ValueError):
            return None


class Transport(abc.ABC):
    """The primitives a backend implements (see the module docstring). Paths are absolute and
    normalised, in the sandbox's view; ``Sandbox`` checks the lifecycle before each call."""

    id: str
    staging_dir: str = "/tmp"
    """Directory inside the sandbox for the default archive moves' staging files."""
    supports_snapshot: ClassVar[bool] = False
    """Whether the backend implements ``_snapshot``; ``False``: ``Sandbox.snapshot`` returns a
    fallback whose forks are set up again from the spec."""
    snapshot_scope: ClassVar[Literal["node", "global"]] = "node"
    """Where a snapshot can be forked: ``"node"``, on the host that took it (a directory, an
    image of the node's engine); ``"global"``, from any node (a provider's image id). It picks
    which processes share a set-up (:mod:`sandlot.sandboxes.setups.actor`)."""

    @property
    def backend_id(self) -> str | None:
        """The platform's id of the sandbox (Modal ``sb-...``, a container id) once created,
        else ``None`` (also where the platform has none); named when a destroy fails."""
        return None

    @classmethod
    def _reaper_context(cls, options: Any) -> Any:
        """What listing and killing (``sandlot gc``) need, e.g. a control-plane client, made
        once from the backend's ``options``; ``sandlot.sandboxes.reaper.SandboxReaper`` passes
        it to the two methods below. Override the three to give a backend a reaper.

        Raises:
            BackendUnavailableError: SDK or credentials missing.
        """
        raise NotImplementedError(f"{cls.__name__} cannot list its sandboxes")

    @classmethod
    async def _list_labelled(cls, context: Any, run_id: str | None) -> list[RemoteSandbox]:
        """The platform's live sandboxes labelled ``sandlot.run_id`` (= ``run_id`` if given;
        the caller checks the labels of every row again)."""
        raise NotImplementedError

    @classmethod
    async def _kill_listed(cls, context: Any, sandbox: RemoteSandbox) -> None:
        """Destroy a sandbox :meth:`_list_labelled` returned; one already gone is fine."""
        raise NotImplementedError

    @abc.abstractmethod
    async def _start(self) -> None:
        """Create the sandbox; return once it can run commands (``start`` runs the setup).

        When ``self.origin`` (a native :class:`~sandlot.sandboxes.snapshot.Snapshot` of this
        backend) is set, create it from ``origin.handle``: the set-up is in its files.

        Raise a ``SandboxError`` with ``retryable=True`` for a failure another attempt may fix:
        ``start`` then calls ``_close`` and ``_start`` again after a backoff.
        """

    @abc.abstractmethod
    async def _close(self) -> None:
        """Destroy the sandbox (also a half-created one). May raise; ``close`` logs it."""

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``run.command`` as :class:`RunRequest` describes.

        Returns:
            The ``RunOutput``, each stream capped at the backend's ``max_output_bytes``.

        Raises:
            SandboxDeadError: the sandbox died (see ``Sandbox._dead_or``).
            SandboxError: a fault of the platform.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no _run")

    async def _probe(self) -> str | None:
        """Why the sandbox can no longer run commands (``"was removed"``, ...), or ``None`` when
        it can or when that cannot be told. Never raises; one call, no retries."""
        raise NotImplementedError(f"{type(self).__name__} implements no _probe")

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to the file ``path``, creating its parents.

        Raises:
            SandboxFileError: not writable (a directory, read-only), naming ``path``.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no _put_bytes")

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """The bytes of the file ``path``, symlinks followed; reading may stop one byte after
        ``max_bytes`` (the caller reports the excess).

        Raises:
            SandboxFileError: missing, a directory or unreadable, naming ``path``.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no _get_bytes")

    async def _snapshot(self) -> str:
        """Freeze the sandbox's filesystem (not its processes), as it is between commands, into
        something ``_start`` can create forks from; return its handle (a string). It carries the
        ``sandlot.run_id`` label (:func:`~sandlot.sandboxes.labels.sandbox_labels`).

        Raises:
            SandboxError: the platform failed or cannot freeze this sandbox.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no _snapshot")

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None:
        """Remove the snapshot ``handle`` (gone already is fine); ``options`` are those of the
        sandbox it was taken from. May raise; ``Snapshot.delete`` logs it."""
        raise NotImplementedError(f"{cls.__name__} implements no _delete_snapshot")

    async def _put_archive(self, parent: str, archive: IO[bytes], target: str) -> None:
        """Unpack the tar ``archive`` into the directory ``parent`` (created); ``target`` is the
        path it makes, for messages. Default: staged with ``_put_bytes``, unpacked by ``tar``.

        Raises:
            SandboxFileError: the destination is not writable.
        """
        staging = f"{self.staging_dir}/sandlot-upload-{uuid.uuid4().hex}.tar"
        await self._put_bytes(staging, archive.read())
        await self._run_checked("upload to", target, tar_extract_argv(staging, parent))

    async def _get_archive(self, path: str, caps: TreeCaps, consume: Reader[T]) -> T:
        """``consume`` (blocking; run in a worker thread) called on a tar of ``path`` (a link
        at ``path`` resolved first), cut at ``caps.max_archive_bytes``. Default: ``tar`` into a
        staging file fetched with ``_get_bytes``.

        Raises:
            SandboxFileError: ``path`` is missing, or holds a file above ``caps.max_file_bytes``.
        """
        staging = f"{self.staging_dir}/sandlot-download-{uuid.uuid4().hex}.tar"
        argv = tar_create_argv(path, staging, caps.max_archive_bytes, caps.max_file_bytes)
        try:
            await self._run_checked("download", path, argv)
            data = await self._get_bytes(staging, caps.max_archive_bytes)
        finally:
            await self._run_quick(["rm", "-f", "--", staging])
        return await anyio.to_thread.run_sync(consume, io.BytesIO(data))

    async def _run_checked(self, what: str, path: str, argv: list[str]) -> None:
        """Run ``argv``; a failure becomes ``SandboxFileError`` naming ``path``."""
        out = await self._run_quick(argv)
        if out.exit_code != 0:
            detail = clip_tail(out.stderr)
            if out.exit_code is None:
                detail = f"timed out after {FILE_TIMEOUT_S:g} s"
            raise SandboxFileError(f"{what} {path}: {detail or f'exit code {out.exit_code}'}")

    async def _run_quick(self, argv: list[str]) -> RunOutput:
        return await self._run(RunRequest(shlex.join(argv), "/", timeout=FILE_TIMEOUT_S))
