"""Fixtures of the dataset preprocessing tests: the swe-mini repositories and their mirrors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dataprep_support import EXAMPLES, MINICALC_BASE, MINICALC_LATER


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def swe_mini_repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/swe-mini/repos`` built in a temporary directory."""
    dest = tmp_path_factory.mktemp("swe-mini") / "repos"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    return dest


@pytest.fixture(scope="session")
def mirror(swe_mini_repos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``SANDLOT_REPO_MIRROR`` directory: ``git clone --mirror`` of each swe-mini repository.

    The minicalc mirror also gets history that must never reach an agent working on
    ``minicalc__minicalc-1``: an annotated tag and a branch on the later commit, and a tag on
    the base commit (which may stay).
    """
    root = tmp_path_factory.mktemp("mirror")
    for repo in sorted(swe_mini_repos.iterdir()):
        target = root / f"sandlot-examples__{repo.name}"
        _git("clone", "-q", "--mirror", str(repo), str(target), cwd=root)
    minicalc = root / "sandlot-examples__minicalc"
    env = ("-c", "user.name=t", "-c", "user.email=t@t")
    _git(*env, "tag", "-a", "-m", "release", "v0.2", MINICALC_LATER, cwd=minicalc)
    _git("tag", "v0.1", MINICALC_BASE, cwd=minicalc)
    _git("branch", "feature", MINICALC_LATER, cwd=minicalc)
    return root


@pytest.fixture
def fakecloud(monkeypatch: pytest.MonkeyPatch) -> str:
    """A third party's backend, registered for this test only (nothing starts it here)."""
    from sandlot.sandboxes import registry
    from sandlot.sandboxes.base import Sandbox

    class FakeCloud(Sandbox):
        name = "fakecloud"

    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    registry.register_backend("fakecloud", FakeCloud)
    return "fakecloud"
