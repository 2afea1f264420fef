"""Per-sandbox cgroups: the process cap that also holds for root, and the CPU limit.

``RLIMIT_NPROC`` does not stop a fork bomb run by real root (the kernel exempts uid 0), so when
the host lets us, each sandbox gets a child cgroup of our own pids cgroup with ``pids.max`` set;
with ``spec.cpu``, also one of our cpu cgroup with a CFS quota of ``cpu`` cores (v1
``cpu.cfs_quota_us``/``cpu.cfs_period_us``, v2 ``cpu.max``). The sandbox's init joins them
first (so every command is in them) and they list every process of the sandbox, so closing
kills them all even without a PID namespace. Each cgroup is named after the sandbox id, which
is how ``sandlot gc --backend local`` finds those of crashed callers.

Supported: the cgroup v1 ``pids``/``cpu`` hierarchies, or a cgroup v2 directory whose
``cgroup.subtree_control`` already enables the controller (a delegated subtree; one cgroup then
carries both). Anything else, or a directory we may not write, means no cgroup for that
controller: :meth:`Cgroup.create` returns ``None``, and a ``spec.cpu`` that gets no cgroup is
logged once per process as a warning (it is not enforced).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
from pathlib import Path

import anyio

log = logging.getLogger("sandlot.sandboxes.local")

_DESTROY_BUDGET_S = 5.0
_DESTROY_POLL_S = 0.001


def _unescape_mount_path(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")).replace(
        "\\134", "\\"
    )


def _own_cgroup_dir(fstype: str, controller: str | None) -> Path | None:
    """Directory of our own cgroup in the hierarchy of ``fstype`` (and v1 ``controller``)."""
    own_path = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (
            controller is not None and controller in controllers.split(",")
        ):
            own_path = path
    if own_path is None:
        return None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, post = before.split(), after.split()
        if len(fields) < 5 or len(post) < 3 or post[0] != fstype:
            continue
        if controller is not None and controller not in post[2].split(","):
            continue
        mount_root, mount_point = fields[3], _unescape_mount_path(fields[4])
        if not (own_path == mount_root or own_path.startswith(mount_root.rstrip("/") + "/")):
            continue
        return Path(mount_point) / own_path[len(mount_root) :].lstrip("/")
    return None


@functools.cache
def parent_dir(controller: str) -> Path | None:
    """The cgroup directory new sandbox cgroups of ``controller`` are created in, or ``None``.

    Computed once per process: cgroup membership and mounts of a running process rarely change.
    """
    try:
        candidate = _own_cgroup_dir("cgroup", controller)
        if candidate is None:
            v2 = _own_cgroup_dir("cgroup2", None)
            controls = v2 / "cgroup.subtree_control" if v2 else None
            if v2 and controls and controller in controls.read_text().split():
                candidate = v2
    except (OSError, ValueError) as exc:
        log.debug("no %s cgroup: cannot read cgroup information: %s", controller, exc)
        return None
    if candidate is None or not os.access(candidate, os.W_OK):
        log.debug("no writable %s cgroup (candidate %s)", controller, candidate)
        return None
    return candidate


def pids_parent_dir() -> Path | None:
    """:func:`parent_dir` of the ``pids`` controller."""
    return parent_dir("pids")


_CFS_PERIOD_US = 100_000


def cpu_settings(parent: Path, cpus: float) -> dict[str, str]:
    """The files limiting a cgroup under ``parent`` to ``cpus`` cores."""
    quota = max(1000, round(cpus * _CFS_PERIOD_US))
    if (parent / "cpu.cfs_quota_us").exists():
        return {"cpu.cfs_period_us": str(_CFS_PERIOD_US), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {_CFS_PERIOD_US}"}


def sandbox_cgroups(name: str) -> list[Cgroup]:
    """The existing cgroups named ``name`` (a sandbox id) in the pids and cpu hierarchies."""
    dirs = {d / name for d in (parent_dir("pids"), parent_dir("cpu")) if d is not None}
    return [Cgroup(d) for d in sorted(dirs) if d.is_dir()]


def create_cgroups(name: str, max_pids: int | None, cpus: float | None) -> list[Cgroup]:
    """The sandbox's cgroups: with ``max_pids``, ``pids.max``; with ``cpus``, a CPU quota of
    that many cores; one cgroup per hierarchy (v2: one for both). Controllers the host does not
    give us are left out (see the module docstring)."""
    wanted: dict[Path, dict[str, str]] = {}
    pids = parent_dir("pids") if max_pids is not None else None
    if pids is not None:
        wanted.setdefault(pids, {})["pids.max"] = str(max_pids)
    cpu = parent_dir("cpu") if cpus is not None else None
    if cpu is not None and cpus is not None:
        wanted.setdefault(cpu, {}).update(cpu_settings(cpu, cpus))
    created = []
    for parent, settings in wanted.items():
        cgroup = Cgroup.create(parent / name, settings)
        if cgroup is not None:
            created.append(cgroup)
    if cpus is not None and not any(c.path.parent == cpu for c in created):
        _warn_cpu_not_limited()
    return created


@functools.cache
def _warn_cpu_not_limited() -> None:
    """Say once per process that ``spec.cpu`` is not enforced here, and what would."""
    log.warning(
        "spec.cpu is NOT enforced for local sandboxes in this process: no cpu cgroup we may "
        "write here (uid %d). A user who is not root needs a delegated cgroup v2 subtree with "
        "the cpu controller enabled in its cgroup.subtree_control (e.g. run under "
        "`systemd-run --user --scope -p Delegate=yes`); memory_mb (RLIMIT_AS), cpu_time_s "
        "and max_processes (RLIMIT_NPROC) hold without one.",
        os.getuid(),
    )


class Cgroup:
    """One sandbox cgroup.

    Args:
        path: the cgroup directory (already created).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, settings: dict[str, str]) -> Cgroup | None:
        """Create cgroup ``path`` and write ``settings`` (file name -> value) into it;
        ``None`` (logged) when the host does not let us."""
        try:
            path.mkdir()
        except OSError as exc:
            log.debug("cannot create cgroup %s: %s", path, exc)
            return None
        try:
            for file, value in settings.items():
                (path / file).write_text(value)
        except OSError as exc:
            log.debug("cannot configure cgroup %s: %s", path, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    @property
    def procs_file(self) -> Path:
        """The ``cgroup.procs`` file a process writes ``0`` to in order to join."""
        return self.path / "cgroup.procs"

    @property
    def join_file(self) -> Path:
        """The file a single-threaded process writes ``0`` to in order to join: v1 ``tasks``
        (which moves the calling thread only, and so skips the global lock whose every taking
        waits for an RCU grace period, milliseconds), else ``cgroup.procs``."""
        tasks = self.path / "tasks"
        return tasks if tasks.exists() else self.procs_file

    def pids(self) -> list[int]:
        """Host PIDs of the processes in the cgroup (empty once it is gone)."""
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except FileNotFoundError:
            return []

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup."""
        kill_file = self.path / "cgroup.kill"  # v2, Linux 5.14+: atomic, no PID reuse race
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def destroy(self) -> None:
        """Kill the processes left in the cgroup and remove it; gives up (logged) after 5 s."""
        with anyio.move_on_after(_DESTROY_BUDGET_S):
            while True:
                self.kill_all()
                try:
                    self.path.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                # Killed tasks leave the cgroup only once they have fully exited.
                await anyio.sleep(_DESTROY_POLL_S)
        log.warning("could not remove cgroup %s: processes survived SIGKILL", self.path)
