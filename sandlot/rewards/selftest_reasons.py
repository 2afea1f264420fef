"""Why a row fails ``sandlot data selftest``: the fixed vocabulary (:class:`Reason`) and the
one function that gives a row its verdict from its evaluations (:func:`row_verdict`)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.rewards.result import EvalFailure, EvalResult, EvalStatus

_NAMED = 5  # tests named in a reason's detail


class Reason(str, Enum):
    """Why a row was not kept. Every reason but ``infrastructure_error`` makes the row bad;
    an infrastructure error says nothing about the row (re-run it: ``--run-id``)."""

    ENVIRONMENT = "environment_build_failed"
    """The test environment could not be built or set up (a package, ``post_setup_cmd``, a
    missing test runner, no image or test command for the backend)."""
    REPOSITORY = "repository_unavailable"
    """The repository could not be fetched, or ``base_commit`` is not in it."""
    GOLD_DOES_NOT_APPLY = "gold_does_not_apply"
    """The gold ``patch`` (or the ``test_patch``) does not apply at ``base_commit``."""
    GOLD_DOES_NOT_RESOLVE = "gold_does_not_resolve"
    """With the gold patch, FAIL_TO_PASS tests still fail (named; a test missing from the log,
    one that does not exist, counts as failing)."""
    F2P_PASSES_BEFORE = "f2p_passes_before"
    """A FAIL_TO_PASS test passes without the fix (or the row has none: the empty patch
    resolves)."""
    P2P_FAILS = "p2p_fails"
    """A PASS_TO_PASS test fails before or after the fix (named)."""
    FLAKY = "flaky"
    """The gold runs (``--repeats``) disagree: resolved in some, or failing other tests."""
    TIMEOUT = "timeout"
    """A test command ran past its ``eval_timeout`` (``--timeout``)."""
    INFRASTRUCTURE = "infrastructure_error"
    """The sandbox or sandlot failed, or the run was interrupted: not the row's fault."""

    @property
    def bad(self) -> bool:
        """The row is at fault (everything but an infrastructure error)."""
        return self is not Reason.INFRASTRUCTURE


_ERRORS = {
    EvalFailure.ENVIRONMENT: Reason.ENVIRONMENT,
    EvalFailure.INSTANCE: Reason.ENVIRONMENT,
    EvalFailure.REPOSITORY: Reason.REPOSITORY,
    EvalFailure.PATCH: Reason.GOLD_DOES_NOT_APPLY,
    EvalFailure.TEST_PATCH: Reason.GOLD_DOES_NOT_APPLY,
}
"""The row's own errors; every other failure is an infrastructure error."""


class RowVerdict(BaseModel):
    """One row's outcome: kept, or the one reason it was not, why, and the log to read.

    Attributes:
        instance_id: the row.
        kept: gold resolves (every run alike), the empty patch does not, FAIL_TO_PASS fails
            before and passes after, PASS_TO_PASS passes both times.
        reason: why not kept (``None`` when kept).
        detail: the tests or the error behind ``reason``, one line.
        run: the evaluation that gave the reason (``before``, ``gold``, ``gold-repeat-2``...).
        statuses: each evaluation's status, by run.
    """

    instance_id: str
    kept: bool
    reason: Reason | None = None
    detail: str = ""
    run: str | None = None
    statuses: dict[str, str] = {}


def row_verdict(
    instance: Instance, before: EvalResult | None, golds: Sequence[EvalResult | None]
) -> RowVerdict:
    """The verdict on ``instance`` from its run without the fix (``before``: the empty patch,
    tests run) and its gold runs, checked in this order: a run missing (interrupted), the
    row's own errors, infrastructure errors, timeouts, disagreeing gold runs, the first gold
    run's failing tests (FAIL_TO_PASS, then PASS_TO_PASS), then the run before the fix
    (PASS_TO_PASS failing, then FAIL_TO_PASS passing).

    Args:
        instance: the row.
        before: the evaluation of the empty patch with the tests run (``None``: not run).
        golds: the evaluations of the gold patch, one per repeat (``None``: not run).
    """
    runs = [before, *golds]
    statuses = {r.model_name_or_path: r.status.value for r in runs if r is not None}

    def bad(reason: Reason, detail: str, result: EvalResult | None) -> RowVerdict:
        return RowVerdict(
            instance_id=instance.instance_id,
            kept=False,
            reason=reason,
            detail=detail,
            run=result.model_name_or_path if result is not None else None,
            statuses=statuses,
        )

    if before is None or any(g is None for g in golds) or not golds:
        return bad(Reason.INFRASTRUCTURE, "not evaluated (the run was interrupted)", None)
    done = [r for r in runs if r is not None]
    errors = [r for r in done if r.status.is_error]
    for r in errors:
        reason = _ERRORS.get(r.failure) if r.failure is not None else None
        if reason is not None:
            return bad(reason, _error_detail(r.error), r)
    if errors:
        return bad(Reason.INFRASTRUCTURE, _error_detail(errors[0].error), errors[0])
    for r in done:
        if r.status is EvalStatus.TIMED_OUT:
            return bad(Reason.TIMEOUT, "the tests ran past their timeout", r)
    gold, *repeats = [g for g in golds if g is not None]
    for r in repeats:
        if _verdict(r) != _verdict(gold):
            return bad(Reason.FLAKY, _disagreement(gold, r), r)
    if not gold.resolved:
        if gold.FAIL_TO_PASS.failure:
            return bad(
                Reason.GOLD_DOES_NOT_RESOLVE,
                "FAIL_TO_PASS failing with the gold patch: " + _names(gold.FAIL_TO_PASS.failure),
                gold,
            )
        if gold.PASS_TO_PASS.failure:
            return bad(
                Reason.P2P_FAILS,
                "PASS_TO_PASS failing with the gold patch: " + _names(gold.PASS_TO_PASS.failure),
                gold,
            )
        why = "; ".join(gold.log_warnings) or "no test result in the log"
        return bad(Reason.GOLD_DOES_NOT_RESOLVE, why.strip().splitlines()[0], gold)
    if before.PASS_TO_PASS.failure:
        return bad(
            Reason.P2P_FAILS,
            "PASS_TO_PASS failing without the fix: " + _names(before.PASS_TO_PASS.failure),
            before,
        )
    if before.FAIL_TO_PASS.success:
        return bad(
            Reason.F2P_PASSES_BEFORE,
            "FAIL_TO_PASS passing without the fix: " + _names(before.FAIL_TO_PASS.success),
            before,
        )
    if before.resolved:  # no FAIL_TO_PASS test at all
        return bad(
            Reason.F2P_PASSES_BEFORE, "no FAIL_TO_PASS test: the empty patch resolves", before
        )
    return RowVerdict(instance_id=instance.instance_id, kept=True, statuses=statuses)


def _verdict(r: EvalResult) -> tuple[bool, list[str]]:
    """What must agree between gold runs: resolved, and which graded tests failed."""
    return r.resolved, sorted(r.FAIL_TO_PASS.failure + r.PASS_TO_PASS.failure)


def _disagreement(first: EvalResult, other: EvalResult) -> str:
    a, b = _verdict(first), _verdict(other)
    changed = sorted(set(a[1]) ^ set(b[1]))
    runs = f"{first.model_name_or_path} and {other.model_name_or_path}"
    if a[0] != b[0]:
        said = f"{runs} disagree (resolved {a[0]} and {b[0]})"
    else:
        said = f"{runs} fail different tests"
    return said + (f"; tests that changed: {_names(changed)}" if changed else "")


def _names(tests: Sequence[str]) -> str:
    more = f" and {len(tests) - _NAMED} more" if len(tests) > _NAMED else ""
    return ", ".join(tests[:_NAMED]) + more


def _error_detail(error: str | None) -> str:
    """An error's first line without the command it quotes, and its output's last line
    (``environment setup failed: fetch repo from R failed with exit code 128: fatal: reference
    is not a tree: SHA``)."""
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0]
    for quote in (': "', ": '"):
        head = head.partition(quote)[0]
    return f"{head}: {lines[-1]}" if len(lines) > 1 else head
