"""The exit status of ``sandlot eval`` from its outcomes (codes in
:mod:`sandlot.cli.exit_codes`): errors first, then "nothing resolved, and not because of the
patches"."""

from __future__ import annotations

from collections.abc import Sequence

from sandlot.cli.exit_codes import ExitCode
from sandlot.rewards.predictions import GOLD
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.runner import RunOutcome

_SHOWN = 5


def eval_exit(outcomes: Sequence[RunOutcome], run_id: str) -> tuple[ExitCode, str]:
    """The exit status of a finished ``sandlot eval`` run and, when not OK, why (with the fix).

    ``ERRORS`` when an evaluation ended in ``error`` (set-up, sandbox, grading: a patch that does
    not apply is the model's verdict, not an error here); else ``NOTHING_RESOLVED`` when a
    prediction set resolved nothing although it was not the patches' fault: it is ``gold``
    (the reference patches) and evaluated some, or every one of its evaluations ran tests that
    gave no result (no test status in the log, or the tests timed out).
    """
    errored = sorted(
        (
            (r.instance_id, o.log_path(r))
            for o in outcomes
            for r in o.results.values()
            if r.status is EvalStatus.ERROR
        ),
    )
    if errored:
        ids = sorted({iid for iid, _ in errored})
        more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
        first = errored[0][1]
        return (
            ExitCode.ERRORS,
            f"{len(errored)} evaluation(s) errored ({', '.join(ids[:_SHOWN])}{more}); the "
            f"cause is in each run_instance.log (e.g. {first}); fix it and re-run with "
            f"--run-id {run_id} to retry only those",
        )
    for o in outcomes:
        ran = [r for r in o.results.values() if r.status.completed]
        if not ran or any(r.resolved for r in ran):
            continue
        if all(_no_test_result(r) for r in ran):
            return (
                ExitCode.NOTHING_RESOLVED,
                f"nothing resolved and no test gave a result in any of {len(ran)} evaluation(s) "
                f"(e.g. {o.log_path(ran[0]).with_name('test_output.txt')}): the environment "
                "does not run the tests (missing test runner or dependency, or every run timed "
                "out; see --timeout)",
            )
        if any(r.model_name_or_path == GOLD for r in ran):
            return (
                ExitCode.NOTHING_RESOLVED,
                f"the reference (gold) patches resolved none of {len(ran)} instance(s): the "
                "environment or the rows are wrong, not the patches (see each "
                f"test_output.txt beside {o.report_path})",
            )
    return ExitCode.OK, ""


def _no_test_result(r: EvalResult) -> bool:
    """The tests ran but said nothing a grader can use (a patch refused before its tests
    ran is a verdict on the patch, not this)."""
    return r.tests_timed_out or (r.tests_exit_code is not None and not r.tests_status)
