"""Parse a test log and grade it with the ``swebench`` harness's own parsers and grading.

Grading is ``swebench.harness.grading.get_eval_tests_report`` + ``get_resolution_status`` of
the installed swebench (4.1, or 5.x whose rules differ: a skipped ``FAIL_TO_PASS`` test fails,
a skipped ``PASS_TO_PASS`` test is kept, a truncated parametrized id matches by prefix): an
instance is resolved when every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passed
(``RESOLVED_FULL``). The rule (``EvalType``) is the row's ``eval_type`` when it has one (5.x rows
do), else ``FAIL_ONLY`` for ``FAIL_ONLY_REPOS``. Two defences against logs forged by the code
under test sit in front of it, in the spirit of SWE-bench 5's spoof-resistant grading (#620):

* a test reported with conflicting statuses (a real ``FAILED`` line and a printed ``PASSED``
  line) keeps its worst status;
* a log that shows no failing test while the test command's exit status, which travels out of
  band, says it failed, is distrusted: nothing in it counts as passed.

Under 5.x a third one is its own: a log with no parsed test and no sign that a suite ran
(``swebench.harness.grading.SUITE_RAN``) passes nothing, so a ``fail_only`` row whose runner never
started is not resolved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sandlot._optional import require
from sandlot.datasets.instance import Instance
from sandlot.datasets.swebench_tasks import eval_type_of
from sandlot.rewards.r2e_grading import grade_r2e, is_r2e_gym
from sandlot.rewards.result import TestOutcome

LogParser = Callable[[str, Any], dict[str, str]]

_FAILING = ("FAILED", "ERROR")
_PASSING = ("PASSED", "XFAIL")
# Ranking used when one test shows up with several statuses: the worst wins.
_SEVERITY = {"ERROR": 4, "FAILED": 3, "SKIPPED": 2, "XFAIL": 1, "PASSED": 0}


@dataclass
class Grade:
    """The graded outcome of one test log."""

    resolved: bool
    tests_status: dict[str, str]
    fail_to_pass: TestOutcome
    pass_to_pass: TestOutcome
    warnings: list[str] = field(default_factory=list)


def parser_context(instance: Instance) -> Any:
    """The ``test_spec`` argument swebench's parsers take; they read only these attributes."""
    return SimpleNamespace(
        instance_id=instance.instance_id,
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=instance.FAIL_TO_PASS,
        PASS_TO_PASS=instance.PASS_TO_PASS,
    )


def parse_statuses(log: str, parser: LogParser, context: Any) -> tuple[dict[str, str], list[str]]:
    """Run ``parser`` over ``log``; resolve tests reported with conflicting statuses.

    Returns:
        ``(test id → status, warnings)``; each warning names a test whose statuses conflicted.
    """
    statuses = dict(parser(log, context))
    seen: dict[str, set[str]] = {}
    for line in log.splitlines():
        try:
            found = parser(line, context)
        except Exception:  # a parser that needs multi-line context may choke on one line
            continue
        for test, status in found.items():
            seen.setdefault(test, set()).add(status)
    warnings = []
    for test, reported in sorted(seen.items()):
        if len(reported) > 1:
            worst = max(reported, key=lambda s: _SEVERITY.get(s, 5))
            statuses[test] = worst
            warnings.append(f"test {test} reported as {', '.join(sorted(reported))}; kept {worst}")
    return statuses, warnings


def grade(
    instance: Instance,
    log: str,
    *,
    parser: LogParser,
    tests_exit_code: int | None,
) -> Grade:
    """Grade ``log`` (the test command's output) for ``instance``.

    Args:
        instance: supplies ``FAIL_TO_PASS``, ``PASS_TO_PASS`` and ``repo``.
        log: the test command's output, nothing else.
        parser: a ``swebench.harness.log_parsers`` function.
        tests_exit_code: the test command's exit status, observed outside the log.

    R2E-Gym rows (``log_parser`` ``r2e_gym``) are graded by R2E-Gym's own rule instead
    (:mod:`sandlot.rewards.r2e_grading`; ``FAIL_TO_PASS`` reports the tests expected to pass).

    Raises:
        BackendUnavailableError: ``swebench`` is not installed (extra ``sandlot[eval]``).
        ValueError: an R2E-Gym row without a valid ``expected_output_json``.
    """
    if is_r2e_gym(instance):
        r2e = grade_r2e(instance, log, tests_exit_code=tests_exit_code)
        return Grade(r2e.resolved, r2e.tests_status, r2e.expected_pass, TestOutcome(), r2e.warnings)
    statuses, warnings = parse_statuses(log, parser, parser_context(instance))
    any_failing = any(s in _FAILING for s in statuses.values())
    trusted = statuses
    if tests_exit_code not in (None, 0) and not any_failing:
        warnings.append(
            f"test command exited {tests_exit_code} but the log shows no failing test; "
            "the log is not trusted and no test counts as passed"
        )
        trusted = {}
    suite_ran = getattr(require("swebench.harness.grading", "eval"), "SUITE_RAN", None)
    if not statuses and suite_ran is not None and not suite_ran.search(log):
        warnings.append("the log shows no test and no sign that a test suite ran")
        trusted = {test: "FAILED" for test in instance.FAIL_TO_PASS}
    graded = grade_statuses(instance, trusted)
    graded.tests_status = statuses
    graded.warnings = warnings
    return graded


def grade_statuses(instance: Instance, statuses: dict[str, str]) -> Grade:
    """Grade ``statuses`` (test id → swebench ``TestStatus`` value) for ``instance``, with
    ``swebench``'s own report and resolution rules; the source of the statuses is the
    caller's (a parsed log, or the pytest channel of ``sandlot.rewards.integrity``).

    Raises:
        BackendUnavailableError: ``swebench`` is not installed (extra ``sandlot[eval]``).
        TaskRepoError: the row's ``eval_type`` is not ``pass_and_fail`` or ``fail_only``.
    """
    constants = require("swebench.harness.constants", "eval")
    grading = require("swebench.harness.grading", "eval")
    row_eval_type = eval_type_of(instance.model_extra, instance.instance_id)
    if row_eval_type is not None:
        eval_type = constants.EvalType(row_eval_type)
    elif instance.repo in constants.FAIL_ONLY_REPOS:
        eval_type = constants.EvalType.FAIL_ONLY
    else:
        eval_type = constants.EvalType.PASS_AND_FAIL
    report = grading.get_eval_tests_report(
        statuses,
        {
            constants.FAIL_TO_PASS: instance.FAIL_TO_PASS,
            constants.PASS_TO_PASS: instance.PASS_TO_PASS,
        },
        eval_type=eval_type,
    )
    resolved = grading.get_resolution_status(report) == constants.ResolvedStatus.FULL.value
    return Grade(
        resolved=resolved,
        tests_status=dict(statuses),
        fail_to_pass=TestOutcome(**report[constants.FAIL_TO_PASS]),
        pass_to_pass=TestOutcome(**report[constants.PASS_TO_PASS]),
    )
