"""A per-sandbox pids cgroup: the process cap that also holds for root.

``RLIMIT_NPROC`` does not stop a fork bomb run by real root (the kernel exempts uid 0), so when
the host lets us, each sandbox gets a child cgroup of our own pids cgroup with ``pids.max`` set.
Commands join it themselves as their first action (``echo 0 > cgroup.procs``; see ``limits``),
which needs no extra process per command. The cgroup also lists every process of the sandbox,
so closing kills them all even without a PID namespace.

Supported: the cgroup v1 ``pids`` hierarchy, or a cgroup v2 directory whose
``cgroup.subtree_control`` already enables ``pids`` (a delegated subtree). Anything else, or a
directory we may not write, means no cgroup: :meth:`PidsCgroup.create` returns ``None``.
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
_DESTROY_POLL_S = 0.01


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
def pids_parent_dir() -> Path | None:
    """The cgroup directory new sandbox cgroups are created in, or ``None`` if there is none.

    Computed once per process: cgroup membership and mounts of a running process rarely change.
    """
    try:
        candidate = _own_cgroup_dir("cgroup", "pids")
        if candidate is None:
            v2 = _own_cgroup_dir("cgroup2", None)
            controls = v2 / "cgroup.subtree_control" if v2 else None
            if v2 and controls and "pids" in controls.read_text().split():
                candidate = v2
    except (OSError, ValueError) as exc:
        log.debug("no pids cgroup: cannot read cgroup information: %s", exc)
        return None
    if candidate is None or not os.access(candidate, os.W_OK):
        log.debug("no writable pids cgroup (candidate %s)", candidate)
        return None
    return candidate


class PidsCgroup:
    """One sandbox's pids cgroup.

    Args:
        path: the cgroup directory (already created).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, max_pids: int) -> PidsCgroup | None:
        """Create cgroup ``name`` capped at ``max_pids`` tasks; ``None`` when the host can't.

        Args:
            name: directory name, unique per sandbox (the sandbox id).
            max_pids: value of ``pids.max`` (processes plus threads).
        """
        parent = pids_parent_dir()
        if parent is None:
            return None
        path = parent / name
        try:
            path.mkdir()
        except OSError as exc:
            log.debug("cannot create pids cgroup %s: %s", path, exc)
            return None
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError as exc:
            log.debug("cannot set pids.max of %s: %s", path, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    @property
    def procs_file(self) -> Path:
        """The ``cgroup.procs`` file a process writes ``0`` to in order to join."""
        return self.path / "cgroup.procs"

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
        log.warning("could not remove pids cgroup %s: processes survived SIGKILL", self.path)
