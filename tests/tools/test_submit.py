"""``submit``: the model patch is the repository's true diff against ``base_commit``."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandlot import Sandbox
from sandlot.tools.submit import diff_against_base
from sandlot.tools.tool_result import ToolError

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


# What the agent can plant in its repository for the git that computes the patch, each
# leaving a mark $M/ran-* ($M: a directory outside the repository, put in when planted) if
# it runs.
# The work tree still holds code.py "a\nB\n" and added.py "new\n" (and blob.bin).
_UPPER = "sh -c 'touch $M/ran-filter; tr a-z A-Z'"


def _marker_script(path: str, mark: str) -> str:
    """Shell writing an executable script at ``path`` that touches ``$M/ran-<mark>``."""
    return f"printf '#!/bin/sh\\ntouch $M/ran-{mark}\\nexit 1\\n' > {path} && chmod +x {path}"


_PLANTS = {
    "clean-filter-info-attributes": (
        f"echo '*.py filter=up' > .git/info/attributes && git config filter.up.clean \"{_UPPER}\""
    ),
    "clean-filter-gitattributes": (
        f"echo '*.py filter=up' > .gitattributes && git config filter.up.clean \"{_UPPER}\""
    ),
    "fsmonitor": (
        _marker_script("$M/fsmon", "fsmonitor")
        + " && git config core.fsmonitor $M/fsmon && git update-index --fsmonitor"
    ),
    "hook": _marker_script(".git/hooks/post-index-change", "hook"),
    "hooks-path": (
        "mkdir $M/hooks && "
        + _marker_script("$M/hooks/post-index-change", "hooks-path")
        + " && git config core.hooksPath $M/hooks"
    ),
    "include-path": (
        f'git config -f $M/included filter.up.clean "{_UPPER}" && '
        "git config -f $M/included core.fsmonitor $M/fsmon && "
        + _marker_script("$M/fsmon", "fsmonitor")
        + " && echo '*.py filter=up' > .git/info/attributes && git config include.path $M/included"
    ),
    "attributes-file": (
        f"echo '*.py filter=up' > $M/attributes && git config core.attributesFile $M/attributes"
        f' && git config filter.up.clean "{_UPPER}"'
    ),
    # Index bits that make git add skip the edited code.py.
    "assume-unchanged": "git update-index --assume-unchanged code.py",
    "skip-worktree": "git update-index --skip-worktree code.py",
}


@pytest.mark.parametrize("plant", list(_PLANTS))
async def test_nothing_the_agent_planted_in_its_repository_runs_or_changes_the_patch(
    sandbox: Sandbox, tmp_path: Path, plant: str
) -> None:
    tmp = (await sandbox.exec("mktemp -d")).stdout.strip()
    repo = await _repo(sandbox, tmp)
    marks = f"{tmp}/marks"
    plant_cmd = _PLANTS[plant].replace("$M", marks)
    # (Planting may run it once: git update-index --fsmonitor asks the monitor.)
    r = await sandbox.exec(f"mkdir {marks} && {plant_cmd} && rm -f {marks}/ran-*", cwd=repo)
    assert r.ok, r.stderr
    patch = await diff_against_base(sandbox, repo, None)
    ran = [m for m in (await sandbox.exec(f"ls -A {marks}")).stdout.split() if m[:4] == "ran-"]
    assert ran == [], "the submitted diff ran what the agent planted"
    assert _applies(patch, tmp_path) == "a\nB\nnew\n", patch
    assert "blob.bin" not in patch


async def test_the_patch_is_the_work_tree_against_base_and_leaves_nothing_behind(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Against a base named by a branch, a short hash or a full one, after the agent committed
    part of its work; ignored files (``.gitignore``, ``.git/info/exclude``) stay out; the
    agent's index and object store are not written and the private git directory is gone."""
    tmp = (await sandbox.exec("mktemp -d")).stdout.strip()
    repo = await _repo(sandbox, tmp)
    setup = (
        "set -e\ngit branch base\ngit add added.py && git commit -qm partial\n"
        "echo build/ > .gitignore && git add .gitignore && git commit -qm ignore\n"
        "mkdir build && echo x > build/out.py && echo '*.log' >> .git/info/exclude\n"
        "echo x > run.log\n"
    )
    assert (await sandbox.exec(setup, cwd=repo)).ok
    state = (
        "find .git/objects -type f | sort | md5sum; md5sum < .git/index; "
        "ls -d /tmp/git-* 2>/dev/null; true"
    )
    before = (await sandbox.exec(state, cwd=repo)).stdout
    full = (await sandbox.exec("git rev-parse base", cwd=repo)).stdout.strip()
    patches = [await diff_against_base(sandbox, repo, b) for b in ("base", full[:10], full)]
    assert patches[0] == patches[1] == patches[2]
    patch = patches[0]
    assert "build/out.py" not in patch and "run.log" not in patch and "+build/" in patch
    assert _applies(patch, tmp_path) == "a\nB\nnew\n"
    assert (await sandbox.exec(state, cwd=repo)).stdout == before
    assert "no-such-rev" in str(await _tool_error(diff_against_base(sandbox, repo, "no-such-rev")))


async def _tool_error(call: Any) -> BaseException:
    try:
        await call
    except ToolError as exc:
        return exc
    raise AssertionError("no ToolError")
