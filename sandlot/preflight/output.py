"""The output directory check: writable, with free space, before the first result is written.

A directory that does not exist yet is checked at its nearest existing parent (the run
creates it). Writability is tried, not read from the mode bits: root ignores the bits, and a
read-only mount or a full quota refuses root too.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sandlot.preflight.problem import Problem

MIN_FREE_BYTES = 256 << 20
"""Free space the output file system must have (logs, reports, trajectories: 256 MiB)."""


def output_problems(path: Path, flag: str) -> list[Problem]:
    """Problems writing under ``path``.

    Args:
        path: the output directory (it may not exist yet).
        flag: the option that named it (``--output-dir``, ``--output``), for the message.
    """
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [
            Problem(
                flag,
                f"{path} cannot be created: {existing} is a file, not a directory",
                f"choose another {flag}",
            )
        ]
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".sandlot-preflight-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return [
            Problem(
                flag,
                f"{path} is not writable ({reason} in {existing})",
                f"choose a writable {flag} or fix the permissions",
            )
        ]
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return [
            Problem(
                flag,
                f"the file system of {path} has {free >> 20} MiB free; a run needs at least "
                f"{MIN_FREE_BYTES >> 20} MiB for its logs and reports",
                f"free space there or choose another {flag}",
            )
        ]
    return []
