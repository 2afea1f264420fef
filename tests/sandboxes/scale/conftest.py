"""Fixtures of the scale-control tests."""

from __future__ import annotations

import pytest
from cloud_sim import Cloud, FakeCloudSandbox


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Cloud:
    fresh = Cloud()
    monkeypatch.setattr(FakeCloudSandbox, "cloud", fresh)
    return fresh
