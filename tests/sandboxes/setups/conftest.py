"""The set-up tests' ``local`` root, which must be empty at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from requirements import bwrap_missing, missing


@pytest.fixture
def local_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The sandboxes' root, which must be empty when the test ends: every sandbox closed,
    every snapshot deleted."""
    if reason := bwrap_missing():
        missing(reason)
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(root))
    yield root
    assert not list(root.iterdir()), "a sandbox or a snapshot outlived the test"
