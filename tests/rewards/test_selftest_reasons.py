"""A row's selftest verdict from its evaluations: one reason each, in the documented order."""

from __future__ import annotations

import pytest

from sandlot.datasets.instance import Instance
from sandlot.rewards.result import EvalFailure, EvalResult, EvalStatus
from sandlot.rewards.result import TestOutcome as Outcome
from sandlot.rewards.selftest_reasons import Reason, row_verdict

ROW = Instance(
    instance_id="o__r-1",
    base_commit="abc",
    patch="diff",
    test_patch="",
    FAIL_TO_PASS=["t::f2p"],
    PASS_TO_PASS=["t::p2p"],
)


def _run(
    model: str,
    status: EvalStatus = EvalStatus.RESOLVED,
    *,
    f2p: tuple[list[str], list[str]] = (["t::f2p"], []),
    p2p: tuple[list[str], list[str]] = (["t::p2p"], []),
    error: str | None = None,
    failure: EvalFailure | None = None,
) -> EvalResult:
    """An evaluation of ``ROW`` (``f2p``/``p2p``: passing and failing tests)."""
    return EvalResult(
        instance_id=ROW.instance_id,
        model_name_or_path=model,
        status=status,
        resolved=status is EvalStatus.RESOLVED,
        FAIL_TO_PASS=Outcome(success=f2p[0], failure=f2p[1]),
        PASS_TO_PASS=Outcome(success=p2p[0], failure=p2p[1]),
        error=error,
        failure=failure,
    )


def _before(
    status: EvalStatus = EvalStatus.UNRESOLVED,
    *,
    f2p: tuple[list[str], list[str]] = ([], ["t::f2p"]),
    p2p: tuple[list[str], list[str]] = (["t::p2p"], []),
    failure: EvalFailure | None = None,
) -> EvalResult:
    """The run without the fix (by default as it should be: F2P failing, P2P passing)."""
    return _run("before", status, f2p=f2p, p2p=p2p, failure=failure)


def test_good_row_is_kept() -> None:
    verdict = row_verdict(ROW, _before(), [_run("gold"), _run("gold-repeat-2")])
    assert verdict.kept and verdict.reason is None
    assert verdict.statuses == {
        "before": "unresolved",
        "gold": "resolved",
        "gold-repeat-2": "resolved",
    }


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (EvalFailure.ENVIRONMENT, Reason.ENVIRONMENT),
        (EvalFailure.INSTANCE, Reason.ENVIRONMENT),
        (EvalFailure.REPOSITORY, Reason.REPOSITORY),
        (EvalFailure.PATCH, Reason.GOLD_DOES_NOT_APPLY),
        (EvalFailure.TEST_PATCH, Reason.GOLD_DOES_NOT_APPLY),
        (EvalFailure.INFRASTRUCTURE, Reason.INFRASTRUCTURE),
    ],
)
def test_an_error_gives_the_reason_of_its_failure(failure: EvalFailure, reason: Reason) -> None:
    error = _run("gold", EvalStatus.ERROR, error="it broke", failure=failure)
    verdict = row_verdict(ROW, _before(), [error])
    assert (verdict.kept, verdict.reason, verdict.run) == (False, reason, "gold")
    assert reason.bad is (failure is not EvalFailure.INFRASTRUCTURE)


def test_the_rows_own_error_wins_over_an_infrastructure_error() -> None:
    infra = _before(status=EvalStatus.ERROR, failure=EvalFailure.INFRASTRUCTURE)
    repo = _run("gold", EvalStatus.ERROR, error="x", failure=EvalFailure.REPOSITORY)
    assert row_verdict(ROW, infra, [repo]).reason is Reason.REPOSITORY


def test_a_setup_error_is_named_by_its_command_and_its_last_output_line() -> None:
    error = (
        'environment setup failed: fetch repo from /r failed with exit code 128: "set -e\\n"\n'
        "--- last output ---\nfatal: reference is not a tree: 0123"
    )
    run = _run("before", EvalStatus.ERROR, error=error, failure=EvalFailure.REPOSITORY)
    verdict = row_verdict(ROW, run, [_run("gold")])
    assert verdict.detail == (
        "environment setup failed: fetch repo from /r failed with exit code 128: "
        "fatal: reference is not a tree: 0123"
    )


def test_an_interrupted_row_is_an_infrastructure_error() -> None:
    verdict = row_verdict(ROW, _before(), [None])
    assert verdict.reason is Reason.INFRASTRUCTURE and not verdict.reason.bad


def test_a_timeout_in_any_run() -> None:
    verdict = row_verdict(ROW, _before(status=EvalStatus.TIMED_OUT), [_run("gold")])
    assert (verdict.reason, verdict.run) == (Reason.TIMEOUT, "before")


def test_gold_runs_that_disagree_are_flaky() -> None:
    unresolved = _run("gold-repeat-2", EvalStatus.UNRESOLVED, p2p=([], ["t::p2p"]))
    verdict = row_verdict(ROW, _before(), [_run("gold"), unresolved])
    assert verdict.reason is Reason.FLAKY
    assert "t::p2p" in verdict.detail


def test_gold_runs_failing_other_tests_are_flaky() -> None:
    a = _run("gold", EvalStatus.UNRESOLVED, f2p=([], ["t::f2p"]))
    b = _run("gold-repeat-2", EvalStatus.UNRESOLVED, p2p=([], ["t::p2p"]))
    assert row_verdict(ROW, _before(), [a, b]).reason is Reason.FLAKY


def test_gold_that_leaves_f2p_failing_names_the_tests() -> None:
    gold = _run("gold", EvalStatus.UNRESOLVED, f2p=([], ["t::f2p"]))
    verdict = row_verdict(ROW, _before(), [gold])
    assert verdict.reason is Reason.GOLD_DOES_NOT_RESOLVE
    assert verdict.detail.endswith("t::f2p")


def test_gold_that_breaks_p2p() -> None:
    gold = _run("gold", EvalStatus.UNRESOLVED, p2p=([], ["t::p2p"]))
    assert row_verdict(ROW, _before(), [gold]).reason is Reason.P2P_FAILS


def test_f2p_passing_before_the_fix() -> None:
    verdict = row_verdict(ROW, _before(f2p=(["t::f2p"], [])), [_run("gold")])
    assert (verdict.reason, verdict.run) == (Reason.F2P_PASSES_BEFORE, "before")


def test_p2p_failing_before_the_fix() -> None:
    before = _before(p2p=([], ["t::p2p"]))
    assert row_verdict(ROW, before, [_run("gold")]).reason is Reason.P2P_FAILS


def test_a_row_without_f2p_tests_that_the_empty_patch_resolves() -> None:
    row = ROW.model_copy(update={"FAIL_TO_PASS": []})
    before = _run("before", EvalStatus.RESOLVED, f2p=([], []))
    verdict = row_verdict(row, before, [_run("gold", f2p=([], []))])
    assert verdict.reason is Reason.F2P_PASSES_BEFORE
