"""Fixtures for tests of the ``local`` backend itself."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def marker() -> str:
    """A string unique to this test, to find its processes in the host's /proc."""
    return f"sandlot-marker-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def visible_dir() -> Iterator[Path]:
    """A fresh host directory outside /tmp, so jails see it (read-only) at the same path."""
    path = Path(tempfile.mkdtemp(prefix="sandlot-test-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
