"""Tell a test command that could not start from tests that ran and failed.

When the test runner or its interpreter is missing, nothing was tested: the instance is an
``error`` of the environment, not ``unresolved``. The signs, all from the shell or the
interpreter itself rather than from the tests:

* exit status 127 (``command not found``, a missing interpreter in a shebang) or 126 (not
  executable), the POSIX shell's statuses for a command that could not be run;
* CPython's own message for ``python -m MODULE`` when ``MODULE`` is not installed,
  ``/path/python3: No module named pytest`` (an import error inside the tests reads
  ``ModuleNotFoundError: No module named 'x'`` and is the tests' failure, not this).
"""

from __future__ import annotations

import re

_NO_RUNNER_MODULE = re.compile(r"^(?P<python>\S*python[\d.]*): No module named (?P<module>\S+)$")
_CANNOT_RUN = re.compile(r"(command not found|No such file or directory|Permission denied)$")
_NOT_RUN_STATUSES = {126: "is not executable", 127: "was not found"}


def missing_runner(log: str, exit_code: int | None) -> str | None:
    """Why the test command could not start, or ``None`` when it ran.

    Args:
        log: the test command's combined output.
        exit_code: its exit status (``None`` when it timed out).

    Returns:
        A one-line reason naming the missing program or module and what to do, e.g.
        ``"the test runner is missing: /usr/bin/python3: No module named pytest; ..."``.
    """
    if exit_code in (None, 0):
        return None
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in lines:
        match = _NO_RUNNER_MODULE.match(line)
        if match:
            return (
                f"the test runner is missing: {line}; give the instance an environment that "
                f'installs it (e.g. "environment": {{"pip_packages": '
                f'["{match["module"]}"]}}) or an image that has it'
            )
    if exit_code in _NOT_RUN_STATUSES:
        culprit = next((ln for ln in lines if _CANNOT_RUN.search(ln)), None)
        if culprit is not None:
            return (
                f"the test command could not start (exit {exit_code}: a program it runs "
                f"{_NOT_RUN_STATUSES[exit_code]}): {culprit}; check the instance's test_cmd "
                "and that its environment or image provides that program"
            )
    return None
