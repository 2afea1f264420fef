""" "Allocated after the fence": one decision written twice, in Python in the ``local`` init
(``_is_newer``) and in POSIX sh in the remote scripts (``newer`` of ``SCAN_FUNCTIONS``), tested
here against one table on every machine.

Pids are handed out cyclically, up to ``pid_max`` and then again from 300, so "newer" depends
on whether the last pid allocated is still above the fence or has wrapped around below it.
The end-to-end checks, which steer a private PID namespace's counter across the wrap (Linux
6.14 and later), are ``tests/runtimes/test_pid_wraparound.py``.
"""

from __future__ import annotations

import subprocess

import pytest

from sandlot.sandboxes.local.init import _is_newer
from sandlot.sandboxes.shared.remote_shell import SCAN_FUNCTIONS

HIGH = 4_194_300  # near the default 64-bit pid_max (4194304)

# (fence, last pid allocated, pid) -> allocated after the fence?
CASES = [
    # No wrap since the fence: exactly the pids above it, up to the last.
    ((1000, 1005, 1003), True),
    ((1000, 1005, 1005), True),  # the last one itself
    ((1000, 1005, 1001), True),
    ((1000, 1005, 1000), False),  # the fence itself
    ((1000, 1005, 999), False),  # older
    ((1000, 1005, 1006), False),  # above the last: left over from before an earlier wrap
    ((1000, 1005, 300), False),
    ((1000, 1000, 1000), False),  # nothing allocated since the fence
    ((1000, 1000, 1001), False),
    # Wrapped: above the fence (before the wrap), or from 300 up to the last (after it).
    ((HIGH, 310, HIGH + 3), True),
    ((HIGH, 310, HIGH + 1), True),
    ((HIGH, 310, 305), True),
    ((HIGH, 310, 310), True),  # the last one itself
    ((HIGH, 310, 300), True),  # the first pid after the wrap
    ((HIGH, 310, HIGH), False),  # the fence itself
    ((HIGH, 310, HIGH - 1), False),  # older, before the fence
    ((HIGH, 310, 311), False),  # between the last and the fence: older
    ((HIGH, 310, 299), False),  # reserved: never handed out again, so older
    ((HIGH, 310, 1), False),  # init
    # A small pid_max (a private namespace's 1000): the fence right before the wrap.
    ((998, 301, 999), True),
    ((998, 301, 300), True),
    ((998, 301, 301), True),
    ((998, 301, 302), False),
    ((998, 301, 500), False),
    ((998, 301, 998), False),
    # The fence is the last pid before the wrap; the counter came round to just below it.
    ((999, 998, 999), False),
    ((999, 998, 998), True),
    ((999, 998, 300), True),
]


def _id(case: object) -> str:
    return "-".join(map(str, case)) if isinstance(case, tuple) else str(case)


@pytest.mark.parametrize(("given", "newer"), CASES, ids=_id)
def test_python_copy(given: tuple[int, int, int], newer: bool) -> None:
    fence, last, pid = given
    assert _is_newer(fence, last, pid) is newer


def test_sh_copy() -> None:
    # One /bin/sh for the table: `newer PID` reads the fence from $since, the last pid from
    # $_last (the scan reads it from /proc/loadavg), and answers with its exit status.
    script = SCAN_FUNCTIONS + (
        "while read -r since _last pid; do\n"
        '  if newer "$pid"; then echo "$since $_last $pid yes"; '
        'else echo "$since $_last $pid no"; fi\n'
        "done\n"
    )
    table = "".join(f"{f} {last} {pid}\n" for (f, last, pid), _ in CASES)
    done = subprocess.run(
        ["/bin/sh", "-c", script], input=table, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    answers = [line.rsplit(" ", 1) for line in done.stdout.splitlines()]
    expected = [[f"{f} {last} {pid}", "yes" if newer else "no"] for (f, last, pid), newer in CASES]
    assert answers == expected
