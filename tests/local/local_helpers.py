"""Helpers shared by the tests of the ``local`` backend."""

from __future__ import annotations

import os
import time
from pathlib import Path

from requirements import bwrap_missing, needs

from sandlot.sandboxes.local.cgroup import pids_parent_dir


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
