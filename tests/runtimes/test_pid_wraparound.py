"""Stopping a session's command when pids wrap around between its fence and its processes.

A session tells the running command's processes from earlier background jobs by pid: those
allocated after the fence of the protocol's ``S`` marker. Pids are handed out cyclically (up
to ``pid_max``, then again from 300), so a command's processes may have pids below its fence.
Where a sandbox shares a busy PID namespace (``local`` with ``isolation="none"``, a Modal-like
container that the fake runs on the host) that happens within minutes.

These tests steer the counter of a private PID namespace of their own (``unshare``; its own
``pid_max`` needs Linux 6.14), never the host's, which other programs rely on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandlot.sandboxes.shared import remote_shell

PID_MAX = 1000
"""``pid_max`` of the private namespace: a wrap costs 700 pids, not 4 million."""

REPO = Path(__file__).parents[2]


def _in_pid_namespace(argv: list[str], env: dict[str, str] | None = None) -> str:
    """stdout of ``argv`` run as PID 1's child in a new user and PID namespace whose
    ``pid_max`` is :data:`PID_MAX` (skips where the system cannot give one)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    setup = f'echo {PID_MAX} >/proc/sys/kernel/pid_max && exec "$@"'
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc",
         "sh", "-c", setup, "sh", *argv],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip
    if done.returncode != 0 and "pid_max" in done.stderr:
        pytest.skip(f"no private pid_max here (needs Linux 6.14): {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return done.stdout


# For each position j, the fence gets pid PID_MAX - j and three marked processes follow
# it, the wrap falling between the fence and them or among them; an older marked job and a
# newer process with another marker must survive. Prints the old job's pid, then per position
# "j fence other new new new | survivors". The script runs once every process has executed
# `sleep`: before, a forked child's environ is still its parent's as the parent was started,
# without the marker exported since.
_SIGNAL_DRIVER = """
execd() {
  local pid comm
  for pid; do until IFS= read -r comm </proc/"$pid"/comm && [ "$comm" = sleep ]; do :; done; done
}
export SANDLOT_EXEC_ID=wrap-test
sleep 1000 & old=$!; echo "$old"
for j in 1 2 3; do
  echo $((PID_MAX - 1 - j)) >/proc/sys/kernel/ns_last_pid
  sh -c : & fence=$!; wait "$fence"
  sleep 1000 & a=$!; sleep 1000 & b=$!; sleep 1000 & c=$!
  SANDLOT_EXEC_ID=other sleep 1000 & o=$!
  execd "$old" "$a" "$b" "$c" "$o"
  sh -c "$SCRIPT" "SANDLOT_EXEC_ID=wrap-test" KILL "$fence"
  sleep 0.3
  alive=
  for p in "$old" "$o" "$a" "$b" "$c"; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
  echo "$j $fence $o $a $b $c |$alive"
  kill -9 "$o" "$a" "$b" "$c" 2>/dev/null; wait "$o" "$a" "$b" "$c" 2>/dev/null
done
kill -9 "$old"; exit 0
"""


def test_remote_signal_reaches_the_processes_after_the_wrap() -> None:
    out = _in_pid_namespace(
        ["bash", "-c", _SIGNAL_DRIVER],
        env={"SCRIPT": remote_shell.SIGNAL_NEWER_SCRIPT, "PID_MAX": str(PID_MAX)},
    )
    old, *rows = out.splitlines()
    assert len(rows) == 3, out
    for row in rows:
        spawned, alive = row.split("|")
        j, fence, other, *new = map(int, spawned.split())
        assert min(new) < fence, f"position {j} did not wrap: {out}"
        assert sorted(map(int, alive.split())) == sorted([int(old), other]), out


# The session's command forks two processes after its fence, which gets pid PID_MAX - j.
_SESSION_DRIVER = textwrap.dedent(
    """
    import anyio, sandlot
    from sandlot.runtimes import SessionConfig

    async def main():
        async with sandlot.open("local", isolation="none") as sb:
            shell = await sb.shell("wrap", config=SessionConfig(interrupt_grace_s=0.3))
            old = (await shell.run("sleep 1000 >/dev/null 2>&1 & echo $!")).output.strip()
            for j in range(6):
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                    f.write(str(PID_MAX - 1 - j))
                r = await shell.run("sleep 300 | sleep 300; echo never", timeout=0.3)
                print(j, r.timed_out, r.shell_restarted, "never" in r.output, r.duration_s)
            print("old", (await shell.run(f"kill -0 {old} && echo alive")).output.strip())

    anyio.run(main)
    """
)


@pytest.mark.e2e
def test_local_session_stops_a_command_across_the_wrap() -> None:
    out = _in_pid_namespace(
        [sys.executable, "-c", f"PID_MAX = {PID_MAX}\n{_SESSION_DRIVER}"],
        env={"PYTHONPATH": str(REPO)},
    )
    *runs, old = out.splitlines()
    assert len(runs) == 6, out
    for line in runs:
        _, timed_out, restarted, never, duration = line.split()
        # Stopped by the first SIGINT to its pipeline, not by giving the shell up.
        assert (timed_out, restarted, never) == ("True", "False", "False"), out
        assert float(duration) < 5, out
    assert old == "old alive", out
