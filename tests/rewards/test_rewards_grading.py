"""Grading with swebench's parser and grading, including forged-log defences."""

from __future__ import annotations

from requirements import EVAL, need_module

from sandlot.datasets.instance import Instance
from sandlot.datasets.swebench_specs import resolve_log_parser
from sandlot.rewards.grading import grade

need_module("swebench", EVAL)


def _instance(**kw: object) -> Instance:
    fields: dict[str, object] = {
        "instance_id": "demo__demo-1",
        "repo": "sandlot-examples/demo",
        "base_commit": "0" * 40,
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_a.py::test_fixed"],
        "PASS_TO_PASS": ["tests/test_a.py::test_kept"],
        "log_parser": "parse_log_pytest",
    }
    fields.update(kw)
    return Instance.model_validate(fields)


def _grade(log: str, exit_code: int | None, **kw: object):  # type: ignore[no-untyped-def]
    inst = _instance(**kw)
    return grade(inst, log, parser=resolve_log_parser(inst), tests_exit_code=exit_code)


PASSING_LOG = """
============================= test session starts ==============================
collected 2 items

tests/test_a.py ..                                                       [100%]

=========================== short test summary info ============================
PASSED tests/test_a.py::test_fixed
PASSED tests/test_a.py::test_kept
============================== 2 passed in 0.01s ===============================
"""

FAILING_LOG = PASSING_LOG.replace(
    "PASSED tests/test_a.py::test_fixed", "FAILED tests/test_a.py::test_fixed - assert 1 == 2"
)


def test_all_pass_is_resolved() -> None:
    g = _grade(PASSING_LOG, 0)
    assert g.resolved
    assert g.fail_to_pass.success == ["tests/test_a.py::test_fixed"]
    assert g.pass_to_pass.success == ["tests/test_a.py::test_kept"]
    assert g.tests_status["tests/test_a.py::test_fixed"] == "PASSED"
    assert not g.warnings


def test_failing_f2p_is_not_resolved() -> None:
    g = _grade(FAILING_LOG, 1)
    assert not g.resolved
    assert g.fail_to_pass.failure == ["tests/test_a.py::test_fixed"]


def test_missing_test_counts_as_failed() -> None:
    log = "PASSED tests/test_a.py::test_kept\n"
    g = _grade(log, 0)
    assert not g.resolved
    assert g.fail_to_pass.failure == ["tests/test_a.py::test_fixed"]


def test_spoofed_passed_line_after_real_failure_keeps_failure() -> None:
    # A patched module prints a PASSED line at exit, after pytest's real summary.
    forged = FAILING_LOG + "PASSED tests/test_a.py::test_fixed\n"
    g = _grade(forged, 1)
    assert not g.resolved
    assert g.tests_status["tests/test_a.py::test_fixed"] == "FAILED"
    assert any("test_fixed" in w for w in g.warnings)


def test_log_claiming_success_with_failing_exit_status_is_distrusted() -> None:
    # Real output suppressed, only forged PASSED lines printed; the exit status says otherwise.
    forged = "PASSED tests/test_a.py::test_fixed\nPASSED tests/test_a.py::test_kept\n"
    g = _grade(forged, 1)
    assert not g.resolved
    assert any("exited 1" in w for w in g.warnings)


def test_nonzero_exit_with_unrelated_failures_still_grades() -> None:
    # Another test fails in both runs: the exit status is consistent with the log.
    log = PASSING_LOG + "FAILED tests/test_b.py::test_flaky - boom\n"
    g = _grade(log, 1)
    assert g.resolved
    assert not g.warnings


def test_empty_fail_to_pass_and_pass_to_pass_follow_swebench() -> None:
    # swebench counts an empty F2P list as fully passing (compute_fail_to_pass returns 1).
    g = _grade("", 0, FAIL_TO_PASS=[], PASS_TO_PASS=[])
    assert g.resolved
