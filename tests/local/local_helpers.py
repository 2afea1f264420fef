"""Helpers shared by the tests of the ``local`` backend."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from sandlot.sandboxes.local.cgroup import pids_parent_dir

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
needs_pids_cgroup = pytest.mark.skipif(
    pids_parent_dir() is None, reason="no writable pids cgroup on this host"
)


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
