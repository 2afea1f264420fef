"""Shell snippets that the container backends (``docker``, ``modal``, ``vefaas``) run inside the
sandbox.

A remote exec API starts one process and streams its output; it does not know about the
processes that process starts. These POSIX ``sh`` snippets give every exec the contract's
semantics: the command runs with ``bash`` (``sh`` when the image has none) in its working
directory; once it exits, the processes it left that still hold the exec's output streams are
killed (the others live until the sandbox closes), and when the caller times out or is
cancelled *every* process it started is killed.

Processes are found by an environment marker (``SANDLOT_EXEC_ID=<random>``) that descendants
inherit even when they leave the process group (``setsid``, daemons), by scanning
``/proc/*/environ``. The killing uses nothing but ``/bin/sh`` builtins (``read``, ``case``,
``kill``) and ``/proc``: the model may delete ``grep``, ``sleep`` or ``ps`` and the killer still
works, and it forks nothing, so it also works when a fork bomb has taken every process slot.
Marked processes are frozen (``SIGSTOP``) until no new one appears, then killed, so a fork
bomb cannot outgrow the killing.

A process that wiped its environment (``setsid env -i daemon``) carries no marker. Where PID 1
is the sandbox's own init (``docker``), such *orphans* (unmarked, parent PID 1 or outside the
container) are escaped daemons and are killed too on a timeout or cancellation
(``sweep_orphans``); on backends whose container runs other services the sweep is off. The
``docker`` init also empties the container (every process but itself) on ``SIGUSR1``, which the
engine can deliver when even the in-sandbox killer cannot run.
"""

from __future__ import annotations

import math

# PID 1 ($0 = lifetime in seconds). `sleep & wait` keeps the shell in `wait`, which reaps every
# child it is handed (orphans of exec'd commands are re-parented to PID 1) and returns at once on
# a trapped signal, so stopping the sandbox is immediate; a bare `sleep infinity` as PID 1
# ignores SIGTERM and makes `docker stop` wait for its timeout. When the shell exits the kernel
# kills everything else in the PID namespace, which is how the lifetime is enforced for free.
# SIGUSR1 freezes then kills every other process (only builtins: nothing to fork), keeping the
# container and its files.
INIT_SCRIPT = """
trap "exit 0" TERM
reset() {
  i=0
  while [ "$i" -lt 10 ]; do
    for d in /proc/[0-9]*; do
      p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = "$s" ] || kill -s STOP "$p" 2>/dev/null
    done
    i=$((i+1))
  done
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = "$s" ] || kill -s KILL "$p" 2>/dev/null
  done
}
trap reset USR1
SANDLOT_INIT=1 sleep "$0" & s=$!
while kill -0 "$s" 2>/dev/null; do wait "$s"; done
"""

EXEC_MARKER_ENV = "SANDLOT_EXEC_ID"
"""Environment variable carrying a per-exec random marker, inherited by every descendant."""

SCAN_FUNCTIONS = """
has() {
  while IFS= read -r _sl || [ -n "$_sl" ]; do
    case $_sl in *"$2"*) return 0;; esac
  done 2>/dev/null <"/proc/$1/environ"
  return 1
}
descendants_only() {
  since=$$
}
newer() {
  if [ "$_last" -ge "$since" ]; then [ "$1" -gt "$since" ] && [ "$1" -le "$_last" ]
  else [ "$1" -gt "$since" ] || { [ "$1" -ge 300 ] && [ "$1" -le "$_last" ]; }; fi
}
marked() {
  has "$1" "$m" && return 0
  [ -n "$orphans" ] && { [ "$3" = 0 ] || [ "$3" = 1 ]; } \\
    && ! has "$1" SANDLOT_EXEC_ID= && ! has "$1" SANDLOT_INIT=
}
holder() {
  for _sf in "/proc/$1/fd/"*; do
    if [ "$_sf" -ef "/proc/$$/fd/1" ] || [ "$_sf" -ef "/proc/$$/fd/2" ]; then return 0; fi
  done
  return 1
}
scan() {
  _stest=$1; _sn=0
  while [ "$_sn" -le 3 ]; do
    pids=; read -r _sa _sb _sc _sd _last </proc/loadavg
    for _sd in /proc/[0-9]*; do
      _sp=${_sd#/proc/}
      if [ "$_sp" = "$$" ] || [ "$_sp" = 1 ]; then continue; fi
      if [ -n "$since" ] && ! newer "$_sp"; then continue; fi
      IFS= read -r _st 2>/dev/null <"$_sd/stat" || continue
      set -- ${_st##*) }
      [ "$1" = Z ] && continue
      "$_stest" "$_sp" "$1" "$2" && pids="$pids $_sp"
    done
    [ -n "$pids" ] && return
    read -r _sa _sb _sc _sd _snew </proc/loadavg
    [ "$_snew" = "$_last" ] && return
    _sn=$((_sn+1))
  done
}
clock() {
  read -r _su _sx </proc/uptime
  _snow=$(( ${_su%%.*} * 100 + 1${_su#*.} - 100 ))
}
kill_all() {
  _si=0; scan marked
  while [ -n "$pids" ] && [ "$_si" -lt 100 ]; do
    for _sp in $pids; do kill -s STOP "$_sp" 2>/dev/null; done
    _sprev=$pids; scan marked
    if [ "$pids" = "$_sprev" ]; then
      for _sp in $pids; do kill -s KILL -- "-$_sp" "$_sp" 2>/dev/null; done
      scan marked
    fi
    _si=$((_si+1))
  done
}
"""
"""Shell functions for scripts that start with them (builtins only, no fork): ``has PID TEXT``
tells whether the process's environment holds ``TEXT``; ``scan TEST`` sets ``$pids`` to the live
processes (not the calling shell, not PID 1) for which ``TEST PID STATE PPID`` succeeds:
``marked`` (the environment holds ``"$m"``, i.e. ``SANDLOT_EXEC_ID=<marker>``, or the process is
an orphan, see the module docstring, when ``$orphans`` is non-empty) or ``holder`` (it has the
calling shell's stdout or stderr open). After ``descendants_only`` a scan looks only at PIDs
allocated after the calling shell's (``$since``, which a script may also set to another
fence), where all of its descendants are: PIDs are handed out
cyclically, so those are the ones between ``$$`` and the last PID allocated (``/proc/loadavg``),
across the wrap-around if there was one (after which the kernel starts again from 300,
``RESERVED_PIDS`` in Linux ``kernel/pid.c``). This spares reading the environment of every older
process, which ``read`` does a byte at a time (a host-wide PID namespace has hundreds). A scan
is not one instant: a fork bomb's generations can all exit between the listing and the test
while their children, born after the listing, go unseen, so an empty scan counts only when no
PID was allocated while it ran (else it is repeated, up to 3 times: where the sandbox shares
a busy host's PID namespace, PIDs are allocated all the time, and every exec ends with a scan).
``kill_all`` freezes the ``marked`` processes until the set stops growing, then sends SIGKILL to
them and their process groups, until none is left; ``clock`` sets ``$_snow`` to the uptime in
hundredths of a second (``/proc/uptime`` prints two decimals; the ``1`` prefix keeps ``08`` from
reading as octal). Their own variables start with ``_s``.

A killed process is a zombie whose environ reads empty, so it stops matching (``read`` drops the
NUL separators of ``environ``; the marker is random, so no concatenation forges it by chance).
"""

# Every exec runs under this wrapper ($1 = directory, $2 = command line); the exit status is the
# command's. The command gets bash when the image has it, else sh, decided in the sandbox by a
# builtin (no extra round trip). `cd` instead of an API's working directory gives the same error
# for a missing directory on every engine. Once the command exits, what it left running lives on
# until the sandbox closes (as with `docker exec`), except the processes that still hold the
# exec's output streams (`-ef` compares the pipes, a builtin test): the exec API would keep the
# exec attached until they end, so they are frozen and killed. Holding the exec's own pipes is
# what makes them its descendants, whatever their environment or parent: a daemon that wiped its
# environment, or the child of one that is dying (not yet re-parented, already without fds), is
# found all the same. A child forked by `cmd >/dev/null &` holds them until it applies its
# redirection, so holders get about 0.1 s to let go first, and whatever was frozen but not
# killed is resumed. With $3 non-empty the wrapper first reads a secret line from stdin (the
# rest is the command's) and, as it exits, writes "<secret> <status>" to stdout: the exit status
# on the output stream, for engines that forget an exec's status once it ends (see exec_argv);
# with $3 = "closed" the command's stdin is /dev/null instead.
EXEC_WRAPPER = (
    SCAN_FUNCTIONS
    + """
[ -z "$3" ] || { IFS= read -r _sstatus; trap 'printf "%s %d\\n" "$_sstatus" "$?"' EXIT; }
[ "$3" != closed ] || exec </dev/null
cd -- "$1" || exit
if command -v bash >/dev/null 2>&1; then bash -c "$2"; else sh -c "$2"; fi
rc=$?
descendants_only
scan holder; clock; _send=$((_snow + 10))
while [ -n "$pids" ] && clock && [ "$_snow" -lt "$_send" ]; do scan holder; done
_si=0; _sstopped=
while [ -n "$pids" ] && [ "$_si" -lt 100 ]; do
  for _sp in $pids; do kill -s STOP "$_sp" 2>/dev/null; done
  _sstopped="$_sstopped $pids"; _sprev=$pids; scan holder
  if [ "$pids" = "$_sprev" ]; then
    for _sp in $pids; do kill -s KILL "$_sp" 2>/dev/null; done
    scan holder
  fi
  _si=$((_si+1))
done
for _sp in $_sstopped; do kill -s CONT "$_sp" 2>/dev/null; done
exit "$rc"
"""
)

# Kills every process that carries the marker ($0 = "SANDLOT_EXEC_ID=<marker>") and its process
# group ($2 non-empty: and the orphans): SIGTERM, up to $1 ticks of 0.1 s for them to go (checked
# with `kill -0`, far cheaper than a scan of /proc), then freeze and SIGKILL until none is left.
# Prints "killed" and exits 0 when none is left, exits 1 when some survived. The grace is a spin
# on `clock`, not `sleep`: when a fork bomb has taken every process slot, dash exits on a failed
# fork.
KILL_SCRIPT = (
    SCAN_FUNCTIONS
    + """
m="$0"; orphans=$2
scan marked
for p in $pids; do kill -s TERM -- "-$p" "$p" 2>/dev/null; done
left=$pids; clock; _send=$((_snow + $1 * 10))
while [ -n "$left" ] && clock && [ "$_snow" -lt "$_send" ]; do
  alive=; for p in $left; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done; left=$alive
done
kill_all
[ -z "$pids" ] && echo killed
"""
)


# $0 = marker (NAME=value), $1 = signal name, $2 = fence pid: signal the marked processes
# allocated after the fence (across the wrap-around, as `newer` counts), except this script
# (a session channel's `signal_newer`); builtins only, like the killer.
SIGNAL_NEWER_SCRIPT = (
    SCAN_FUNCTIONS
    + """
m=$0; since=$2; scan marked
for p in $pids; do kill -s "$1" "$p" 2>/dev/null; done
exit 0
"""
)

# $1 = directory: the shell of a session channel, stderr merged into stdout.
SHELL_SCRIPT = 'cd -- "$1" || exit; exec bash --noprofile --norc 2>&1'


def init_argv(lifetime_s: float) -> list[str]:
    """argv of the sandbox's PID 1, which lives ``lifetime_s`` seconds (rounded up, at least 1)."""
    return ["/bin/sh", "-c", INIT_SCRIPT, str(max(1, math.ceil(lifetime_s)))]


def exec_argv(
    command: str, cwd: str, *, report_status: bool = False, stdin: bool = True
) -> list[str]:
    """argv running the shell line ``command`` in directory ``cwd`` under the wrapper.

    The exec must carry ``SANDLOT_EXEC_ID=<marker>`` in its environment (for :func:`kill_argv`).
    With ``report_status`` the exec's stdin must start with a line holding a fresh random
    secret; the wrapper reads it before the command starts (so the command's environment,
    argv and stdin never show it) and, after the command and every process holding the exec's
    output have ended, ends stdout with ``<secret> <status>\\n``. A reader that takes the status
    only from that line at the very end of stdout cannot be fooled by the command's output: the
    command cannot write after it, and a process that reopens the stream through ``/proc``
    cannot write the secret (it could only corrupt the line, a lost status, not a wrong one).
    ``stdin=False`` (with ``report_status``) gives the command ``/dev/null`` as its stdin, so the
    exec's own stdin need not be ended after the secret line.
    """
    # "sandlot" is $0, the name the shell puts in front of its own error messages.
    mode = ["status" if stdin else "closed"] if report_status else []
    return ["/bin/sh", "-c", EXEC_WRAPPER, "sandlot", cwd, command, *mode]


def kill_argv(marker: str, grace_s: float, *, sweep_orphans: bool = False) -> list[str]:
    """argv killing every process of the exec tagged ``marker``: SIGTERM, ``grace_s`` s, SIGKILL.

    Prints ``killed`` and exits 0 when none is left, exits 1 when some survived.
    ``sweep_orphans`` also kills the unmarked orphans (see the module docstring); only for
    sandboxes whose PID 1 is :data:`INIT_SCRIPT` and that run nothing else.
    """
    return [
        "/bin/sh",
        "-c",
        KILL_SCRIPT,
        f"{EXEC_MARKER_ENV}={marker}",
        str(math.ceil(grace_s * 10)),
        "1" if sweep_orphans else "",
    ]


def signal_newer_argv(marker: str, signal_name: str, newer_than: int) -> list[str]:
    """argv sending ``signal_name`` (``INT``, ``KILL``, ...) to the processes tagged ``marker``
    whose pid was allocated after ``newer_than`` (across the wrap-around of pids)."""
    return [
        "/bin/sh",
        "-c",
        SIGNAL_NEWER_SCRIPT,
        f"{EXEC_MARKER_ENV}={marker}",
        signal_name,
        str(newer_than),
    ]


def shell_argv(cwd: str) -> list[str]:
    """argv of a session's ``bash --noprofile --norc`` started in ``cwd``, stderr into stdout."""
    return ["/bin/sh", "-c", SHELL_SCRIPT, "sandlot", cwd]


def mkdir_argv(path: str) -> list[str]:
    """argv creating the directory ``path`` with its parents."""
    return ["mkdir", "-p", "--", path]
