"""R2E-Gym rows: the gold patch rendered from ParsedCommit JSON, and grading as R2E-Gym grades."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from dataprep_support import EXAMPLES, MINICALC_BASE, fixture_rows, run_prepare

from sandlot.datasets.instance import Instance
from sandlot.datasets.prepare import SourceError
from sandlot.datasets.r2e_commit import gold_patch, is_test_file
from sandlot.datasets.r2e_gym import GRADED_PATHS, SETUP_CMD, parse_log
from sandlot.datasets.r2e_gym_subset import passing_tests
from sandlot.datasets.swebench_specs import resolve_log_parser
from sandlot.datasets.validate import validate_file
from sandlot.rewards.grading import grade
from sandlot.rollout.rows import load_rows


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
    real = {"TestX.test_a": "PASSED", "test_b - x": "PASSED", "test_c": "ERROR"}
    assert passing_tests(json.dumps(real)) == ["TestX.test_a", "test_b"]
    with pytest.raises(SourceError, match="not valid JSON"):
        passing_tests("{")


def _r2e_instance(tmp_path: Path) -> Instance:
    [row] = load_rows(run_prepare("r2e_gym_subset", tmp_path, "docker").path, backend="docker")
    return row.instance


def _pytest_log(lines: list[str], summary: str) -> str:
    """A log as R2E-Gym's run_tests.sh prints it: `pytest -rA r2e_tests`, in colour."""
    return (
        "============================= test session starts ==============================\n"
        "collected 4 items\n\nr2e_tests/test_1.py ...F                                 [100%]\r\n"
        "=========================== short test summary info ============================\n"
        + "\n".join(lines)
        + f"\n\x1b[31m========================= {summary} =========================\x1b[0m\n"
    )


GOLD_LOG = _pytest_log(
    [
        "\x1b[32mPASSED\x1b[0m r2e_tests/test_1.py::test_power",
        "PASSED r2e_tests/test_1.py::TestPrecedence::test_power_binds_tighter_than_multiplication",
        "PASSED r2e_tests/test_1.py::test_addition",
        "FAILED r2e_tests/test_1.py::test_modulo - minicalc.errors.CalcError: unexpected "
        "character '%' at position 2",
    ],
    "1 failed, 3 passed in 0.05s",
)


def test_a_real_format_row_resolves_with_the_gold_log(tmp_path: Path) -> None:
    graded = grade(_r2e_instance(tmp_path), GOLD_LOG, parser=parse_log, tests_exit_code=1)
    assert graded.resolved, graded.warnings
    assert graded.tests_status == {
        "test_power": "PASSED",
        "TestPrecedence.test_power_binds_tighter_than_multiplication": "PASSED",
        "test_addition": "PASSED",
        "test_modulo": "FAILED",
    }
    assert graded.fail_to_pass.failure == [] and len(graded.fail_to_pass.success) == 3


@pytest.mark.parametrize(
    ("log", "exit_code", "warning"),
    [
        # the base commit: the new operator is unknown
        (
            GOLD_LOG.replace(
                "PASSED\x1b[0m r2e_tests/test_1.py::test_power",
                "FAILED\x1b[0m "
                "r2e_tests/test_1.py::test_power - minicalc.errors.CalcError: unexpected '^'",
            ),
            1,
            "test test_power: expected PASSED, log shows FAILED",
        ),
        # a test expected to fail now passes: R2E-Gym wants its exact statuses
        (
            GOLD_LOG.replace(
                "FAILED r2e_tests/test_1.py::test_modulo", "PASSED r2e_tests/test_1.py::test_modulo"
            ),
            0,
            "test test_modulo: expected FAILED, log shows PASSED",
        ),
        # a graded test is missing from the log (deleted or renamed by the patch)
        (
            GOLD_LOG.replace("PASSED r2e_tests/test_1.py::test_addition\n", ""),
            1,
            "test test_addition: expected PASSED, log shows nothing",
        ),
        # an extra test in the log
        (
            GOLD_LOG.replace(
                "PASSED r2e_tests/test_1.py::test_addition",
                "PASSED r2e_tests/test_1.py::test_addition\nPASSED r2e_tests/test_1.py::test_extra",
            ),
            1,
            "test test_extra: expected absent, log shows PASSED",
        ),
        # tests did not run: no summary
        ("ImportError while loading conftest\n", 4, "expected PASSED, log shows nothing"),
    ],
)
def test_a_wrong_log_does_not_resolve(
    tmp_path: Path, log: str, exit_code: int, warning: str
) -> None:
    graded = grade(_r2e_instance(tmp_path), log, parser=parse_log, tests_exit_code=exit_code)
    assert not graded.resolved
    assert any(warning in w for w in graded.warnings), graded.warnings


def test_spoofed_summaries_do_not_resolve(tmp_path: Path) -> None:
    inst = _r2e_instance(tmp_path)
    failing = GOLD_LOG.replace(
        "PASSED\x1b[0m r2e_tests/test_1.py::test_power",
        "FAILED\x1b[0m r2e_tests/test_1.py::test_power - AssertionError",
    )
    # A test printing a fake summary before pytest's own: R2E-Gym's parser reads after the first
    # marker; sandlot reads after the last, the real one.
    fake = "short test summary info" + GOLD_LOG.split("short test summary info", 1)[1]
    forged = failing.replace("collected 4 items", "collected 4 items\n" + fake)
    assert not grade(inst, forged, parser=parse_log, tests_exit_code=1).resolved
    # A printed PASSED line for a test that really failed: the worst status is kept.
    doubled = failing.replace(
        "FAILED r2e_tests/test_1.py::test_modulo",
        "PASSED r2e_tests/test_1.py::test_power\nFAILED r2e_tests/test_1.py::test_modulo",
    )
    assert parse_log(doubled)["test_power"] == "FAILED"
    assert not grade(inst, doubled, parser=parse_log, tests_exit_code=1).resolved
    # All expected statuses printed while the test command failed with no failing test.
    printed = GOLD_LOG.replace(
        "FAILED r2e_tests/test_1.py::test_modulo",
        "PASSED x::y\nFAILED r2e_tests/test_1.py::test_modulo",
    )
    assert grade(inst, GOLD_LOG, parser=parse_log, tests_exit_code=1).resolved
    assert not grade(inst, printed, parser=parse_log, tests_exit_code=1).resolved


def test_r2e_rows_without_expected_output_are_an_error(tmp_path: Path) -> None:
    inst = _r2e_instance(tmp_path)
    bare = Instance.model_validate(
        {k: v for k, v in inst.model_dump().items() if k != "expected_output_json"}
    )
    with pytest.raises(ValueError, match="no expected_output_json"):
        grade(bare, GOLD_LOG, parser=parse_log, tests_exit_code=0)


def test_resolve_log_parser_selects_r2e_gym_parser(tmp_path: Path) -> None:
    assert resolve_log_parser(_r2e_instance(tmp_path)) is parse_log


def test_validate_flags_r2e_rows_prepared_with_the_old_grading(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = run_prepare("r2e_gym_subset", tmp_path, "docker").path
    assert validate_file(path).ok
    [record] = pq.read_table(path).to_pylist()
    meta = json.loads(record["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    meta["log_parser"] = "parse_log_pytest"  # what sandlot wrote before R2E-Gym's grading
    record["extra_info"]["tools_kwargs"]["reward"]["metadata"] = json.dumps(meta)
    old = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([record]), old)
    [problem] = validate_file(old).errors
    assert problem.field.endswith("log_parser") and "re-run" in problem.fix


def test_r2e_rows_name_their_graded_files_and_validate_wants_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = run_prepare("r2e_gym_subset", tmp_path, "docker").path
    inst = _r2e_instance(tmp_path)
    assert inst.graded_paths == list(GRADED_PATHS)
    assert inst.graded_artefacts() == [
        "/root/r2e_tests",
        "/root/run_tests.sh",
        "/r2e_tests",
        "/testbed/r2e_tests",
        "/testbed/run_tests.sh",
    ]
    # Every place R2E-Gym's set-up moves them to is listed.
    assert {"/root/run_tests.sh", "/root/r2e_tests"} <= {
        word.rstrip(";") for word in SETUP_CMD.split() if word.startswith("/root/r")
    }
    [record] = pq.read_table(path).to_pylist()
    meta = json.loads(record["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    del meta["graded_paths"]  # what sandlot wrote before the agent's sandbox deleted them
    record["extra_info"]["tools_kwargs"]["reward"]["metadata"] = json.dumps(meta)
    old = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pylist([record]), old)
    [problem] = validate_file(old).errors
    assert problem.field.endswith("graded_paths") and "re-run" in problem.fix


@pytest.mark.parametrize("path", ["/", "//", "/.", "", ".", "./", "..", "../x", "a/../../b"])
def test_graded_paths_never_name_the_root_the_workdir_or_a_parent(path: str) -> None:
    with pytest.raises(ValueError, match="graded_paths"):
        Instance(
            instance_id="x", base_commit="a", test_patch="", FAIL_TO_PASS=["t"], graded_paths=[path]
        )


def test_graded_artefacts_add_the_files_test_patch_creates() -> None:
    test_patch = (
        "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_new.py\n@@ -0,0 +1 @@\n+def test_x(): pass\n"
        "diff --git a/tests/test_old.py b/tests/test_old.py\n"
        "--- a/tests/test_old.py\n+++ b/tests/test_old.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    inst = Instance(
        instance_id="x",
        base_commit="a",
        test_patch=test_patch,
        FAIL_TO_PASS=["t"],
        graded_paths=["/opt/hidden", "tests/test_new.py"],
        workdir="/repo",
    )
    assert inst.graded_artefacts() == ["/opt/hidden", "/repo/tests/test_new.py"]
