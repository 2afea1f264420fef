"""The shell snippets the backend runs inside the container (POSIX ``sh``; bash optional).

The image needs ``/bin/sh``, ``sleep``, ``grep`` and ``/proc``, which every image able to run
shell commands has.
"""

from __future__ import annotations

import math

# PID 1. `sleep & wait` keeps the shell in `wait`, which reaps every child it is handed
# (orphans of exec'd commands are re-parented to PID 1) and returns at once on SIGTERM, so
# `docker stop` is immediate; a bare `sleep infinity` as PID 1 ignores SIGTERM and makes stop
# wait for its timeout. When the shell exits the kernel kills everything else in the container's
# PID namespace, which is how the lifetime ($0 seconds, spec.timeout_s) is enforced for free.
INIT_SCRIPT = 'trap "exit 0" TERM; sleep "$0" & wait $!'

# Environment variable carrying a per-exec random marker. Descendants inherit it even when they
# leave the process group (setsid, daemons), so they can all be found in /proc.
EXEC_MARKER_ENV = "SANDLOT_EXEC_ID"

# `scan` sets $pids to the live processes whose environment holds "$m", except this shell.
# A killed process is a zombie whose environ reads empty, so it stops matching; the grep (or
# command-substitution subshell) that matched itself is gone by the time of the -d test.
_SCAN = """
scan() {
  pids=
  for f in $(grep -lsF -- "$m" /proc/[0-9]*/environ); do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" != "$$" ] && [ -d "/proc/$p" ] && pids="$pids $p"
  done
}
kill_all() {
  i=0; scan
  while [ -n "$pids" ] && [ "$i" -lt 50 ]; do
    for p in $pids; do kill -s KILL -- "-$p" "$p" 2>/dev/null; done
    i=$((i+1)); scan
  done
}
"""

# Every exec runs under this wrapper ($1 = directory, $2 = command line). The command gets bash
# when the image has it, else sh, decided in-container by a builtin (no extra API round trip).
# `cd` instead of the API's WorkingDir gives the same error for a missing directory on Docker
# and Podman. Once the command exits, whatever it left running (background jobs, daemons) is
# killed: those hold the output pipes open, and the engine would otherwise keep the exec
# attached until they end.
EXEC_WRAPPER = (
    _SCAN
    + """
cd -- "$1" || exit
if command -v bash >/dev/null 2>&1; then bash -c "$2"; else sh -c "$2"; fi
rc=$?
m="SANDLOT_EXEC_ID=$SANDLOT_EXEC_ID"
kill_all
exit "$rc"
"""
)

# Kills every process that carries the marker ($0) and its process group: SIGTERM, up to $1
# ticks of 0.1 s for them to go, then SIGKILL until none is left. Processes spawned while a
# round runs are caught by the next round.
KILL_SCRIPT = (
    _SCAN
    + """
m="$0"
scan
for p in $pids; do kill -s TERM -- "-$p" "$p" 2>/dev/null; done
i=0; while [ -n "$pids" ] && [ "$i" -lt "$1" ]; do sleep 0.1; i=$((i+1)); scan; done
kill_all
"""
)


def init_argv(lifetime_s: float) -> list[str]:
    """Entrypoint of the container: PID 1 that lives ``lifetime_s`` seconds (rounded up)."""
    return ["/bin/sh", "-c", INIT_SCRIPT, str(max(1, math.ceil(lifetime_s)))]


def exec_argv(command: str, cwd: str) -> list[str]:
    """argv of one exec: run the shell line ``command`` in directory ``cwd``."""
    # "sandlot" is $0, the name the shell puts in front of its own error messages.
    return ["/bin/sh", "-c", EXEC_WRAPPER, "sandlot", cwd, command]


def kill_argv(marker: str, grace_s: float) -> list[str]:
    """argv of the killer for the exec tagged ``marker``, with ``grace_s`` seconds of SIGTERM."""
    ticks = math.ceil(grace_s * 10)
    return ["/bin/sh", "-c", KILL_SCRIPT, f"{EXEC_MARKER_ENV}={marker}", str(ticks)]


def mkdir_argv(path: str) -> list[str]:
    """argv creating the directory ``path`` with its parents."""
    return ["mkdir", "-p", "--", path]
