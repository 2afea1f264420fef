"""The backend-neutral ``Sandbox`` protocol.

A sandbox is opened from a :class:`SandboxSpec`, runs one-shot commands, moves files, and is
always cleaned up. ``async with`` runs ``start()`` and ``close()``; ``close()`` is idempotent,
never raises, and also runs when the surrounding task is cancelled.

``Sandbox`` owns the semantics every backend shares; a backend supplies only the transport
primitives of :mod:`sandlot.sandboxes.transport` (the split of httpx's client and transport).
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import tempfile
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Literal, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict

from sandlot.errors import (
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxSetupError,
    SandboxStartError,
)
from sandlot.result import ExecResult
from sandlot.runtimes.exec_session import ExecSession
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes import leaks
from sandlot.sandboxes.archive import (
    ARCHIVE_OVERHEAD_BYTES,
    DEFAULT_DOWNLOAD_MAX_BYTES,
    DEFAULT_DOWNLOAD_MAX_FILE_BYTES,
    DEFAULT_READ_MAX_BYTES,
    DownloadReport,
    build_archive,
    check_read_size,
    extract_archive,
)
from sandlot.sandboxes.capped import clip_tail
from sandlot.sandboxes.environment import EnvironmentRecipe, container_path
from sandlot.sandboxes.labels import run_id
from sandlot.sandboxes.scale.backoff import poll, retry
from sandlot.sandboxes.scale.starting import StartClock, StartLimits, starting_gate, starting_slot
from sandlot.sandboxes.snapshot import Snapshot
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import RunRequest, Transport, TreeCaps

log = logging.getLogger("sandlot.sandboxes")
T = TypeVar("T")

Command = str | Sequence[str]
"""A shell command line (run by ``bash -c``) or an argv list (quoted with ``shlex.join``)."""

_SETUP_TAIL_LINES = 40
_ENVIRONMENT_TIMEOUT_S = 1800.0
# Closing must finish even when the caller is being cancelled; this bounds how long it may take.
_CLOSE_BUDGET_S = 60.0
_CLOSE_ATTEMPTS = 8  # ~4 s of backoff in all
# Uploaded trees up to this size are archived in memory; larger ones spill to a temporary file.
_SPOOL_BYTES = 8 * 1024 * 1024

State = Literal["new", "started", "dead", "closed"]

_live: weakref.WeakSet[Sandbox] = weakref.WeakSet()


def live_sandboxes(backend: str | None = None) -> int:
    """How many sandboxes of this process (of ``backend`` only, when given) are started and
    not yet closed (dead ones count: they hold resources until closed)."""
    return sum(1 for sb in list(_live) if backend is None or sb.name == backend)


class NoOptions(BaseModel):
    """Options model of a backend that has none."""

    model_config = ConfigDict(extra="forbid")


def as_shell(cmd: Command) -> str:
    """Return ``cmd`` as one shell command line (argv lists are quoted with ``shlex.join``)."""
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


def output_tail(text: str, lines: int = _SETUP_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text`` (at most 8,000 characters)."""
    return clip_tail(text, lines=lines, chars=8000)


class Sandbox(Transport):
    """One isolated place to run commands. Subclasses implement one backend.

    Subclasses set ``name`` (the registry key) and ``Options`` (a pydantic model with
    ``extra="forbid"`` of backend-specific settings), and implement the transport primitives
    (:class:`~sandlot.sandboxes.transport.Transport`); this class does the rest.

    Args:
        spec: what to open.
        options: backend-specific options, an instance of the subclass's ``Options``.
    """

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    on_host: ClassVar[bool] = False
    """``True`` for backends whose commands run on this machine (``local``): the image
    ``"host"`` means this machine's root, and environment recipes become cached virtualenvs
    here. ``False`` for container backends: the image is the environment."""
    enforces_disk_mb: ClassVar[bool] = False
    """Whether the backend keeps ``spec.disk_mb``; ``start`` refuses a budget it cannot keep."""
    network_modes: ClassVar[tuple[bool | str, ...]] = (False, True)
    """The values of ``spec.network`` the backend enforces; ``start`` refuses the others (a
    backend that cannot keep ``"internet"`` away from the host must not run it as ``True``)."""
    reaper: ClassVar[str | None] = None
    """``"module:Class"`` of the backend's own :class:`~sandlot.sandboxes.reaper.Reaper`,
    imported only by ``sandlot gc``; ``None``: gc lists and kills through the transport's
    ``_list_labelled``/``_kill_listed`` where the backend implements them."""

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        spec = spec or SandboxSpec()
        recipe = spec.environment
        if recipe is not None and recipe.has_packages and not self.on_host:
            spec = spec.model_copy(update={"env": {**spec.env, "PATH": container_path(spec.env)}})
        self.spec = spec
        self.options = options if options is not None else self.Options()
        if not isinstance(self.options, self.Options):
            raise TypeError(
                f"{type(self).__name__} takes options of type {self.Options.__name__}, "
                f"got {type(self.options).__name__}"
            )
        self.id = f"sandlot-{uuid.uuid4().hex[:12]}"
        self._state: Literal["new", "started", "closed"] = "new"
        self._dead: str | None = None
        self._sessions: dict[str, BashSession] = {}
        self.origin: Snapshot[Sandbox] | None = None
        """The native snapshot this sandbox is a fork of (``sandlot.open(snapshot=)``)."""
        self._holds_origin = False

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Create the sandbox, provide ``spec.environment``, run ``spec.post_setup_cmd``.

        Creation holds a STARTING slot (see :mod:`sandlot.sandboxes.scale.starting`) until the
        backend can run commands; a retryable failure is cleaned up and retried with backoff within
        the start budget. After the slot is released: the environment recipe's packages are
        provided (:meth:`_install_environment`), its repository steps (``pre_install``,
        ``install``) run in ``workdir``, then ``post_setup_cmd``; a fork of a native snapshot
        (``origin``) skips them all, its files hold their result. On any failure, including
        cancellation, the partly created sandbox is closed before the error propagates.

        Raises:
            SandboxStartError: the backend could not create the sandbox (also when the start
                budget ran out; ``retryable`` then says whether a later start may succeed), the
                image ``"host"`` was given to a container backend, or ``spec.network`` /
                ``spec.disk_mb`` ask for what the backend cannot enforce (``network_modes``,
                ``enforces_disk_mb``).
            SandboxSetupError: an environment step or ``post_setup_cmd`` failed; carries the
                command and its output tail.
            EnvironmentBuildError: (``local``) the recipe's environment could not be built.
            BackendUnavailableError: the backend cannot run on this machine.
        """
        if self._state == "closed":
            raise SandboxDeadError(f"sandbox {self.id} was closed; open a new one")
        if self._state == "started":
            return
        if self.spec.image == "host" and not self.on_host:
            raise SandboxStartError(
                f"image 'host' means this machine's root, which only the local backend runs; "
                f"give the {self.name} backend a container image (e.g. `--image python:3.12` "
                "for `sandlot eval`, or the row's `image`, which may map backends to images: "
                '{"local": "host", "docker": "python:3.12"})',
                retryable=False,
            )
        # Before any backend labels anything: one run id for every backend, recorded in the run
        # log for `sandlot gc --run-id` (every backend, local included, can leave things behind).
        run_id()
        try:
            if self.spec.network not in self.network_modes:
                raise SandboxStartError(
                    f"the {self.name} backend cannot enforce network={self.spec.network!r} "
                    "(outbound only: no host, no private address ranges); use network=True, which "
                    "also reaches the host, or network=False",
                    retryable=False,
                )
            if self.spec.disk_mb is not None and not self.enforces_disk_mb:
                raise SandboxStartError(
                    f"the {self.name} backend cannot enforce disk_mb={self.spec.disk_mb}; "
                    "leave disk_mb unset (None) for it",
                    retryable=False,
                )
            if self.origin is not None:
                self.origin._acquire(self.id)
                self._holds_origin = True
            await self._start_limited(self.spec.start_limits or StartLimits.from_env())
            self._state = "started"
            _live.add(self)
            if self.origin is None:  # a fork's files hold the set-up's result
                await self._set_up()
        except BaseException:
            await self.close()
            raise
        log.debug("sandbox %s (%s) started", self.id, self.name)

    async def _set_up(self) -> None:
        """The environment recipe (packages, install steps), then ``post_setup_cmd``."""
        recipe = self.spec.environment
        if recipe is not None:
            if recipe.has_packages:
                await self._install_environment(recipe)
            for step in recipe.repo_steps:
                await self._setup_step(step, self.spec.post_setup_timeout_s, "install")
        if self.spec.post_setup_cmd:
            await self._post_setup(self.spec.post_setup_cmd)

    async def _start_limited(self, limits: StartLimits) -> None:
        clock = StartClock(limits.budget_s)
        for attempt in range(1, limits.max_attempts + 1):
            failure: SandboxError | None = None
            async with starting_slot(self, limits):
                with anyio.move_on_after(clock.remaining()) as scope:
                    try:
                        await self._start()
                        return
                    except SandboxError as exc:
                        if not exc.retryable:
                            raise
                        failure = exc
                if scope.cancelled_caught:
                    failure = SandboxStartError(
                        f"sandbox {self.id} ({self.name}) did not start within its start budget "
                        f"of {limits.budget_s:g} s (attempt {attempt}/{limits.max_attempts}); "
                        "raise SANDLOT_START_BUDGET_S or lower SANDLOT_MAX_STARTING",
                        retryable=True,
                    )
            assert failure is not None
            await self._discard_attempt()
            pause = limits.backoff(attempt)
            if attempt == limits.max_attempts or pause >= clock.remaining():
                raise failure
            starting_gate().stats.retries += 1
            log.warning(
                "sandbox %s (%s): start attempt %d/%d failed, retrying in %.2f s: %s",
                self.id,
                self.name,
                attempt,
                limits.max_attempts,
                pause,
                failure,
            )
            await anyio.sleep(pause)

    async def _discard_attempt(self) -> None:
        """Destroy what a failed start attempt created, so that ``_start`` can run again."""
        await self._destroy("cleaning up a failed start of")
        self._dead = None

    async def _destroy(self, what: str, deadline: float | None = None) -> None:
        """``_close``, tried again with backoff (50 ms doubling, at most 1 s) while it raises a
        retryable ``SandboxError`` (destroying is what stops the bill, and control planes
        throttle exactly when many sandboxes close at once), shielded, until ``deadline``
        (``anyio.current_time()`` seconds; default: the close budget, 60 s, from now). A
        destroy that fails for good or runs out of time is reported
        (:func:`sandlot.sandboxes.leaks.report`: log, counter, the run's leak list)."""
        if deadline is None:
            deadline = anyio.current_time() + _CLOSE_BUDGET_S
        failure = f"{what} it did not finish within the close budget of {_CLOSE_BUDGET_S:g} s"

        def again(exc: BaseException) -> bool:
            retryable = isinstance(exc, SandboxError) and exc.retryable
            if retryable:
                log.warning("%s sandbox %s failed, retrying: %s", what, self.id, exc)
            return retryable

        with anyio.CancelScope(shield=True):
            with anyio.CancelScope(deadline=deadline):
                try:
                    await retry(
                        self._close,
                        attempts=_CLOSE_ATTEMPTS,
                        first_s=0.05,
                        max_s=1.0,
                        retry_on=again,
                    )
                    return
                except Exception as exc:
                    failure = f"{what} it failed: {type(exc).__name__}: {exc}"
            await leaks.report(
                leaks.Leak(
                    backend=self.name,
                    run_id=run_id(),
                    sandbox_id=self.id,
                    backend_id=self.backend_id,
                    error=failure,
                    options=leaks.locator_options(self.name, self.options),
                )
            )

    async def _post_setup(self, cmd: str) -> None:
        await self._setup_step(cmd, self.spec.post_setup_timeout_s, "post_setup_cmd")

    async def _setup_step(self, cmd: str, timeout: float, step: str) -> None:
        r = await self.exec(cmd, timeout=timeout)
        if not r.ok:
            combined = r.stdout + ("\n" if r.stdout and r.stderr else "") + r.stderr
            raise SandboxSetupError(cmd, r.exit_code, output_tail(combined), step=step)

    @classmethod
    async def build_environment(cls, recipe: EnvironmentRecipe) -> None:
        """Prepare ``recipe`` ahead of the sandboxes that use it (to build it once, up front,
        with progress shown). The default does nothing: container backends install a recipe
        in each sandbox; ``local`` builds its cached virtual environment.

        Raises:
            EnvironmentBuildError: the environment cannot be built.
        """
        return None

    async def _install_environment(self, recipe: EnvironmentRecipe) -> None:
        """Backend hook: make the recipe's interpreter and packages available to commands.

        The default, for container backends, runs
        :meth:`~sandlot.sandboxes.environment.EnvironmentRecipe.container_script` in the
        sandbox (a virtual environment at ``/opt/sandlot-env``; ``PATH`` was set for it at
        construction) with the sandbox's own network. A backend that can give the install a
        network the agent does not get overrides this (``docker``, ``local``; ``modal`` builds
        it into the image).

        Raises:
            SandboxSetupError: the script failed (its output tail names the package).
        """
        await self._setup_step(
            recipe.container_script(), _ENVIRONMENT_TIMEOUT_S, "environment install"
        )

    async def close(self) -> None:
        """Release everything the sandbox holds. Idempotent; never raises; survives cancellation.

        Sessions and the destroy share a budget of 60 s; a destroy that fails for good or runs
        out of it is logged with the ``sandlot gc`` command that removes the sandbox, counted
        (:func:`~sandlot.sandboxes.leaks.leaked_sandboxes`) and added to the run's leak list
        (:mod:`sandlot.sandboxes.leaks`), never silent.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        _live.discard(self)
        deadline = anyio.current_time() + _CLOSE_BUDGET_S
        with anyio.CancelScope(shield=True):
            with anyio.CancelScope(deadline=deadline):
                for session in self._sessions.values():
                    await session.close()
            await self._destroy("closing", deadline)
            if self.origin is not None and self._holds_origin:
                self._holds_origin = False
                await self.origin._release()
        log.debug("sandbox %s (%s) closed", self.id, self.name)

    async def snapshot(self) -> Snapshot[Sandbox]:
        """Freeze this sandbox's files (not its processes) for forks:
        ``sandlot.open(snapshot=snap)`` or :func:`sandlot.open_group` start from them without
        running the set-up again, many times and concurrently. Take it between commands (a
        command still writing may be caught half-way). Delete it with ``await snap.delete()``
        (safe while forks run); it carries the run's ``sandlot.run_id`` label for ``sandlot
        gc``. On a backend whose ``supports_snapshot`` is ``False`` the snapshot is a fallback
        (``native`` is ``False``, nothing is frozen): its forks run the spec's set-up again.

        Returns:
            A :class:`~sandlot.sandboxes.snapshot.Snapshot` (``local``: a directory under the
            sandboxes' root, copied with ``cp --reflink=auto``; ``docker``: a committed image).

        Raises:
            SandboxDeadError: the sandbox is closed or died.
            SandboxError: the backend could not freeze it.
        """
        self._check_usable()
        spec = self.origin.spec if self.origin is not None else self.spec
        if not self.supports_snapshot:
            return Snapshot(type(self), spec, self.options)
        handle = await self._snapshot()
        log.debug("sandbox %s (%s): snapshot %s", self.id, self.name, handle)
        return Snapshot(type(self), spec, self.options, handle)

    @property
    def closed(self) -> bool:
        """``True`` once ``close()`` has been called."""
        return self._state == "closed"

    @property
    def state(self) -> State:
        """``"new"``, ``"started"``, ``"dead"`` (started, then found unable to run commands;
        :meth:`dead_reason` says why) or ``"closed"``."""
        if self._state == "started" and self._dead is not None:
            return "dead"
        return self._state

    @property
    def dead_reason(self) -> str | None:
        """Why the sandbox is dead (``state == "dead"``), else ``None``."""
        return self._dead if self._state == "started" else None

    def _mark_dead(self, reason: str) -> SandboxDeadError:
        """Record (the first) ``reason`` the sandbox died; the error every later call raises."""
        if self._dead is None:
            self._dead = reason
        return SandboxDeadError(f"sandbox {self.id}: {self._dead}")

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check_usable(self) -> None:
        """The one guard: raise ``SandboxDeadError`` unless the sandbox is started and alive."""
        if self._state == "closed":
            raise SandboxDeadError(f"sandbox {self.id} is closed")
        if self._state == "new":
            raise SandboxDeadError(f"sandbox {self.id} is not started; use `async with` or start()")
        if self._dead is not None:
            raise self._mark_dead(self._dead)

    async def _gone(self) -> SandboxDeadError | None:
        """After a failure of the platform: ``SandboxDeadError`` when one liveness probe (or an
        earlier one) found the sandbox dead, else ``None`` (alive, or cannot tell)."""
        if self._dead is None:
            reason = await self._probe()
            if reason is None:
                return None
            self._dead = reason
        return self._mark_dead(self._dead)

    async def _find_created(self) -> str | None:
        """One look for the sandbox that a create whose answer was lost made (by its labels or
        name): its platform id, else ``None``. Raise ``SandboxError`` when the look failed."""
        raise NotImplementedError(f"{type(self).__name__} cannot look for a lost create")

    async def _find_lost_create(self, settle_s: float, more_s: float) -> str | None:
        """The platform id of the sandbox an unanswered create made, or ``None`` if it made
        none.

        The platform may act on a create after the client gave up on it, so
        :meth:`_find_created` is asked again and again (0.1 s, doubling up to 2 s) until it
        finds one, or until a look begun ``settle_s`` seconds after now finds none (the create
        never took effect). One create makes at most one sandbox: the first found ends it.

        Raises:
            SandboxError: no look succeeded for ``more_s`` seconds after ``settle_s``; the
                message says how ``sandlot gc`` removes the sandbox.
        """
        settled = time.monotonic() + settle_s
        problems: list[Exception] = []

        async def look() -> list[str] | None:
            began = time.monotonic()
            try:
                found = await self._find_created()
            except SandboxError as exc:
                problems.append(exc)
                return None
            return [found] if found else [] if began >= settled else None

        with anyio.move_on_after(settle_s + more_s):
            found = await poll(look, first_s=0.1, max_s=2.0)
            return found[0] if found else None
        raise SandboxError(
            f"sandbox {self.id}: a create went unanswered and its sandbox could not be looked "
            f"for ({problems[-1] if problems else 'no listing answered'}); "
            f"`sandlot gc --backend {self.name} --run-id <run id>` removes it"
        )

    async def _bounded(
        self,
        timeout: float | None,
        body: Callable[[], Awaitable[T]],
        stop: Callable[[], Awaitable[None]],
    ) -> T | None:
        """``await body()`` within ``timeout`` seconds; ``None`` when it ran out. Unless
        ``body`` finished, ``stop()`` (the process-tree kill) runs, shielded, before this
        returns or re-raises (timeout, cancellation, failure); not on a dead sandbox."""
        finished = False
        try:
            with anyio.move_on_after(timeout):
                result = await body()
                finished = True
                return result
        finally:
            if not finished and self._dead is None:
                with anyio.CancelScope(shield=True):
                    await stop()
        return None

    def resolve_path(self, path: str) -> str:
        """``path`` made absolute (relative paths start at ``spec.workdir``) and normalised."""
        return posixpath.normpath(posixpath.join(self.spec.workdir, path))

    # ----------------------------------------------------------------- commands

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run one command to completion with ``bash -c`` (``sh -c`` where there is no bash).

        Args:
            cmd: a shell command line, or an argv list (quoted for the shell).
            timeout: wall-clock limit in seconds (> 0); ``None`` for no limit. At the limit the
                command and every process it started are killed and the partial output is
                returned.
            cwd: working directory inside the sandbox; relative ones start at
                ``spec.workdir`` (the default). A missing one fails the command (exit status 1
                or 2 and a message on stderr).
            env: extra environment variables for this command only.
            stdin: bytes (or UTF-8 text) fed to the command's standard input.

        Returns:
            The ``ExecResult``; a non-zero exit or a timeout is a result, not an exception.
            Each of stdout and stderr keeps its first ``max_output_bytes`` bytes (a backend
            option); past them the rest is read and dropped, ``truncated`` is set and the
            stream ends with the note ``[sandlot: stdout truncated: kept the first N bytes,
            discarded the remaining M bytes]``. A command killed by signal N exits ``128 + N``.

        Raises:
            ValueError: ``timeout`` is zero, negative or NaN (before anything runs).
            SandboxDeadError: the sandbox is closed or died.
            SandboxError: an infrastructure fault of the backend.
        """
        # `not > 0` also catches NaN; 0 would stop the command as soon as it started.
        if timeout is not None and not timeout > 0:
            raise ValueError(
                "exec(timeout=...) must be a positive number of seconds, or None for no limit; "
                f"got {timeout!r}"
            )
        self._check_usable()
        began = time.monotonic()
        run = RunRequest(
            as_shell(cmd),
            cwd=self.resolve_path(cwd) if cwd is not None else self.spec.workdir,
            env=env or {},
            stdin=stdin.encode() if isinstance(stdin, str) else stdin,
            timeout=timeout,
        )
        out = await self._run(run)
        return out.result(time.monotonic() - began)

    async def is_alive(self) -> bool:
        """``True`` while the sandbox can run commands (one liveness probe). Never raises."""
        if self._state != "started":
            return False
        return await self._gone() is None

    async def shell(
        self, name: str = "default", *, config: SessionConfig | None = None
    ) -> BashSession:
        """The long-lived shell session ``name``, started on first use.

        ``cd``, ``export``, functions and background jobs persist between its commands (see
        :class:`sandlot.runtimes.BashSession`). The same name returns the same session until it
        is closed; then a new one is started. Closing the sandbox closes all its sessions.

        Args:
            name: which session; a sandbox may have several.
            config: settings of a new session (ignored when ``name`` is already open);
                ``None`` for the defaults.

        Raises:
            SandboxDeadError: the sandbox is closed or not started.
        """
        self._check_usable()
        session = self._sessions.get(name)
        if session is None or session.closed:
            session = await self._open_shell(name, config or SessionConfig())
            self._sessions[name] = session
        return session

    async def _open_shell(self, name: str, config: SessionConfig) -> BashSession:
        """Backend hook: create the session object (its shell may start lazily).

        The default is the generic :class:`~sandlot.runtimes.exec_session.ExecSession`, one
        ``exec`` per command with working directory and exported variables carried over;
        backends with a streaming channel return a
        :class:`~sandlot.runtimes.channel_session.ChannelSession`.
        """
        return ExecSession(name, config, self, self.spec.workdir)

    # ----------------------------------------------------------------- files

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_MAX_BYTES) -> bytes:
        """Return the exact bytes of the file at ``path`` inside the sandbox.

        Args:
            path: the file; relative paths start at ``spec.workdir``. Symlinks are followed
                inside the sandbox.
            max_bytes: cap in bytes (default 64 MiB): a larger file is an error, not a read
                that exhausts the caller's memory (a 1 GiB sparse file is 4 KB on disk).

        Raises:
            DownloadLimitError: (a ``SandboxFileError``) the file is larger than ``max_bytes``.
            SandboxFileError: the file does not exist or cannot be read.
            SandboxDeadError: the sandbox is closed or died.
        """
        self._check_usable()
        target = self.resolve_path(path)
        data = await self._get_bytes(target, max_bytes)
        check_read_size(target, len(data), max_bytes)
        return data

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` (text is UTF-8 encoded) to ``path``, creating parent directories.

        Raises:
            SandboxFileError: the path is not writable in the sandbox.
            SandboxDeadError: the sandbox is closed or died.
        """
        self._check_usable()
        target = self.resolve_path(path)
        if target == "/":
            raise SandboxFileError("cannot write to the root directory /")
        await self._put_bytes(target, data.encode() if isinstance(data, str) else data)

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        """Copy a host file or directory tree to ``remote_path`` inside the sandbox.

        A directory is copied recursively so that ``remote_path`` becomes that directory; an
        existing directory there is merged into. Modes and symlinks are kept; owners become
        the sandbox's user. The tree travels as one tar archive
        (:func:`sandlot.sandboxes.archive.build_archive`).

        Raises:
            FileNotFoundError: ``local_path`` does not exist.
            SandboxFileError: the destination is not writable.
            SandboxDeadError: the sandbox is closed or died.
        """
        self._check_usable()
        target = self.resolve_path(remote_path)
        if target == "/":
            raise SandboxFileError("cannot upload onto the root directory /")
        parent, name = posixpath.split(target)
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
            await anyio.to_thread.run_sync(build_archive, Path(local_path), name, spool)
            spool.seek(0)
            await self._put_archive(parent, spool, target)

    async def download(
        self,
        remote_path: str,
        local_path: str | Path,
        *,
        max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES,
        max_file_bytes: int = DEFAULT_DOWNLOAD_MAX_FILE_BYTES,
    ) -> DownloadReport:
        """Copy a file or directory tree from the sandbox so that it becomes ``local_path``.

        The same on every backend (see :mod:`sandlot.sandboxes.archive`): a symlink at
        ``remote_path`` itself is resolved inside the sandbox; inside the tree, relative links
        that stay inside it are kept as links, other links (absolute, or climbing out) and
        special files are skipped and listed in the report; nothing is ever written through a
        symlink on the host, and an existing link at a member's place is replaced. Modes are
        kept (no setuid/setgid), files belong to the calling user.

        Args:
            remote_path: file or directory in the sandbox (relative: to ``spec.workdir``).
            local_path: host path that becomes it; missing parents are created.
            max_bytes: cap in bytes on all file contents (default 1 GiB).
            max_file_bytes: cap in bytes on one file (default 256 MiB).

        Returns:
            A :class:`~sandlot.sandboxes.archive.DownloadReport` (files, bytes, skipped).

        Raises:
            DownloadLimitError: a file or the tree is above its cap; checked from the sizes
                the sandbox announces before a file is written (files before it stay).
            UnsafeArchiveError: the sandbox sent a member that would land outside.
            SandboxFileError: ``remote_path`` does not exist in the sandbox.
            SandboxDeadError: the sandbox is closed or died.
        """
        self._check_usable()
        dest = Path(local_path)
        return await self._get_archive(
            self.resolve_path(remote_path),
            TreeCaps(max_bytes + ARCHIVE_OVERHEAD_BYTES + 1, max_file_bytes),
            lambda raw: extract_archive(
                raw, dest, max_bytes=max_bytes, max_file_bytes=max_file_bytes
            ),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} image={self.spec.image!r} {self.state}>"
