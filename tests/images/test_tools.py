"""A missing tool is one line that says how to install it."""

from __future__ import annotations

import pytest

from sandlot.errors import BackendUnavailableError
from sandlot.images.tools import find_tool


def test_a_missing_skopeo_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(BackendUnavailableError) as caught:
        find_tool("skopeo")
    assert "apt-get install skopeo" in str(caught.value) and "\n" not in str(caught.value)
