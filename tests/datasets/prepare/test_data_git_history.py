"""The SWE-rebench setup command leaves only HEAD's history, whatever else the clone holds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from dataprep_support import MINICALC_BASE, MINICALC_LATER

from sandlot.datasets.git_history import strip_future_history_cmd

GIT_ENV = ("-c", "user.name=t", "-c", "user.email=t@t")


def _git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["git", *GIT_ENV, *args], cwd=repo, check=check, capture_output=True, text=True
    )
    return proc.stdout.strip()


def _cluttered_clone(swe_mini_repos: Path, dest: Path) -> Path:
    """A clone at the base commit whose refs, stash, notes and alternates reach the later commit."""
    _git(dest.parent, "clone", "-q", "--shared", str(swe_mini_repos / "minicalc"), str(dest))
    _git(dest, "tag", "-a", "-m", "future", "v0.2", MINICALC_LATER)
    _git(dest, "tag", "v0.1", MINICALC_BASE)
    _git(dest, "tag", "blob-tag", f"{MINICALC_LATER}:README.md")
    _git(dest, "notes", "add", "-m", "note on the fix", MINICALC_LATER)
    _git(dest, "branch", "feature", MINICALC_LATER)
    _git(dest, "fetch", "-q", "origin")
    _git(dest, "checkout", "-q", "--detach", MINICALC_BASE)
    (dest / "README.md").write_text("scratch\n")
    _git(dest, "stash", "-q")
    return dest


def _strip(repo: Path, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", strip_future_history_cmd(base)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def test_only_head_and_its_ancestors_remain(swe_mini_repos: Path, tmp_path: Path) -> None:
    repo = _cluttered_clone(swe_mini_repos, tmp_path / "clone")
    assert MINICALC_LATER in _git(repo, "log", "--all", "--format=%H")
    proc = _strip(repo, MINICALC_BASE)
    assert proc.returncode == 0, proc.stderr
    assert _git(repo, "log", "--all", "--format=%H").split() == [MINICALC_BASE]
    assert _git(repo, "for-each-ref", "--format=%(refname)").split() == ["refs/tags/v0.1"]
    assert _git(repo, "remote") == "" and _git(repo, "reflog", "--all") == ""
    assert not (repo / ".git" / "FETCH_HEAD").exists()
    assert not (repo / ".git" / "objects" / "info" / "alternates").exists()
    missing = subprocess.run(["git", "cat-file", "-e", MINICALC_LATER], cwd=repo, check=False)
    assert missing.returncode != 0
    assert _git(repo, "status", "--porcelain") == ""


def test_a_setup_commit_on_top_of_the_base_is_kept(swe_mini_repos: Path, tmp_path: Path) -> None:
    """SWE-bench style images commit their environment setup on a branch at the base commit."""
    repo = _cluttered_clone(swe_mini_repos, tmp_path / "clone")
    _git(repo, "checkout", "-q", "-B", "main", MINICALC_BASE)
    _git(repo, "commit", "-q", "--allow-empty", "-m", "SWE-bench")
    setup = _git(repo, "rev-parse", "HEAD")
    assert _strip(repo, MINICALC_BASE).returncode == 0
    assert _git(repo, "log", "--all", "--format=%H").split() == [setup, MINICALC_BASE]
    assert _git(repo, "symbolic-ref", "HEAD") == "refs/heads/main"


@pytest.mark.parametrize("base", [MINICALC_LATER, "0" * 40])
def test_a_base_commit_outside_head_history_fails(
    base: str, swe_mini_repos: Path, tmp_path: Path
) -> None:
    repo = _cluttered_clone(swe_mini_repos, tmp_path / "clone")
    proc = _strip(repo, base)
    assert proc.returncode != 0
    assert MINICALC_LATER in _git(repo, "log", "--all", "--format=%H")  # nothing was deleted
