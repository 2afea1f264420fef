"""The shell snippets of an evaluation, run for real with git in a temp repo."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandlot.rewards.scripts import eval_script, patch_files, reset_test_files_script

TEST_PATCH = """diff --git a/tests/test_old.py b/tests/test_old.py
--- a/tests/test_old.py
+++ b/tests/test_old.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+y = 1
"""


def test_patch_files_lists_each_path_once() -> None:
    assert patch_files(TEST_PATCH) == ["tests/test_old.py", "tests/test_new.py"]
    assert patch_files("") == []


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    r = tmp_path / "repo"
    (r / "tests").mkdir(parents=True)
    (r / "tests" / "test_old.py").write_text("x = 1\n")
    (r / "src.py").write_text("a = 1\n")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return r, _git(r, "rev-parse", "HEAD").strip()


def test_reset_restores_tests_and_removes_added_files_only(repo: tuple[Path, str]) -> None:
    r, base = repo
    (r / "tests" / "test_old.py").write_text("tampered\n")
    (r / "tests" / "test_new.py").write_text("model wrote this\n")
    (r / "src.py").write_text("a = 2  # the model's fix\n")
    script = "set -e\n" + reset_test_files_script(base, patch_files(TEST_PATCH))
    subprocess.run(["bash", "-c", script], cwd=r, check=True)
    assert (r / "tests" / "test_old.py").read_text() == "x = 1\n"
    assert not (r / "tests" / "test_new.py").exists()
    assert (r / "src.py").read_text() == "a = 2  # the model's fix\n"


def test_reset_of_added_only_files_keeps_the_rest(repo: tuple[Path, str]) -> None:
    r, base = repo
    (r / "src.py").write_text("changed\n")
    added_only = TEST_PATCH.split("diff --git a/tests/test_new.py")[1]
    script = "set -e\n" + reset_test_files_script(
        base, patch_files("diff --git a/tests/test_new.py" + added_only)
    )
    subprocess.run(["bash", "-c", script], cwd=r, check=True)
    assert (r / "src.py").read_text() == "changed\n"


def test_eval_script_exits_with_the_test_command_status(repo: tuple[Path, str]) -> None:
    r, base = repo
    script = eval_script(workdir=str(r), base_commit=base, test_files=[], test_cmd="(exit 7)")
    # Only the part after the test patch step is meaningful here; run the tail of the script.
    tail = script.split(": '>>>>> Start Test Output'", 1)[1]
    proc = subprocess.run(["bash", "-c", f"cd {r}\n: start{tail}"], capture_output=True)
    assert proc.returncode == 7
