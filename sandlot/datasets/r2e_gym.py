"""R2E-Gym's test format: how its images run the graded tests, how it reads their log, and how
it keys the expected statuses.

Read from github.com/R2E-Gym/R2E-Gym (``src/r2egym``):

- The image's ``run_tests.sh`` runs ``pytest -rA r2e_tests`` (``repo_analysis/
  repo_analysis_args.py``); ``DockerRuntime.run_tests`` (``agenthub/runtime/docker.py``) strips
  ANSI colour codes and carriage returns from its output.
- ``repo_analysis/execution_log_parser.py`` ``parse_log_pytest`` reads only the part of the log
  after ``short test summary info`` and keys each result line by
  ``".".join(line.split("::")[1:])``, dropping the file path: ``PASSED
  r2e_tests/test_1.py::TestX::test_y`` is ``TestX.test_y``; a ``FAILED``/``ERROR`` line is cut
  at ``" - "``. A line is classified by the first of ``PASSED``, ``FAILED``, ``ERROR`` it
  *contains*.
- ``DockerRuntime._calculate_reward_r2e`` strips colour codes from the keys of both maps
  (``decolor_dict_keys``), cuts both at ``" - "``, and gives 1.0 when the two maps have the
  same size and every parsed test has its expected status: tests expected to fail must fail.

:func:`parse_log` follows the parser with two differences that only matter for forged logs:
it reads after the *last* ``short test summary info`` (pytest prints it once, at the end; the
original reads after the first, so a test printing the marker hides the real summary), and a
test listed with several statuses keeps its worst instead of its last.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sandlot.datasets.errors import DatasetMessageError

R2E_GYM_LOG_PARSER = "r2e_gym"
"""``Instance.log_parser`` of R2E-Gym rows: graded by :mod:`sandlot.rewards.r2e_grading`."""

SETUP_CMD = """\
set -e
ln -sfn /testbed/.venv /root/.venv
mkdir -p /root/.local/bin
ln -sf /testbed/.venv/bin/python /root/.local/bin/python
ln -sf /testbed/.venv/bin/python /root/.local/bin/python3
find /testbed/.venv/bin -type f -executable -exec ln -sf {} /root/.local/bin/ \\;
find /testbed -name '*.pyc' -delete
find /testbed -name __pycache__ -prune -exec rm -rf {} +
if [ -e /testbed/run_tests.sh ]; then mv /testbed/run_tests.sh /root/run_tests.sh; fi
if [ -d /testbed/r2e_tests ]; then mv /testbed/r2e_tests /root/r2e_tests; fi
if [ -d /r2e_tests ] && [ ! -e /root/r2e_tests ]; then mv /r2e_tests /root/r2e_tests; fi
if [ -d /root/r2e_tests ]; then
  find /root/r2e_tests -name '*.pyc' -delete
  find /root/r2e_tests -name __pycache__ -prune -exec rm -rf {} +
fi"""
"""R2E-Gym's ``DockerRuntime.setup_env``: its venv on ``PATH``, no stale bytecode, the graded
tests and their runner out of ``/testbed``."""

GRADED_PATHS = ("/root/r2e_tests", "/root/run_tests.sh", "/r2e_tests", "r2e_tests", "run_tests.sh")
"""``Instance.graded_paths`` of R2E-Gym rows: where its images keep the hidden tests and their
runner (``/r2e_tests``, the repository's ``r2e_tests`` and ``run_tests.sh``) and where
:data:`SETUP_CMD` moves them (``/root``). The agent's sandbox deletes them at set-up; the
evaluation's fresh sandbox gets them from the image."""

TEST_CMD = """\
rm -rf r2e_tests && ln -s /root/r2e_tests r2e_tests
bash /root/run_tests.sh
rc=$?
rm -f r2e_tests
exit $rc"""
"""Run the graded tests with ``r2e_tests`` linked into the repository for the run only
(R2E-Gym's ``DockerRuntime.run_tests``)."""

SUMMARY_MARKER = "short test summary info"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CLEAN = re.compile(r"\x1b\[[0-9;]*m|\r")
# Checked in this order, by substring, as R2E-Gym's parser does.
_STATUSES = ("PASSED", "FAILED", "ERROR")
_SEVERITY = {"PASSED": 0, "FAILED": 1, "ERROR": 2}


def test_key(raw: str) -> str:
    """A test id as R2E-Gym compares it: colour codes removed, cut at ``" - "``."""
    return _ANSI.sub("", raw).split(" - ")[0]


def parse_log(log: str, test_spec: Any = None) -> dict[str, str]:
    """``{test key: "PASSED" | "FAILED" | "ERROR"}`` from the output of ``run_tests.sh``.

    Args:
        log: the test command's combined output.
        test_spec: unused; present so the function has the signature of swebench's parsers.

    Returns:
        An empty map when the log has no pytest short test summary (the tests did not run).
    """
    text = _CLEAN.sub("", log)
    if SUMMARY_MARKER not in text:
        return {}
    statuses: dict[str, str] = {}
    for line in text.rsplit(SUMMARY_MARKER, 1)[1].strip().split("\n"):
        status = next((s for s in _STATUSES if s in line), None)
        if status is None:
            continue
        key = test_key(".".join(line.split("::")[1:]))
        previous = statuses.get(key)
        if previous is None or _SEVERITY[status] > _SEVERITY[previous]:
            statuses[key] = status
    return statuses


def expected_statuses(expected_output_json: Any) -> dict[str, str]:
    """The row's ``expected_output_json`` (JSON text or an object) keyed as R2E-Gym compares.

    Raises:
        DatasetMessageError: not a JSON object of ``{test id: status string}``.
    """
    value = expected_output_json
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetMessageError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(s, str) for s in value.values()):
        raise DatasetMessageError("expected_output_json must be a JSON object {test id: status}")
    return {test_key(str(k)): v for k, v in value.items()}


def passing_tests(expected_output_json: Any) -> list[str]:
    """Sorted keys of the tests ``expected_output_json`` expects to pass.

    Raises:
        DatasetMessageError: not a JSON object, or no test is expected to pass.
    """
    passed = sorted(k for k, s in expected_statuses(expected_output_json).items() if s == "PASSED")
    if not passed:
        raise DatasetMessageError("no test is expected to pass; cannot grade")
    return passed
