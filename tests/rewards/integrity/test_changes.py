"""The evaluator's git and the repository's list of changes, run for real with git and GNU
patch in a temporary repository (no sandbox): nothing planted in ``.git`` or ``.gitattributes``
runs, and every way an applier can change a path is listed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandlot.rewards.integrity.changes import (
    apply_script,
    gnu_patch_paths,
    parse_apply_output,
    parse_working_changes,
    patch_names,
    refused_names,
    working_changes_script,
)
from sandlot.rewards.scripts import PATCH_APPLY_COMMANDS, reset_test_files_script
from sandlot.tools.trusted_git import TrustedGit

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("patch") is None, reason="needs git and patch"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "core.hooksPath=/dev/null", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    r = tmp_path / "repo"
    (r / "tests").mkdir(parents=True)
    (r / "tests" / "test_a.py").write_text("def test_a():\n    assert True\n")
    (r / "src.py").write_text("".join(f"line {i}\n" for i in range(20)))
    (r / "README").write_text("read me\n")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return r, _git(r, "rev-parse", "HEAD").strip()


MARKERS = ("hook", "fsmonitor", "pager", "clean", "smudge", "process", "diffcmd", "textconv")


def _plant(repo: Path, marks: Path) -> None:
    """Hooks, fsmonitor, pager, filters and diff drivers in ``.git`` and ``.gitattributes``:
    each touches ``marks/<name>`` when it runs."""
    marks.mkdir(exist_ok=True)
    hooks = repo / ".git" / "hooks"
    for name in (
        "post-checkout",
        "pre-commit",
        "post-commit",
        "post-index-change",
        "reference-transaction",
        "pre-auto-gc",
        "fsmonitor-watchman",
        "pre-applypatch",
        "post-applypatch",
    ):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {marks}/hook-{name}\n")
        (hooks / name).chmod(0o755)
    (repo / "evil.cfg").write_text(f'[core]\n\tpager = "touch {marks}/include; cat"\n')
    with open(repo / ".git" / "config", "a") as f:
        f.write(
            f'[core]\n\tfsmonitor = "touch {marks}/fsmonitor; true"\n'
            f'\tpager = "touch {marks}/pager; cat"\n\thooksPath = .git/hooks\n'
            f"\tworktree = {repo.parent}\n"
            f'[filter "evil"]\n\tclean = "touch {marks}/clean; cat"\n'
            f'\tsmudge = "touch {marks}/smudge; cat"\n\tprocess = "touch {marks}/process"\n'
            "\trequired = true\n"
            f'[diff "evil"]\n\tcommand = "touch {marks}/diffcmd; true"\n'
            f'\ttextconv = "touch {marks}/textconv; cat"\n'
            f'[diff]\n\texternal = "touch {marks}/external; true"\n'
            f"[include]\n\tpath = {repo}/evil.cfg\n"
        )
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil\n")


def _run(git: TrustedGit, body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["bash", "-c", git.script(body)], cwd=cwd, capture_output=True, text=True, env=env
    )


def test_planted_hooks_config_and_filters_never_run(repo: tuple[Path, str], tmp_path: Path) -> None:
    r, base = repo
    marks = tmp_path / "marks"
    _plant(r, marks)
    # The repository's own git would run them (guards the test itself).
    subprocess.run(["git", "status"], cwd=r, capture_output=True, check=False)
    assert list(marks.iterdir()), "the planted configuration does not run under plain git"
    for m in list(marks.iterdir()):
        m.unlink()

    (r / "tests" / "test_a.py").write_text("tampered\n")
    (r / "src.py").write_text("changed\n")
    (r / "conftest.py").write_text("x = 1\n")
    (r / "fix.patch").write_text(
        "--- a/README\n+++ b/README\n@@ -1 +1 @@\n-read me\n+read me twice\n"
    )
    git = TrustedGit(str(r), base, scratch=str(tmp_path / "scratch"))
    body = (
        "set -e\n"
        "git apply --verbose fix.patch\n"
        + reset_test_files_script(base, ["tests/test_a.py", "conftest.py"])
        + f"git diff {base} > /dev/null\n"
        "git diff > /dev/null\n"
        "git log -1 > /dev/null\n"
        "git show HEAD:src.py > /dev/null\n" + working_changes_script()
    )
    out = _run(git, body, r)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in marks.iterdir()) == []
    assert (r / "tests" / "test_a.py").read_text().startswith("def test_a")
    assert not (r / "conftest.py").exists()
    changes = parse_working_changes(out.stdout)
    assert {"src.py", "README", ".gitattributes", "evil.cfg", "fix.patch"} <= set(changes.paths)


def test_assume_unchanged_and_skip_worktree_hide_nothing(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    r, base = repo
    _git(r, "update-index", "--assume-unchanged", "src.py")
    _git(r, "update-index", "--skip-worktree", "tests/test_a.py")
    (r / "src.py").write_text("hidden change\n")
    (r / "tests" / "test_a.py").write_text("hidden change\n")
    assert _git(r, "diff", "--name-only", base) == ""  # what the old listing saw
    git = TrustedGit(str(r), base, scratch=str(tmp_path / "scratch"))
    out = _run(git, "set -e\n" + working_changes_script(), r)
    assert out.returncode == 0, out.stderr
    assert {"src.py", "tests/test_a.py"} <= set(parse_working_changes(out.stdout).paths)


def _apply(r: Path, base: str, tmp_path: Path, patch: str) -> tuple[object, str]:
    path = tmp_path / "model.patch"
    path.write_text(patch)
    git = TrustedGit(str(r), base, scratch=str(tmp_path / "scratch"))
    script = apply_script(patch, PATCH_APPLY_COMMANDS, list_changes=True, patch_path=str(path))
    out = _run(git, script, r)
    return parse_apply_output(out.stdout, str(r)), out.stdout + out.stderr


HOOK = "#!/bin/sh\ntouch {marks}/hook\n"


def test_gnu_patch_cannot_write_into_git_even_past_the_name_check(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    # refused_names stops this first; here the applier step runs without it: git apply refuses
    # the path, GNU patch runs with .git renamed away, and what it creates there is refused.
    r, base = repo
    marks = tmp_path / "marks"
    marks.mkdir()
    hook = HOOK.format(marks=marks)
    patch = (
        "diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\n"
        "new file mode 100755\n--- /dev/null\n+++ b/.git/hooks/post-checkout\n"
        "@@ -0,0 +1,2 @@\n" + "".join(f"+{ln}\n" for ln in hook.splitlines())
    )
    assert refused_names(patch)
    changes, log = _apply(r, base, tmp_path, patch)
    assert any(".git/" in v for v in changes.violations), log  # type: ignore[attr-defined]
    assert not (r / ".git" / "hooks" / "post-checkout").exists()
    assert (r / ".git" / "HEAD").is_file() and not list(r.glob(".sandlot-git-aside-*"))
    _git(r, "checkout", "-q", base, "--", "src.py")
    assert list(marks.iterdir()) == []


def test_gnu_patch_fallback_is_listed_and_runs_no_ed(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    r, base = repo
    # A context diff (git apply reads none) creating a conftest without a diff --git line.
    patch = "*** /dev/null\n--- b/conftest.py\n***************\n*** 0 ****\n--- 1 ----\n+ x = 1\n"
    changes, log = _apply(r, base, tmp_path, patch)
    assert changes.applied == 3, log  # type: ignore[attr-defined]
    assert changes.paths == ["conftest.py"], log  # type: ignore[attr-defined]
    # An ed script (GNU patch would pipe it to ed, which can write any file): ed is not found.
    r2 = tmp_path / "r2"
    shutil.copytree(r, r2)
    subprocess.run(["git", "-C", str(r2), "checkout", "-q", "."], check=True)
    ed = "Index: x/README\n1a\nhello\n.\nw /tmp/sandlot-ed-escape\n"
    changes, log = _apply(r2, base, tmp_path, ed)
    assert changes.applied == 0, log  # type: ignore[attr-defined]
    assert (r2 / "README").read_text() == "read me\n"


def test_symlinks_and_modes_are_listed(repo: tuple[Path, str], tmp_path: Path) -> None:
    r, base = repo
    patch = (
        "diff --git a/tests/test_a.py b/tests/test_a.py\nold mode 100644\nnew mode 100755\n"
        "diff --git a/out b/out\nnew file mode 120000\n--- /dev/null\n+++ b/out\n"
        "@@ -0,0 +1 @@\n+/tmp\n\\ No newline at end of file\n"
        'diff --git a/README b/"con\\146test.py"\nsimilarity index 100%\n'
        'rename from README\nrename to "con\\146test.py"\n'
        "diff --git a/src.py b/tests/copy.py\nsimilarity index 100%\n"
        "copy from src.py\ncopy to tests/copy.py\n"
    )
    changes, log = _apply(r, base, tmp_path, patch)
    assert changes.applied == 1, log  # type: ignore[attr-defined]
    assert {"tests/test_a.py", "out", "README", "conftest.py", "tests/copy.py"} <= set(
        changes.paths  # type: ignore[attr-defined]
    )
    assert any("symlink out -> /tmp" in v for v in changes.violations)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("patch", "names"),
    [
        ("--- a/x.py\n+++ b/x.py\n", ["a/x.py", "b/x.py"]),
        ('diff --git "a/con\\146test.py" "b/c d.py"\n', ["a/conftest.py", "b/c d.py"]),
        ("Index: a/.git/config\n", ["a/.git/config"]),
        ("+++ b/name with space.py\t2020-01-01 00:00\n", ["b/name with space.py"]),
        ("rename to .GIT/hooks/x\n", [".GIT/hooks/x"]),
    ],
)
def test_patch_names_reads_every_header_form(patch: str, names: list[str]) -> None:
    assert set(names) <= set(patch_names(patch))


@pytest.mark.parametrize(
    "patch",
    [
        "--- a/.git/config\n+++ b/.git/config\n",
        "*** a/.git/config\n--- b/.git/config\n",
        "Index: a/.git/hooks/pre-commit\n",
        'diff --git "a/\\056git/config" "b/\\056git/config"\n',
        "diff --git a/x b/x\nrename from x\nrename to sub/.Git/config\n",
        "--- a/../evil.py\n+++ b/../evil.py\n",
        "--- /dev/null\n+++ b/a/../../evil.py\n",
    ],
)
def test_refused_names(patch: str) -> None:
    assert refused_names(patch)


def test_ordinary_patches_are_not_refused() -> None:
    gold = (
        "diff --git a/m/ops.py b/m/ops.py\nindex 4a669d5..78b15ce 100644\n"
        "--- a/m/ops.py\n+++ b/m/ops.py\n@@ -1 +1 @@\n-    return a // b\n+    return a / b\n"
        "diff --git a/.github/ci.yml b/.github/ci.yml\n--- a/.github/ci.yml\n"
        "+++ b/.github/ci.yml\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/.gitignore b/.gitignore\n--- a/.gitignore\n+++ b/.gitignore\n"
    )
    assert refused_names(gold) == []


@pytest.mark.parametrize("names_in_a_file", [False, True])
def test_gnu_patch_never_writes_through_a_symlink_of_the_repository(
    repo: tuple[Path, str], tmp_path: Path, names_in_a_file: bool
) -> None:
    r, base = repo
    outside = tmp_path / "outside"
    outside.mkdir()
    (r / "lnk").symlink_to(outside)
    _git(r, "add", "lnk")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "link")
    base = _git(r, "rev-parse", "HEAD").strip()
    # A context diff: only GNU patch reads it.
    patch = "*** /dev/null\n--- b/lnk/evil.pth\n***************\n*** 0 ****\n--- 1 ----\n+ x\n"
    path = tmp_path / "model.patch"
    path.write_text(patch)
    names = None
    if names_in_a_file:
        names = tmp_path / "names"
        names.write_text("".join(f"{n}\0" for n in gnu_patch_paths(patch)))
    git = TrustedGit(str(r), base, scratch=str(tmp_path / "scratch"))
    script = apply_script(
        patch,
        PATCH_APPLY_COMMANDS,
        list_changes=True,
        patch_path=str(path),
        names_path=str(names) if names else None,
    )
    out = _run(git, script, r)
    changes = parse_apply_output(out.stdout, str(r))
    assert any("through the symlink lnk" in v for v in changes.violations), out.stdout
    assert list(outside.iterdir()) == []


def _new_file(path: str, text: str = "x = 1\n") -> str:
    lines = text.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def _edit(path: str, old: str, new: str, line: int = 1) -> str:
    """A patch replacing the last line, ``line``, of ``path``."""
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -{line} +{line} @@\n-{old}\n+{new}\n"
    )


@pytest.fixture
def env_repo(repo: tuple[Path, str]) -> tuple[Path, str]:
    """``repo`` with a ``.gitignore`` (``build/``, ``*.log``), a tracked ``kept.log`` and an
    untracked virtual environment ``.venv`` made at set-up."""
    r, _ = repo
    (r / ".gitignore").write_text("*.log\nbuild/\n")
    (r / "kept.log").write_text("tracked\n")
    _git(r, "add", "-f", ".gitignore", "kept.log")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore")
    site = r / ".venv" / "lib" / "python3.11" / "site-packages" / "_pytest"
    site.mkdir(parents=True)
    (site / "runner.py").write_text("real = True\n")
    (r / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (r / ".venv" / "bin").mkdir()
    (r / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    return r, _git(r, "rev-parse", "HEAD").strip()


SITE_FILE = ".venv/lib/python3.11/site-packages/_pytest/runner.py"


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        pytest.param(_edit(SITE_FILE, "real = True", "real = False"), "site-packages", id="venv"),
        pytest.param(_new_file(".venv/bin/pytest"), "virtual environment .venv", id="venv-bin"),
        pytest.param(
            _new_file(".venv2/pyvenv.cfg", "home = /usr/bin") + _new_file(".venv2/lib/pytest.py"),
            "virtual environment .venv2",
            id="second-venv",
        ),
        pytest.param(_new_file("src/dist-packages/pytest.py"), "dist-packages", id="dist-packages"),
        pytest.param(_new_file("build/lib/pytest.py"), "ignored", id="ignored-dir"),
        pytest.param(_new_file("notes.log"), "ignored", id="ignored-name"),
        pytest.param(
            _edit(".gitignore", "build/", "nothing/", 2) + _new_file("build/lib/pytest.py"),
            "build/lib/pytest.py (ignored",
            id="gitignore-edited-by-the-patch",
        ),
        pytest.param(
            _new_file("pkg/.gitignore", "!*.log") + _new_file("pkg/notes.log"),
            "pkg/notes.log (ignored",
            id="gitignore-added-by-the-patch",
        ),
    ],
)
def test_a_patch_into_an_environment_is_refused(
    env_repo: tuple[Path, str], tmp_path: Path, patch: str, reason: str
) -> None:
    r, base = env_repo
    changes, log = _apply(r, base, tmp_path, patch)
    assert changes.applied == 1, log  # type: ignore[attr-defined]
    violations = changes.violations  # type: ignore[attr-defined]
    assert len(violations) == 1 and reason in violations[0], log


def test_tracked_files_and_the_repository_code_are_not_an_environment(
    env_repo: tuple[Path, str], tmp_path: Path
) -> None:
    # A tracked file is never ignored (kept.log matches *.log); .gitignore itself may change.
    r, base = env_repo
    patch = (
        _edit("kept.log", "tracked", "changed")
        + _edit(".gitignore", "build/", "dist/", 2)
        + _new_file("pkg/site_packages.py")
        + _edit("README", "read me", "read me twice")
    )
    changes, log = _apply(r, base, tmp_path, patch)
    assert changes.applied == 1, log  # type: ignore[attr-defined]
    assert changes.violations == [], log  # type: ignore[attr-defined]
    assert {"kept.log", ".gitignore", "pkg/site_packages.py", "README"} <= set(
        changes.paths  # type: ignore[attr-defined]
    )


def test_the_agents_own_sandbox_leaves_its_environment_out(
    env_repo: tuple[Path, str], tmp_path: Path
) -> None:
    # The agent's shell changed the venv (pip install) and left caches: the venv is left out
    # (neither refused nor reverted), ignored caches stay for the revert rules.
    r, base = env_repo
    (r / ".venv" / "lib" / "python3.11" / "site-packages" / "_pytest" / "runner.py").write_text(
        "real = False\n"
    )
    (r / ".venv" / "bin" / "pytest").write_text("#!/bin/sh\n")
    (r / "build").mkdir()
    (r / "build" / "conftest.py").write_text("x = 1\n")
    (r / "__pycache__").mkdir()
    (r / "__pycache__" / "src.cpython-311.pyc").write_bytes(b"\0")
    git = TrustedGit(str(r), base, scratch=str(tmp_path / "scratch"))
    out = _run(git, "set -e\n" + working_changes_script(), r)
    assert out.returncode == 0, out.stderr
    changes = parse_working_changes(out.stdout)
    assert not [p for p in changes.paths if p.startswith(".venv")], changes.paths
    assert {"build/conftest.py", "__pycache__/src.cpython-311.pyc"} <= set(changes.paths)
    assert changes.violations == []


def test_ignored_paths_are_found_inside_a_submodule_directory(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    # git check-ignore dies on a path inside a submodule (or beyond a symlink: the symlink
    # attacks of test_attacks.py) unless it reads the rules in a directory of their own.
    r, _ = repo
    (r / ".gitignore").write_text("*.log\n")
    _git(r, "add", ".gitignore")
    _git(r, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},sub")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "submodule")
    base = _git(r, "rev-parse", "HEAD").strip()
    (r / "sub").mkdir()
    patch = _new_file("sub/x.log") + _new_file("sub/y.py")
    changes, log = _apply(r, base, tmp_path, patch)
    assert changes.applied == 1, log  # type: ignore[attr-defined]
    (violation,) = changes.violations  # type: ignore[attr-defined]
    assert "sub/x.log (ignored" in violation and "y.py" not in violation, log
