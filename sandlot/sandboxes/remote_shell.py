"""Shell snippets that the container backends (``docker``, ``modal``, ``vefaas``) run inside the
sandbox.

A remote exec API starts one process and streams its output; it does not know about the
processes that process starts. These POSIX ``sh`` snippets give every exec the contract's
semantics: the command runs with ``bash`` (``sh`` when the image has none) in its working
directory, and once it exits, or when the caller times out or is cancelled, *every* process it
started is killed, including background jobs that would otherwise hold the output streams open.

Processes are found by an environment marker (``SANDLOT_EXEC_ID=<random>``) that descendants
inherit even when they leave the process group (``setsid``, daemons), by scanning
``/proc/*/environ``. The image needs ``/bin/sh``, ``grep``, ``sleep`` and ``/proc``, which every
image able to run shell commands has.
"""

from __future__ import annotations

import math

# PID 1. `sleep & wait` keeps the shell in `wait`, which reaps every child it is handed
# (orphans of exec'd commands are re-parented to PID 1) and returns at once on SIGTERM, so
# stopping the sandbox is immediate; a bare `sleep infinity` as PID 1 ignores SIGTERM and makes
# `docker stop` wait for its timeout. When the shell exits the kernel kills everything else in
# the PID namespace, which is how a lifetime ($0 seconds) is enforced for free.
INIT_SCRIPT = 'trap "exit 0" TERM; sleep "$0" & wait $!'

EXEC_MARKER_ENV = "SANDLOT_EXEC_ID"
"""Environment variable carrying a per-exec random marker, inherited by every descendant."""

SCAN_FUNCTIONS = """
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
"""Shell functions for scripts that start with them: ``scan`` sets ``$pids`` to the live
processes whose environment holds ``"$m"`` (``SANDLOT_EXEC_ID=<marker>``), except the calling
shell; ``kill_all`` sends SIGKILL to those processes and their process groups until none is left.

A killed process is a zombie whose environ reads empty, so it stops matching; the grep (or
command-substitution subshell) that matched itself is gone by the time of the ``-d`` test.
"""

# Every exec runs under this wrapper ($1 = directory, $2 = command line); the exit status is the
# command's. The command gets bash when the image has it, else sh, decided in the sandbox by a
# builtin (no extra round trip). `cd` instead of an API's working directory gives the same error
# for a missing directory on every engine. Once the command exits, whatever it left running
# (background jobs, daemons) is killed: those hold the output pipes open, and the exec API would
# otherwise keep the exec attached until they end.
EXEC_WRAPPER = (
    SCAN_FUNCTIONS
    + """
cd -- "$1" || exit
if command -v bash >/dev/null 2>&1; then bash -c "$2"; else sh -c "$2"; fi
rc=$?
m="SANDLOT_EXEC_ID=$SANDLOT_EXEC_ID"
kill_all
exit "$rc"
"""
)

# Kills every process that carries the marker ($0 = "SANDLOT_EXEC_ID=<marker>") and its process
# group: SIGTERM, up to $1 ticks of 0.1 s for them to go, then SIGKILL until none is left.
# Processes spawned while a round runs are caught by the next round.
KILL_SCRIPT = (
    SCAN_FUNCTIONS
    + """
m="$0"
scan
for p in $pids; do kill -s TERM -- "-$p" "$p" 2>/dev/null; done
i=0; while [ -n "$pids" ] && [ "$i" -lt "$1" ]; do sleep 0.1; i=$((i+1)); scan; done
kill_all
"""
)


def init_argv(lifetime_s: float) -> list[str]:
    """argv of the sandbox's PID 1, which lives ``lifetime_s`` seconds (rounded up, at least 1)."""
    return ["/bin/sh", "-c", INIT_SCRIPT, str(max(1, math.ceil(lifetime_s)))]


def exec_argv(command: str, cwd: str) -> list[str]:
    """argv running the shell line ``command`` in directory ``cwd`` under the wrapper.

    The exec must carry ``SANDLOT_EXEC_ID=<marker>`` in its environment.
    """
    # "sandlot" is $0, the name the shell puts in front of its own error messages.
    return ["/bin/sh", "-c", EXEC_WRAPPER, "sandlot", cwd, command]


def kill_argv(marker: str, grace_s: float) -> list[str]:
    """argv killing every process of the exec tagged ``marker``: SIGTERM, ``grace_s`` s, SIGKILL."""
    return [
        "/bin/sh",
        "-c",
        KILL_SCRIPT,
        f"{EXEC_MARKER_ENV}={marker}",
        str(math.ceil(grace_s * 10)),
    ]


def mkdir_argv(path: str) -> list[str]:
    """argv creating the directory ``path`` with its parents."""
    return ["mkdir", "-p", "--", path]


def tar_extract_argv(archive: str, parent: str) -> list[str]:
    """argv unpacking the tar ``archive`` into directory ``parent`` (created), then deleting it."""
    script = (
        'mkdir -p -- "$1" && tar -x -f "$0" -C "$1" --no-same-owner; rc=$?; rm -f -- "$0"; exit $rc'
    )
    return ["/bin/sh", "-c", script, archive, parent]


def tar_create_argv(path: str, archive: str, max_bytes: int, max_file_bytes: int) -> list[str]:
    """argv packing ``path`` (file or tree, symlinks kept) into the tar ``archive``.

    A symlink at ``path`` itself is resolved first (``readlink -f``), so the archive holds what
    it leads to, as docker's archive endpoint does. A file above ``max_file_bytes`` stops it
    (exit 3, ``... is larger than max_file_bytes=N`` on stderr); the archive is cut at
    ``max_bytes``, so a sparse file costs at most that much to move (the extractor reports the
    cut). Exits 2 with ``no such file or directory: <path>`` on stderr when ``path`` is missing.
    """
    script = (
        'p=$(readlink -f -- "$0") && [ -e "$p" ] '
        '|| { echo "no such file or directory: $0" >&2; exit 2; }; '
        'big=$(find "$p" -type f -size +"$3"c -print -quit); '
        '[ -z "$big" ] || { echo "$big is larger than max_file_bytes=$3" >&2; exit 3; }; '
        '{ tar -c -f - -C "$(dirname -- "$p")" -- "$(basename -- "$p")"; echo $? >"$1.rc"; } '
        '| head -c "$2" >"$1"; rc=$(cat -- "$1.rc"); rm -f -- "$1.rc"; '
        '[ "$rc" = 0 ] || [ "$rc" = 141 ] || exit "$rc"'
    )
    return ["/bin/sh", "-c", script, path, archive, str(max_bytes), str(max_file_bytes)]
