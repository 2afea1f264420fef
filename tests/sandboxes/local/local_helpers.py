"""Helpers shared by the tests of the ``local`` backend."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from requirements import bwrap_missing, needs

import sandlot
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.local.cgroup import parent_dir, pids_parent_dir


def _pids_cgroup_missing() -> str | None:
    if pids_parent_dir() is not None:
        return None
    return "no writable pids cgroup on this host (run as root on a host with the pids controller)"


needs_bwrap = needs(bwrap_missing)
needs_pids_cgroup = needs(_pids_cgroup_missing)


def host_pids_with(marker: str) -> list[int]:
    """PIDs of host processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def wait_until_no_process_has(marker: str, within_s: float = 5.0) -> list[int]:
    """Poll until no host process carries ``marker``; return the survivors after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (survivors := host_pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return survivors


def wait_until_some_process_has(marker: str, within_s: float = 10.0) -> None:
    """Poll until a host process carries ``marker``; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not host_pids_with(marker):
        assert time.monotonic() < deadline, f"no process with {marker!r} appeared"
        time.sleep(0.05)


def _cpu_cgroup_missing() -> str | None:
    if parent_dir("cpu") is not None:
        return None
    return "no writable cpu cgroup on this host (run as root on a host with the cpu controller)"


def _mount_missing() -> str | None:
    if os.geteuid() == 0 and shutil.which("mount"):
        return None
    return "mounting a tmpfs (disk_mb) needs root and mount(8)"


needs_cpu_cgroup = needs(_cpu_cgroup_missing)
needs_mount = needs(_mount_missing)


def open_local(**fields: object) -> LocalSandbox:
    """``sandlot.open("local", **fields)``, typed as the local backend's class."""
    sb = sandlot.open("local", **fields)
    assert isinstance(sb, LocalSandbox)
    return sb
