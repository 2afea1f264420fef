"""Grade an R2E-Gym row the way R2E-Gym does: its log parser and its exact comparison.

Source: ``DockerRuntime._calculate_reward_r2e`` in ``src/r2egym/agenthub/runtime/docker.py``
(github.com/R2E-Gym/R2E-Gym). The test log is parsed with R2E-Gym's ``parse_log_pytest``
(:func:`sandlot.datasets.r2e_gym.parse_log`); both the parsed map and the row's
``expected_output_json`` are keyed by :func:`~sandlot.datasets.r2e_gym.test_key`; the row is
resolved (reward 1.0) when the two maps are equal: the same tests, each with its expected
status. A test expected to ``FAILED`` must still fail, one missing from the log or one the
log adds makes the row unresolved.

One defence in front of it, shared with :mod:`sandlot.rewards.grading`: when the test
command's exit status says it failed but the log shows no failing test, the log is not
trusted and the row is unresolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandlot.datasets.instance import Instance
from sandlot.datasets.r2e_gym import R2E_GYM_LOG_PARSER, expected_statuses, parse_log
from sandlot.rewards.result import TestOutcome

_FAILING = ("FAILED", "ERROR")


@dataclass
class R2EGrade:
    """The outcome of one R2E-Gym test log.

    Attributes:
        resolved: the parsed statuses equal the expected ones.
        tests_status: the parsed ``{test key: status}``.
        expected_pass: the tests expected to pass, split by whether they passed.
        expected_fail: the tests expected to fail or error, split by whether they did.
        warnings: each difference from the expected map, and a distrusted log.
    """

    resolved: bool
    tests_status: dict[str, str]
    expected_pass: TestOutcome
    expected_fail: TestOutcome
    warnings: list[str] = field(default_factory=list)


def is_r2e_gym(instance: Instance) -> bool:
    """``True`` for instances graded by R2E-Gym's rule (``log_parser`` ``"r2e_gym"``)."""
    return instance.log_parser == R2E_GYM_LOG_PARSER


def grade_r2e(instance: Instance, log: str, *, tests_exit_code: int | None) -> R2EGrade:
    """Grade ``log`` (the output of the row's ``run_tests.sh``) against ``expected_output_json``.

    Args:
        instance: an R2E-Gym instance; ``expected_output_json`` is one of its extra fields.
        log: the test command's output.
        tests_exit_code: the test command's exit status, observed outside the log.

    Raises:
        ValueError: the instance has no ``expected_output_json`` or it is not a JSON object
            (the message names the instance).
    """
    raw = (instance.model_extra or {}).get("expected_output_json")
    if raw is None:
        raise ValueError(
            f"instance {instance.instance_id!r} is graded as R2E-Gym (log_parser "
            f"{R2E_GYM_LOG_PARSER!r}) but has no expected_output_json; re-run "
            "`sandlot data prepare r2e_gym_subset`"
        )
    try:
        expected = expected_statuses(raw)
    except ValueError as exc:
        raise ValueError(f"instance {instance.instance_id!r}: {exc}") from None
    parsed = parse_log(log)
    warnings: list[str] = []
    trusted = parsed
    if tests_exit_code not in (None, 0) and not any(s in _FAILING for s in parsed.values()):
        warnings.append(
            f"test command exited {tests_exit_code} but the log shows no failing test; "
            "the log is not trusted"
        )
        trusted = {}
    for test in sorted(expected.keys() | trusted.keys()):
        want, got = expected.get(test), trusted.get(test)
        if want != got:
            warnings.append(
                f"test {test}: expected {want or 'absent'}, log shows {got or 'nothing'}"
            )
    expected_pass, expected_fail = TestOutcome(), TestOutcome()
    for test, want in sorted(expected.items()):
        outcome = expected_pass if want == "PASSED" else expected_fail
        (outcome.success if trusted.get(test) == want else outcome.failure).append(test)
    return R2EGrade(
        resolved=bool(expected) and trusted == expected,
        tests_status=parsed,
        expected_pass=expected_pass,
        expected_fail=expected_fail,
        warnings=warnings,
    )
