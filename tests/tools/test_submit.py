"""``submit``: the model patch is the repository's true diff against ``base_commit``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandlot import Sandbox
from sandlot.tools.submit import diff_against_base

pytestmark = pytest.mark.anyio

_SETUP = """set -e
git init -q -b main repo && cd repo
git config user.email t@example.com && git config user.name t
printf 'a\\nb\\n' > code.py && git add code.py && git commit -qm base
printf 'a\\nB\\n' > code.py
printf 'new\\n' > added.py
printf '\\000\\001binary' > blob.bin
"""


async def _repo(sandbox: Sandbox, tmp: str) -> str:
    r = await sandbox.exec(_SETUP, cwd=tmp)
    assert r.ok, r.stderr
    return f"{tmp}/repo"


def _applies(patch: str, tmp_path: Path) -> str:
    """``code.py`` and ``added.py`` after applying ``patch`` to a clean copy of the base."""
    repo = tmp_path / "clean"
    repo.mkdir()
    (repo / "code.py").write_text("a\nb\n")
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=repo, check=True)
    return (repo / "code.py").read_text() + (repo / "added.py").read_text()


async def test_the_patch_has_edits_and_new_files_but_no_binary(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    tmp = (await sandbox.exec("mktemp -d")).stdout.strip()
    repo = await _repo(sandbox, tmp)
    patch = await diff_against_base(sandbox, repo, None)
    assert "blob.bin" not in patch
    assert _applies(patch, tmp_path) == "a\nB\nnew\n"
    assert (await sandbox.exec("git status --porcelain", cwd=repo)).stdout.count("??") == 2


async def test_the_repositorys_own_diff_settings_do_not_change_the_patch(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """What the agent can set in its repository: a textconv driver, an external diff, a
    ``noprefix``/``mnemonicPrefix`` setting, color: the patch still applies as written."""
    tmp = (await sandbox.exec("mktemp -d")).stdout.strip()
    repo = await _repo(sandbox, tmp)
    rigged = (
        "echo '*.py diff=upper' > .git/info/attributes && "
        "git config diff.upper.textconv 'tr a-z A-Z <' && "
        "git config diff.external false && git config diff.noprefix true && "
        "git config diff.mnemonicPrefix true && git config color.diff always"
    )
    assert (await sandbox.exec(rigged, cwd=repo)).ok
    patch = await diff_against_base(sandbox, repo, None)
    assert _applies(patch, tmp_path) == "a\nB\nnew\n"
