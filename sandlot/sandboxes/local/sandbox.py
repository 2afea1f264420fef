"""``LocalSandbox``: the embedded backend; one bubblewrap jail per sandbox, no daemon (a
zygote per jail shape forks them, see :mod:`sandlot.sandboxes.local.zygote`)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import posixpath
import shutil
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, ClassVar, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import (
    BackendUnavailableError,
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxStartError,
)
from sandlot.images import ImageRoot, is_image_reference, open_image
from sandlot.runtimes.channel_session import ChannelSession
from sandlot.runtimes.session import BashSession, SessionConfig
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.capped import clip_tail
from sandlot.sandboxes.environment import EnvironmentRecipe, container_path
from sandlot.sandboxes.labels import sandbox_labels
from sandlot.sandboxes.local.cgroup import Cgroup, create_cgroups
from sandlot.sandboxes.local.freeze import SNAPSHOT_PREFIX, UPPER, WORK, freeze, thaw
from sandlot.sandboxes.local.hostdirs import (
    HostDirs,
    copy_tree,
    foreign_dir,
    remove_tree,
    sandboxes_dir,
)
from sandlot.sandboxes.local.init_client import InitProcess, SpawnFailed
from sandlot.sandboxes.local.interpreter import (
    init_interpreter,
    interpreter_prefixes,
    venv_base_prefix,
)
from sandlot.sandboxes.local.jail import (
    DEFAULT_PATH,
    JAIL_HOME,
    JAIL_OVERLAY,
    JailConfig,
    _covered_top_level,
    check_workdir,
    jail_argv,
    keyring_filter,
    overlay_dirs,
)
from sandlot.sandboxes.local.limits import Limits, init_limits
from sandlot.sandboxes.local.local_channel import LocalChannel
from sandlot.sandboxes.local.options import MIB, LocalOptions, home_paths
from sandlot.sandboxes.local.peer import InitDied
from sandlot.sandboxes.local.process import Completed, run_command
from sandlot.sandboxes.local.runtime_files import (
    HOSTNAME_FILE,
    etc_mode,
    sandbox_hostname,
    write_runtime_files,
)
from sandlot.sandboxes.local.venv import OVERLAY_ENV, BuiltEnvironment, ensure_environment
from sandlot.sandboxes.local.zygote_client import (
    Zygote,
    acquire,
    fork_init,
    image_request,
    release,
)
from sandlot.sandboxes.spec import SandboxSpec, image_workdir
from sandlot.sandboxes.transport import FILE_TIMEOUT_S, Reader, RunOutput, RunRequest, TreeCaps

log = logging.getLogger("sandlot.sandboxes.local")
T = TypeVar("T")


_WRITE_SCRIPT = 'mkdir -p -- "$1" && cat >"$2"'
_UNTAR_SCRIPT = 'mkdir -p -- "$1" && exec tar -x -f - --no-same-owner -C "$1"'
# $1 = path, $2 = archive byte cap, $3 = file byte cap: a link at the path itself is resolved in
# the jail (as docker does), a file above the file cap stops the download before any transfer,
# and the archive is cut at its cap so a sparse file never fills the host's disk while staged.
_TAR_SCRIPT = """
t=$(readlink -f -- "$1") && [ -e "$t" ] || { echo "no such file or directory: $1" >&2; exit 2; }
big=$(find "$t" -type f -size +"$3"c -print -quit)
[ -z "$big" ] || { echo "$big is larger than max_file_bytes=$3" >&2; exit 3; }
cd -- "$(dirname -- "$t")" || exit
tar -c -f - -- "$(basename -- "$t")" | head -c "$2"
s=("${PIPESTATUS[@]}")
[ "${s[0]}" = 0 ] || [ "${s[0]}" = 141 ] || exit "${s[0]}"
exit "${s[1]}"
"""


@functools.lru_cache(maxsize=8)
def _found(name: str, path: str | None) -> str:
    found = shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(name)
    return found


def _which(name: str, path: str | None) -> str | None:
    """``shutil.which``, remembered per ``PATH`` once found (a dozen stats each start)."""
    try:
        return _found(name, path)
    except FileNotFoundError:
        return None


def _bwrap_missing(path: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"the local backend needs bubblewrap, but {path!r} was not found. Install it with "
        f"`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` "
        f"(Fedora/RHEL), or point `bwrap_path` at it. To run commands directly on this host "
        f'with NO isolation at all, open the sandbox with isolation="none".'
    )


class LocalSandbox(Sandbox):
    """A sandbox on this machine: one bubblewrap jail, created by ``start()``, runs everything.

    The jail (see :mod:`sandlot.sandboxes.local.jail`) shows the image read-only: for
    ``image="host"`` only the host's system directories by default (``host_view``), or a
    root filesystem directory. It gives the sandbox private writable ``spec.workdir``, ``/tmp``
    and ``$HOME`` (``/sandlot/home``), all kept in one host directory per sandbox that
    ``close()`` deletes. The network is off unless ``spec.network``. Commands run as the
    calling user with every capability dropped and a minimal environment (``PATH``, ``HOME``,
    ``LANG``, ``TERM``, ``PAGER``, ``GIT_PAGER``, ``SANDLOT_WORKDIR``,
    ``LocalOptions.inherit_env``, ``spec.env``, then the command's ``env``, plus
    ``SANDLOT_EXEC_ID``); nothing else of the host environment gets in.

    PID 1 of the jail is the sandbox's init (:mod:`sandlot.sandboxes.local.init`, run by the
    host's Python, or the image's ``python3`` for a root filesystem directory). ``exec``, the
    file methods and shell sessions all ask it to spawn their process, so they share the jail's
    processes as ``docker exec`` does: a background process started by one ``exec`` lives on
    (and is visible to later commands) until ``close()``. Working directory and exported
    variables do not carry over between ``exec`` calls; use ``shell()`` for that. A timeout
    kills the command's process tree (its session, descendants, and processes still carrying
    its ``SANDLOT_EXEC_ID``), not the jail. ``close()`` kills the jail, and with it every
    process in it. If the init dies, the sandbox is dead (``SandboxDeadError``).

    For ``image="host"`` or a container image, without ``disk_mb``, the jail is forked by a
    zygote (:mod:`sandlot.sandboxes.local.zygote`, ``LocalOptions.zygote``): a process per
    jail shape and thread, itself jailed, that already paid for bwrap and the interpreter; the
    sandbox gets the same mounts and namespaces as from its own bwrap, in about a tenth of
    the time (for an image, the zygote's child mounts the image's overlay and pivots into it;
    the init then runs on this machine's interpreter, loaded before the pivot, rather than the
    image's ``python3``). A zygote that dies takes its sandboxes with it (they raise
    ``SandboxDeadError``) and is replaced on the next ``open``.

    A container image's sandbox gets what a container engine gives a container
    (:mod:`sandlot.sandboxes.local.runtime_files`): a hostname of its own, ``/etc/hosts``,
    ``/etc/hostname`` and, with the network, ``/etc/resolv.conf``; and the image's ``Env``,
    ``User`` and, when ``spec.workdir`` is left unset, ``WorkingDir``.

    Limits (``LocalOptions``, ``spec.memory_mb``), set by the init in each command's process:
    ``RLIMIT_FSIZE`` (``max_file_size_mb``; exceeding it kills the writer with SIGXFSZ, exit
    153), ``RLIMIT_CPU`` (``cpu_time_s``; SIGXCPU, exit 152, and SIGKILL one second later),
    ``RLIMIT_AS`` (``memory_mb``: virtual address space per process, not total memory;
    runtimes that reserve large address ranges such as the JVM or Go need headroom) and
    ``RLIMIT_NPROC`` (``max_processes``), soft and hard so commands cannot raise them. The
    kernel does not enforce ``RLIMIT_NPROC`` for real root; for a caller who is not root,
    every sandbox is a user namespace of its own, in which (Linux 5.14 and later) it counts
    the sandbox's processes (older kernels count all the caller's processes on the host). The
    process cap that holds also for root is the sandbox's pids cgroup (``pids.max =
    max_processes``), which the init joins first, created when the host has a writable pids
    cgroup (``pids_cgroup``). ``spec.cpu`` becomes a CFS quota of that many cores on the
    sandbox's cpu cgroup when the host gives us a writable one (otherwise it is not enforced,
    which a warning says once per process). ``spec.disk_mb`` makes the sandbox's host
    directory (workdir, ``/tmp``, ``$HOME``, pip overlay) a tmpfs of that size, which needs
    root or CAP_SYS_ADMIN (the start fails otherwise); without it, disk use is bounded only
    per file (``max_file_size_mb``).
    ``spec.timeout_s`` is the sandbox's lifetime: commands are cut at it and the sandbox then
    raises ``SandboxDeadError``. A caller killed with ``kill -9`` leaves the sandbox's
    directory and cgroups (the jail dies with it): ``sandlot gc --backend local`` removes them
    (:mod:`sandlot.sandboxes.local.reaper`).

    What the jail does not stop: reading what of the visible image the calling user may read;
    with ``spec.network`` on, everything the host network reaches, including services on the
    host's loopback; creating user namespaces (more kernel attack surface).

    ``isolation="none"`` runs the init, and so every command, directly on the host: no jail,
    no namespaces, the host network. The workdir is the sandbox's host directory
    (``$SANDLOT_WORKDIR``); paths given to ``cwd``, the file methods, ``upload`` and
    ``download`` that lie under ``spec.workdir`` are mapped to it, but a command itself must
    use relative paths or ``$SANDLOT_WORKDIR``. ``/tmp`` is the host's (``$TMPDIR`` points at
    a private one). ``close()`` kills the init's descendants and every process still carrying
    one of the sandbox's ``SANDLOT_EXEC_ID`` values, and everything in its pids cgroup;
    a process outside all three outlives the sandbox.

    Args:
        spec: what to open (``image``, ``workdir``, ``env``, ``network``, ``memory_mb``, ...).
        options: a :class:`LocalOptions`.
    """

    name: ClassVar[str] = "local"
    reaper: ClassVar[str | None] = "sandlot.sandboxes.local.reaper:LocalReaper"
    Options: ClassVar[type[BaseModel]] = LocalOptions
    on_host: ClassVar[bool] = True
    enforces_disk_mb: ClassVar[bool] = True  # a size-limited tmpfs (needs root, see _start)
    supports_snapshot: ClassVar[bool] = True  # a copy of its directories (local/freeze.py)
    options: LocalOptions

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._dirs: HostDirs | None = None
        self._cgroups: list[Cgroup] = []
        self._jail_config: JailConfig | None = None
        self._image: ImageRoot | None = None  # a container image's layers (sandlot.images)
        self._init: InitProcess | None = None
        self._zygote: tuple[JailConfig, Zygote] | None = None
        self._venv: BuiltEnvironment | None = None
        self._env: dict[str, str] = {}
        self._limits = ""
        self._deadline = math.inf

    # ----------------------------------------------------------------- properties

    @property
    def isolated(self) -> bool:
        """``True`` when commands run in a bubblewrap jail (``isolation="bwrap"``)."""
        return self.options.isolation == "bwrap"

    @property
    def host_dir(self) -> Path | None:
        """The sandbox's directory on the host (``None`` before ``start()``)."""
        return self._dirs.root if self._dirs else None

    @property
    def host_workdir(self) -> Path | None:
        """The host directory behind ``spec.workdir`` (``None`` before ``start()``)."""
        return self._dirs.work if self._dirs else None

    @property
    def pids_cgroup(self) -> Path | None:
        """Directory of the sandbox's pids cgroup, or ``None`` when the host has none for us."""
        return next((c.path for c in self._cgroups if (c.path / "pids.max").exists()), None)

    @property
    def cgroups(self) -> list[Path]:
        """Directories of the sandbox's cgroups (pids, and cpu with ``spec.cpu``)."""
        return [c.path for c in self._cgroups]

    @property
    def init_pid(self) -> int | None:
        """Host pid of the jail's ``bwrap``, or of the init when a zygote forked it or without
        a jail, while it runs."""
        return self._init.process.pid if self._init else None

    # ----------------------------------------------------------------- lifecycle

    def _rootfs(self) -> Path:
        image = self.spec.image
        if image == "host":
            return Path("/")
        if self._image is not None:  # its overlay's mount point, in the jail's namespace only
            return sandboxes_dir(self.options.root_dir) / self.id / "rootfs"
        rootfs = Path(image).absolute()
        if not self.isolated:
            raise SandboxStartError('isolation="none" runs on the host only; use image="host"')
        if not rootfs.is_dir():
            raise SandboxStartError(
                f"the local backend runs image='host', a root filesystem directory or a "
                f"container image reference; {image!r} is not a directory"
            )
        return rootfs

    def _find_bwrap(self) -> str:
        found = _which(self.options.bwrap_path, os.environ.get("PATH"))
        if found is None:
            raise _bwrap_missing(self.options.bwrap_path)
        return found

    async def _start(self) -> None:
        spec, opts = self.spec, self.options
        if self.isolated and is_image_reference(spec.image):
            self._image = await anyio.to_thread.run_sync(open_image, spec.image)
            if self.origin is not None and self.origin.handle is not None:
                # A fork: the snapshot's writable layer, read-only, above the image's.
                layers = (Path(self.origin.handle) / UPPER, *self._image.layers)
                self._image = dataclasses.replace(self._image, layers=layers)
            self._adopt_working_dir()
            spec = self.spec
        rootfs = self._rootfs()
        bwrap = self._find_bwrap() if self.isolated else ""
        problem = check_workdir(spec.workdir, rootfs, opts.host_view)
        if problem:
            raise SandboxStartError(problem)
        python = init_interpreter(rootfs, self._image)
        parent = sandboxes_dir(opts.root_dir)
        try:
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxStartError(f"cannot create the sandboxes' directory: {exc}") from exc
        if problem := foreign_dir(parent):
            raise SandboxStartError(problem)
        try:
            dirs = HostDirs(parent / self.id)
            dirs.create(spec.disk_mb)
        except OSError as exc:
            raise SandboxStartError(f"cannot create the sandbox directory: {exc}") from exc
        self._dirs = dirs
        try:
            dirs.write_labels(sandbox_labels(self.id, spec.labels))
        except OSError as exc:
            raise SandboxStartError(f"cannot write the sandbox's labels: {exc}") from exc
        source = rootfs / spec.workdir.lstrip("/")
        frozen = self.origin.handle if self.origin is not None else None
        if frozen is not None:
            stack_work = self.isolated and self._image is None
            await anyio.to_thread.run_sync(
                functools.partial(thaw, Path(frozen), dirs, stack_work=stack_work)
            )
        elif rootfs != Path("/") and self._image is None and source.is_dir():
            await anyio.to_thread.run_sync(copy_tree, source, dirs.work)
        self._cgroups = create_cgroups(
            self.id, opts.max_processes if opts.pids_cgroup else None, spec.cpu
        )
        self._limits = init_limits(
            Limits(
                max_processes=opts.max_processes,
                max_file_size_bytes=opts.max_file_size_mb * MIB,
                cpu_time_s=opts.cpu_time_s,
                memory_bytes=spec.memory_mb * MIB if spec.memory_mb else None,
            )
        )
        self._env = self._base_env(rootfs, dirs)
        if self.isolated:
            self._jail_config = JailConfig(
                bwrap=bwrap,
                rootfs=rootfs,
                workdir=spec.workdir,
                network=spec.network is True,  # "internet" is refused by start()
                hidden=tuple(home_paths(opts.hidden_paths)),
                sandboxes_dir=parent,
                host_view=opts.host_view,
                readonly=interpreter_prefixes() if rootfs == Path("/") else (),
                layers=self._image.layers if self._image else (),
                user=self._image.user_ids() if self._image else None,
                work_layers=(Path(frozen) / WORK,) if frozen and not self._image else (),
                hostname=sandbox_hostname(self.id) if self._image else None,
            )
            if self._image is not None:
                try:
                    (dirs.root / HOSTNAME_FILE).write_text(f"{self._jail_config.hostname}\n")
                except OSError as exc:
                    raise SandboxStartError(f"cannot write the sandbox's hostname: {exc}") from exc
        else:
            log.warning(
                "sandbox %s uses isolation='none': its commands run directly on this host as "
                "uid %d with full access to its files, processes and network. NOTHING IS "
                "ISOLATED; use it only for trusted commands.",
                self.id,
                os.getuid(),
            )
        await self._start_init(python)
        self._deadline = time.monotonic() + spec.timeout_s
        recipe = spec.environment
        if self.origin is not None and recipe is not None and recipe.has_packages:
            await self._install_environment(recipe, fork=True)

    async def _snapshot(self) -> str:
        """Copy the sandbox's writable directories to a new ``sandlot-snap-<hex>`` directory
        beside it (:mod:`sandlot.sandboxes.local.freeze`); its path is the handle.

        Raises:
            SandboxError: a copy failed, or this is a fork in a jail (its files are the
                snapshot's layer plus its own: snapshot the group's first sandbox).
        """
        assert self._dirs is not None
        if self.origin is not None and self.isolated:
            raise SandboxError(
                f"sandbox {self.id} is a fork in a jail on the local backend, whose files are "
                "layers that cannot be snapshotted again; snapshot the sandbox it was forked from",
                retryable=False,
            )
        name = SNAPSHOT_PREFIX + uuid.uuid4().hex[:12]
        dest = self._dirs.root.parent / name
        labels = sandbox_labels(name, self.spec.labels)
        await anyio.to_thread.run_sync(freeze, self._dirs, dest, labels)
        return str(dest)

    @classmethod
    async def _delete_snapshot(cls, handle: str, options: BaseModel) -> None:
        await anyio.to_thread.run_sync(remove_tree, Path(handle))

    async def _start_init(self, python: str) -> None:
        """Start the jail and its init: forked by a zygote when the jail's shape allows one,
        else spawned with the sandbox's own bwrap (see :class:`InitProcess`).

        Raises:
            SandboxStartError: bwrap or the init failed (``retryable``: e.g. the host's mount
                table changed while bwrap copied it).
        """
        assert self._dirs is not None
        config = self._jail_config
        if config is not None and self._image is not None:
            self._write_runtime_files(config)
        request = self._zygote_request(config) if config is not None else None
        if request is not None:
            # A zygote runs the code our interpreter compiled, also for an image (it pivots
            # into the image's root once the code is loaded).
            zygote = await acquire(request[0], init_interpreter(Path("/")))
            if zygote is not None:
                await self._fork_init(request[0], zygote, request[1])
                return
        try:
            jail = []
            if config is not None:
                jail = [*jail_argv(config, self._dirs), "--chdir", self.spec.workdir, "--"]
            self._init = await InitProcess.start(
                jail,
                python,
                our_python=self._rootfs() == Path("/"),  # see init_interpreter
                env=self._env,
                cwd=None if self.isolated else self._dirs.work,
                limits=self._limits,
                cgroup_procs=[str(c.procs_file) for c in self._cgroups],
                prefix=self.id,
                log_path=self._dirs.root / "init.log",
                seccomp=keyring_filter() if config is not None else None,
            )
        except InitDied as exc:
            raise SandboxStartError(
                f"the jail of sandbox {self.id} did not start: {exc}", retryable=True
            ) from exc
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise BackendUnavailableError(f"cannot start the sandbox: {exc}") from exc
            raise SandboxStartError(f"cannot start the sandbox: {exc}", retryable=True) from exc

    def _write_runtime_files(self, config: JailConfig) -> None:
        """``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` of a container image's
        jail, as ``config`` says (its network, its hostname), in the sandbox's writable layer
        (:mod:`sandlot.sandboxes.local.runtime_files`); written before each start of the jail,
        as the network may differ from the last one's.

        Raises:
            SandboxStartError: they cannot be written.
        """
        assert self._dirs is not None and self._image is not None and config.hostname
        mode = etc_mode(self._image)
        if mode is None:
            log.warning(
                "image %s: /etc is a link; sandbox %s gets no /etc/hosts, /etc/hostname or "
                "/etc/resolv.conf", self._image.reference, self.id,
            )  # fmt: skip
            return
        upper, _ = overlay_dirs(self._dirs)
        try:
            write_runtime_files(upper, config.hostname, config.network, mode)
        except OSError as exc:
            raise SandboxStartError(f"sandbox {self.id}: {exc}") from exc

    def _adopt_working_dir(self) -> None:
        """Make the image's ``WorkingDir`` the sandbox's workdir when the caller left
        ``spec.workdir`` unset (:func:`~sandlot.sandboxes.spec.image_workdir`); one that
        cannot be a workdir here leaves the default, with a warning."""
        assert self._image is not None
        wanted = image_workdir(self.spec, self._image.config.working_dir)
        if wanted is None:
            return
        problem = check_workdir(wanted, self._rootfs(), self.options.host_view)
        if problem:
            log.warning(
                "image %s: WorkingDir %r cannot be the workdir (%s); using %s",
                self._image.reference, wanted, problem, self.spec.workdir,
            )  # fmt: skip
            return
        self.spec = self.spec.model_copy(update={"workdir": wanted})

    def _zygote_request(self, config: JailConfig) -> tuple[JailConfig, tuple[bytes, ...]] | None:
        """The zygote shape and request fields of this sandbox's jail, or ``None`` when it gets
        its own bwrap (``zygote=False``, ``disk_mb``, a root filesystem directory, an image
        whose layers a zygote cannot name). A fork's workdir overlay (host) is not part of the
        shape: the zygote's child finds it (``freeze.LOWER``); an image fork's snapshot layer
        is in the request."""
        assert self._dirs is not None
        if not self.options.zygote or self.spec.disk_mb:
            return None
        if config.rootfs == Path("/"):
            return dataclasses.replace(config, work_layers=()), ()
        if not config.layers:
            return None
        request = image_request(config)
        if request is not None:
            overlay_dirs(self._dirs)
            self._dirs.ensure(config.rootfs)
        return request

    async def _fork_init(
        self, config: JailConfig, zygote: Zygote, request: tuple[bytes, ...]
    ) -> None:
        """Have ``zygote`` fork this sandbox's jail and init (``request``: see
        :func:`fork_init`).

        Raises:
            SandboxStartError: the zygote or the jail failed (``retryable``).
        """
        assert self._dirs is not None
        try:
            self._init = await fork_init(
                zygote,
                name=self._dirs.root.name,
                limits=self._limits,
                cgroup_joins=[str(c.join_file) for c in self._cgroups],
                prefix=self.id,
                request=request,
            )
        except BaseException as exc:
            await release(config, zygote)
            if isinstance(exc, InitDied):
                raise SandboxStartError(
                    f"the jail of sandbox {self.id} did not start: {exc}", retryable=True
                ) from exc
            raise
        self._zygote = (config, zygote)

    async def _stop_init(self) -> None:
        """Kill the init (and every process of the sandbox); let go of its zygote."""
        if self._init is not None:
            await self._init.kill()
        if self._zygote is not None:
            await release(*self._zygote)
            self._zygote = None

    @classmethod
    async def build_environment(cls, recipe: EnvironmentRecipe) -> None:
        """Build (or find in the cache) the virtual environment of ``recipe``'s packages.

        Raises:
            EnvironmentBuildError: the interpreter is missing or the build failed.
        """
        if recipe.has_packages:
            await anyio.to_thread.run_sync(ensure_environment, recipe.packages_only())

    async def _install_environment(self, recipe: EnvironmentRecipe, *, fork: bool = False) -> None:
        """Mount the recipe's cached virtual environment (built on first use) first on ``PATH``;
        in a container image, run the recipe's container script as the docker backend does,
        in the jail restarted with the network, then restarted as the spec says
        (:meth:`_install_online`; a ``fork`` of a snapshot only sets ``PATH``: the installed
        files are in its layer).

        The environment is built on this machine, outside the jail, once per recipe and
        interpreter (:func:`~sandlot.sandboxes.local.venv.ensure_environment`; concurrent
        sandboxes wait for one build). Inside the jail it is read-only, with its base
        interpreter; ``pip install`` goes to the sandbox's private ``/sandlot/overlay``
        (``PIP_PREFIX``), which the environment's Python also imports from. The jail is
        rebuilt with these mounts (nothing has run in it yet).

        Raises:
            EnvironmentBuildError: the interpreter is missing or the build failed.
            SandboxStartError: the image is a root filesystem directory (recipes need the host).
            SandboxSetupError: (a container image) the recipe's script failed, as on docker.
        """
        assert self._dirs is not None
        if self._image is not None:  # a container image is the environment, as on docker
            self._env["PATH"] = container_path(self._env)
            if not fork:
                await self._install_online(recipe)
            return
        if self._rootfs() != Path("/"):
            raise SandboxStartError(
                "an environment recipe on the local backend needs image='host': the cached "
                "virtual environment is built with this machine's interpreter"
            )
        self._venv = await anyio.to_thread.run_sync(ensure_environment, recipe.packages_only())
        self._dirs.ensure(self._dirs.overlay)
        self._env = self._base_env(Path("/"), self._dirs)
        await self._stop_init()
        if self._jail_config is not None:
            readonly = [*self._jail_config.readonly, venv_base_prefix(self._venv.path)]
            self._jail_config = dataclasses.replace(
                self._jail_config, environment=self._venv.path, readonly=tuple(readonly)
            )
        await self._start_init(init_interpreter(Path("/")))

    async def _install_online(self, recipe: EnvironmentRecipe) -> None:
        """The recipe's container script in this image's jail with the host's network, then
        the jail without it when the spec has none. The image's writable layer is the
        sandbox's own directory, so the installed files outlive the restarts; nothing else
        has run in the jail yet.

        Raises:
            SandboxSetupError: the script failed.
            SandboxStartError: the jail did not restart.
        """
        config = self._jail_config
        if config is None or config.network:  # the network the spec asks for already
            await super()._install_environment(recipe)
            return
        await self._restart_init(dataclasses.replace(config, network=True))
        await super()._install_environment(recipe)
        await self._restart_init(config)

    async def _restart_init(self, config: JailConfig) -> None:
        """Stop the jail's processes and start it again as ``config`` says."""
        await self._stop_init()
        self._jail_config = config
        await self._start_init(init_interpreter(self._rootfs(), self._image))

    def _host_path(self) -> str:
        """The host's ``PATH`` without the caller's virtualenv (its Python never runs tests)
        and, in a jail, without the directories the jail does not show (pyenv shims in a home
        directory, ``/opt``, ...): ``PATH`` lists only what a command can find there."""
        entries = os.environ.get("PATH", DEFAULT_PATH).split(os.pathsep)
        venvs = {os.environ.get("VIRTUAL_ENV")}
        if sys.prefix != sys.base_prefix:
            venvs.add(sys.prefix)
        hidden = {os.path.join(v, "bin") for v in venvs if v}
        kept = [e for e in entries if e and e.rstrip("/") not in hidden]
        if self.isolated:
            view = self.options.host_view
            kept = [e for e in kept if _covered_top_level(e, Path("/"), view)]
        return os.pathsep.join(kept)

    def _offer_python(self, path: str, rootfs: Path, dirs: HostDirs, home: str) -> str:
        """``path``, extended by ``~/.local/bin`` holding a ``python`` link to ``python3`` when
        ``path`` finds ``python3`` but no ``python`` (Debian ships only ``python3``; container
        images and the tools models were trained with call ``python``)."""
        prefix = "" if rootfs == Path("/") else str(rootfs)
        seen = os.pathsep.join(prefix + e for e in path.split(os.pathsep))
        python3 = _which("python3", seen)
        if python3 is None or _which("python", seen) is not None:
            return path
        dirs.shim_bin.mkdir(parents=True, exist_ok=True)
        (dirs.shim_bin / "python").symlink_to(python3[len(prefix) :])
        return f"{path}{os.pathsep}{home}/.local/bin"

    def _base_env(self, rootfs: Path, dirs: HostDirs) -> dict[str, str]:
        on_host = rootfs == Path("/")
        env: dict[str, str] = {}
        if on_host:
            env.update({k: os.environ[k] for k in self.options.inherit_env if k in os.environ})
        path = self._host_path() if on_host else DEFAULT_PATH
        home = JAIL_HOME if self.isolated else str(dirs.home)
        if self._venv is None:
            path = self._offer_python(path, rootfs, dirs, home)
        else:
            overlay = JAIL_OVERLAY if self.isolated else str(dirs.overlay)
            path = os.pathsep.join([f"{overlay}/bin", str(self._venv.bin_dir), path])
            env.update(
                VIRTUAL_ENV=str(self._venv.path), PIP_PREFIX=overlay, **{OVERLAY_ENV: overlay}
            )
        env.update(
            PATH=path,
            HOME=home,
            LANG="C.UTF-8",
            TERM="dumb",
            PAGER="cat",
            GIT_PAGER="cat",
            SANDLOT_WORKDIR=self.spec.workdir if self.isolated else str(dirs.work),
        )
        if self._image is not None:  # the image's Env over our defaults, as docker does
            env.update(self._image.config.env)
        if not self.isolated:
            env["TMPDIR"] = str(dirs.tmp)
        env.update(self.spec.env)
        return env

    async def _close(self) -> None:
        removed = False
        if self._init is not None and self._init.jailed:
            # SIGKILL first: an untouched directory is removed while the kernel tears the
            # jail down; one a dying process still wrote into is removed after.
            self._init.process.kill()
            removed = self._dirs is not None and self._dirs.remove_if_empty()
        await self._stop_init()
        for cgroup in self._cgroups:
            await cgroup.destroy()
        if self._dirs is not None and not removed and not self._dirs.remove_if_empty():
            await anyio.to_thread.run_sync(self._dirs.remove)

    async def _probe(self) -> str | None:
        return self._probe_now()

    def _probe_now(self) -> str | None:
        """Why the sandbox cannot run commands (lifetime over, init exited, directory
        removed), else ``None``; cheap checks of this process's own state."""
        assert self._dirs is not None and self._init is not None
        if time.monotonic() >= self._deadline:
            return f"reached the end of its lifetime (timeout_s={self.spec.timeout_s})"
        if not self._init.alive:
            return "is dead: its init exited"
        if not self._dirs.exists():
            return f"is gone: its host directory {self._dirs.root} was removed"
        return None

    def _ensure_usable(self) -> tuple[HostDirs, InitProcess]:
        self._check_usable()
        assert self._dirs is not None and self._init is not None
        reason = self._probe_now()
        if reason is not None:
            raise self._mark_dead(reason)
        return self._dirs, self._init

    # ----------------------------------------------------------------- running

    def _seen(self, path: str) -> str:
        """Where ``path`` (absolute, sandbox view) is for the process that will use it."""
        if self.isolated:
            return path
        assert self._dirs is not None
        workdir = self.spec.workdir
        if path == workdir or path.startswith(workdir.rstrip("/") + "/"):
            return str(self._dirs.work) + path[len(workdir) :]
        return path

    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float | None,
        stdin: bytes | Path | None = None,
        max_output_bytes: int | None = None,
        stdout_path: Path | None = None,
    ) -> Completed:
        """Run ``argv`` in ``cwd`` (sandbox view) through the init.

        Raises:
            SandboxDeadError: closed, dead init, removed directory, or end of lifetime.
            SandboxError: the init could not fork (``retryable``: e.g. the process cap).
        """
        dirs, init = self._ensure_usable()
        remaining = self._deadline - time.monotonic()
        lifetime_bound = timeout is None or timeout >= remaining
        try:
            done = await run_command(
                init,
                argv,
                cwd=self._seen(cwd),
                env=env,
                stdin=stdin,
                timeout=remaining if lifetime_bound else timeout,
                max_output_bytes=max_output_bytes,
                stdout_path=stdout_path,
            )
        except InitDied as exc:
            raise self._mark_dead("is dead: its init exited") from exc
        except SpawnFailed as exc:
            raise SandboxError(f"cannot start a process: {exc}", retryable=True) from exc
        if self.closed:
            raise SandboxDeadError(f"sandbox {self.id} was closed while a command was running")
        if done.timed_out and lifetime_bound:
            raise self._mark_dead(
                f"reached the end of its lifetime (timeout_s={self.spec.timeout_s}) while a "
                "command was running"
            )
        if done.returncode != 0 and not dirs.exists():
            raise self._mark_dead(f"is gone: its host directory {dirs.root} was removed")
        return done

    async def _run(self, run: RunRequest) -> RunOutput:
        """Run ``bash -c command`` in the jail through its init (see :meth:`Transport._run`).

        ``timeout=None`` is bounded by the sandbox's lifetime; at the limit the command's
        process tree is killed (its session, descendants, and processes still carrying its
        ``SANDLOT_EXEC_ID``), not the jail. Output written by background processes after the
        command exits is not collected.

        Raises:
            SandboxDeadError: the init died, the directory was removed, or the lifetime ended.
            SandboxError: no process could be started (``retryable``).
        """
        done = await self._spawn(
            ["bash", "-c", run.command],
            cwd=run.cwd,
            env={**self._env, **run.env} if run.env else self._env,
            timeout=run.timeout,
            stdin=run.stdin,
            max_output_bytes=self.options.max_output_bytes,
        )
        code = None if done.timed_out else done.returncode
        return RunOutput(code, done.stdout, done.stderr, done.stdout_dropped, done.stderr_dropped)

    async def _open_shell(self, name: str, config: SessionConfig) -> BashSession:
        """A session whose ``bash`` the init spawns in the sandbox's jail (see ``LocalChannel``).

        The shell shares the jail's files and processes with ``exec``; closing the session kills
        its process tree, closing the sandbox kills everything.
        """
        cwd = self.resolve_path(config.cwd) if config.cwd is not None else self.spec.workdir

        async def open_channel() -> LocalChannel:
            _, init = self._ensure_usable()
            try:
                return await LocalChannel.start(init, cwd=self._seen(cwd), env=self._env)
            except InitDied as exc:
                raise self._mark_dead("is dead: its init exited") from exc
            except SpawnFailed as exc:
                raise SandboxError(f"cannot start a shell: {exc}", retryable=True) from exc

        return ChannelSession(name, config, open_channel, self.is_alive)

    # ----------------------------------------------------------------- files

    async def _file_op(
        self,
        argv: list[str],
        what: str,
        *,
        stdin: bytes | Path | None = None,
        stdout_path: Path | None = None,
    ) -> bytes:
        done = await self._spawn(
            argv,
            cwd=self.spec.workdir,
            env=self._env,
            timeout=FILE_TIMEOUT_S,
            stdin=stdin,
            stdout_path=stdout_path,
        )
        if done.timed_out:
            raise SandboxFileError(f"{what} in sandbox {self.id}: timed out")
        if done.returncode != 0:
            raise SandboxFileError(f"{what} in sandbox {self.id}: {clip_tail(done.stderr)}")
        return done.stdout

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """Read by ``head -c`` inside the jail: at most one byte beyond ``max_bytes``."""
        return await self._file_op(
            ["head", "-c", str(max_bytes + 1), "--", self._seen(path)], f"cannot read {path!r}"
        )

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """Written from inside the jail, so a symlink planted at ``path`` cannot lead outside
        the sandbox's writable directories."""
        parent = posixpath.dirname(path)
        await self._file_op(
            ["bash", "-c", _WRITE_SCRIPT, "sandlot-write", self._seen(parent), self._seen(path)],
            f"cannot write {path!r}",
            stdin=data,
        )

    def _staging_file(self) -> Path:
        assert self._dirs is not None
        return self._dirs.ensure(self._dirs.transfer) / f"{uuid.uuid4().hex}.tar"

    async def _put_archive(self, parent: str, archive: IO[bytes], target: str) -> None:
        """Staged in the sandbox's host directory, streamed into ``tar -x`` inside the jail."""
        staging = self._staging_file()
        try:
            with staging.open("wb") as out:
                await anyio.to_thread.run_sync(shutil.copyfileobj, archive, out)
            await self._file_op(
                ["bash", "-c", _UNTAR_SCRIPT, "sandlot-upload", self._seen(parent)],
                f"cannot upload to {target!r}",
                stdin=staging,
            )
        finally:
            staging.unlink(missing_ok=True)

    async def _get_archive(self, path: str, caps: TreeCaps, consume: Reader[T]) -> T:
        """``tar -c`` inside the jail (a link at ``path`` resolved there first) into a staging
        file in the sandbox's host directory, cut at ``caps.max_archive_bytes``."""
        staging = self._staging_file()
        try:
            await self._file_op(
                [
                    *("bash", "-c", _TAR_SCRIPT, "sandlot-download", self._seen(path)),
                    *(str(caps.max_archive_bytes), str(caps.max_file_bytes)),
                ],
                f"cannot download {path!r}",
                stdout_path=staging,
            )
            with staging.open("rb") as stream:
                return await anyio.to_thread.run_sync(consume, stream)
        finally:
            staging.unlink(missing_ok=True)
