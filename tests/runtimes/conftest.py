"""Fixtures for the session runtime tests."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def local_isolation() -> str:
    """The strongest local isolation available here (``bwrap`` when installed)."""
    return "bwrap" if shutil.which("bwrap") else "none"
