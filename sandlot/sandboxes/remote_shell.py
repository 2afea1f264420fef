"""Shell snippets that exec-based remote backends (``modal``) run inside the sandbox.

A remote exec API starts one process and streams its output; it does not know about the
processes that process starts. These POSIX ``sh`` snippets give every exec the contract's
semantics: the command runs with ``bash`` (``sh`` when the image has none) in its working
directory, and once it exits, or when the caller times out or is cancelled, *every* process it
started is killed, including background jobs that would otherwise hold the output streams open.

Processes are found by an environment marker (``SANDLOT_EXEC_ID=<random>``) that descendants
inherit even when they leave the process group, by scanning ``/proc/*/environ``. The image needs
``/bin/sh``, ``grep``, ``sleep`` and ``/proc``.
"""

from __future__ import annotations

import math

EXEC_MARKER_ENV = "SANDLOT_EXEC_ID"

# `scan` sets $pids to the live processes whose environment holds "$m", except this shell.
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

# $1 = working directory, $2 = command line. The exit status is the command's.
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

# $0 = "SANDLOT_EXEC_ID=<marker>", $1 = ticks of 0.1 s between SIGTERM and SIGKILL.
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


def exec_argv(command: str, cwd: str) -> list[str]:
    """argv running the shell line ``command`` in directory ``cwd`` under the wrapper.

    The exec must carry ``SANDLOT_EXEC_ID=<marker>`` in its environment.
    """
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


def tar_extract_argv(archive: str, parent: str) -> list[str]:
    """argv unpacking the tar ``archive`` into directory ``parent`` (created), then deleting it."""
    script = (
        'mkdir -p -- "$1" && tar -x -f "$0" -C "$1" --no-same-owner; rc=$?; rm -f -- "$0"; exit $rc'
    )
    return ["/bin/sh", "-c", script, archive, parent]


def tar_create_argv(path: str, archive: str) -> list[str]:
    """argv packing ``path`` (file or tree, symlinks kept) into the tar ``archive``.

    Exits 2 with ``no such file or directory: <path>`` on stderr when ``path`` is missing.
    """
    script = (
        '[ -e "$0" ] || [ -L "$0" ] || { echo "no such file or directory: $0" >&2; exit 2; }; '
        'tar -c -f "$1" -C "$(dirname -- "$0")" -- "$(basename -- "$0")"'
    )
    return ["/bin/sh", "-c", script, path, archive]
