"""Helpers shared by the session runtime tests."""

from __future__ import annotations

import shutil


def local_isolation() -> str:
    """The strongest local isolation available here (``bwrap`` when installed)."""
    return "bwrap" if shutil.which("bwrap") else "none"
