"""R2E-Gym's ParsedCommit JSON renders to the gold patch that applies at the base commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from dataprep_support import EXAMPLES, MINICALC_BASE, fixture_rows

from sandlot.datasets.prepare import SourceError
from sandlot.datasets.r2e_commit import gold_patch, is_test_file
from sandlot.datasets.r2e_gym_subset import passing_tests


def test_gold_patch_is_the_commit_non_test_python_diff(
    swe_mini_repos: Path, tmp_path: Path
) -> None:
    commit = json.loads(fixture_rows("r2e_gym_subset")[0]["parsed_commit_content"])
    patch = gold_patch(commit)
    history = (EXAMPLES / "history" / "minicalc" / "0001-add-power-operator.patch").read_text()
    ops = history[
        history.index("diff --git a/minicalc/ops.py") : history.index("diff --git a/tests")
    ]
    assert patch == ops
    repo = tmp_path / "minicalc"
    subprocess.run(["git", "clone", "-q", str(swe_mini_repos / "minicalc"), str(repo)], check=True)
    subprocess.run(["git", "checkout", "-q", MINICALC_BASE], cwd=repo, check=True)
    (tmp_path / "gold.patch").write_text(patch)
    check = subprocess.run(
        ["git", "apply", "--check", str(tmp_path / "gold.patch")], cwd=repo, check=False
    )
    assert check.returncode == 0


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("pkg/tests/helpers.py", True),
        ("test_core.py", True),
        ("pkg/core_test.py", True),
        ("Test/x.py", True),
        ("pkg/testing.py", False),
        ("pkg/contest.py", False),
    ],
)
def test_is_test_file_follows_r2e_gym(path: str, expected: bool) -> None:
    assert is_test_file(path) is expected


def test_passing_tests_cleans_keys_like_r2e_gym() -> None:
    expected = {
        "\x1b[32ma.py::t1\x1b[0m": "PASSED",
        "a.py::t2 - AssertionError: x": "PASSED",
        "a.py::t3 - boom": "FAILED",
    }
    assert passing_tests(json.dumps(expected)) == ["a.py::t1", "a.py::t2"]
    with pytest.raises(SourceError, match="not valid JSON"):
        passing_tests("{")
