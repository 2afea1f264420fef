"""Processes the agent left running, stopped before its own sandbox grades it (mode ``same``).

In the agent's own sandbox (:func:`sandlot.rewards.evaluation.evaluate_in_sandbox`) a process the
agent started in the background outlives its episode: it could wait for the test command and
open ``/proc/<pid>/fd/3`` (the pytest channel's key pipe) before the bootstrap reads it, or
rewrite a graded file between the reset and the run. The sandbox's own processes (its init,
the backend's server) were there before the agent's first turn; everything else was started by
the agent. So the episode takes a :class:`ProcessBaseline` once the sandbox is set up, and
:func:`stop_lingering` kills every process that is not in it before the graded files are put
back and the grading starts (``EvalResult.integrity.lingering_stopped`` counts them).

A process is named by its PID and its start time (field 22 of ``/proc/<pid>/stat``, clock ticks
since boot, see ``proc_pid_stat(5)``): a PID the agent gets recycled has a later start time, so it
cannot pass for a baseline process. That file is read whole and parsed after its last ``)``: the
command name before it is the process's to choose (``prctl(PR_SET_NAME)``, ``/proc/self/comm``),
``) Z`` and a newline included. A process is alive while any of its threads is: its main thread
may have exited (a zombie leader) while another runs. The scripts use shell builtins only
(``read``, ``kill``), so the killer forks nothing that it would then have to tell from the
agent's processes. Every stray process is stopped (``SIGSTOP``) before any is killed, and the
scan repeats until one finds nothing, so a fork bomb cannot outrun it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sandlot.errors import SandboxError
from sandlot.sandboxes.base import Sandbox

# Sets PS to "pid starttime" for every live process the sandbox shows but this shell.
# /proc/<pid>/stat is read whole (`read -d ''`: up to a NUL, which it has none of), for the
# command name may hold any byte but NUL, newlines and ") " included: the state (field 3) and
# the start time (field 22) are the 1st and 20th words after its *last* ")". A process is dead
# when every thread of it is (Z, or X while it is reaped): a leader that exited shows Z while
# its other threads run, so a process whose stat says Z is alive if one of its
# /proc/<pid>/task/*/stat says otherwise. No command substitution or pipe: each would fork a
# child of this shell, a process to tell apart from the agent's.
_LIST = r"""
_sandlot_stat() {
  local s=
  read -r -d '' s 2>/dev/null < "$1"
  set -f; set -- ${s##*)}; set +f
  ST=${1:-} START=${20:-}
}
_sandlot_ps() {
  local d t start alive
  PS=()
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$BASHPID" ] && continue
    _sandlot_stat "$d/stat"
    [ -n "$START" ] || continue
    start=$START alive=
    case $ST in
      Z | X)
        for t in "$d"/task/[0-9]*; do
          _sandlot_stat "$t/stat"
          case $ST in Z | X | '') ;; *) alive=1 && break ;; esac
        done ;;
      *) alive=1 ;;
    esac
    [ -n "$alive" ] && PS+=("${d#/proc/} $start")
  done
  return 0
}
"""

_BASELINE = _LIST + "_sandlot_ps\nprintf '%s\\n' \"${PS[@]}\"\n"

# $1: the baseline, "pid starttime" lines. Kills the rest but PID 1 and this script's own
# ancestors (the backend's exec machinery); prints how many it killed and how many survived.
_STOP = (
    _LIST
    + r"""
declare -A keep=() mine=()
while read -r p t; do keep["$p $t"]=1; done <<< "$1"
p=$BASHPID
while [ -n "$p" ] && [ "$p" != 0 ]; do
  mine[$p]=1
  q=
  while read -r k v; do [ "$k" = PPid: ] && { q=$v; break; }; done < "/proc/$p/status" 2>/dev/null
  p=$q
done
killed=0
for ((round = 0; round < 50; round++)); do
  _sandlot_ps
  stray=()
  for e in "${PS[@]}"; do
    p=${e%% *}
    [ "$p" = 1 ] || [ -n "${mine[$p]:-}" ] || [ -n "${keep[$e]:-}" ] || stray+=("$p")
  done
  [ ${#stray[@]} = 0 ] && break
  kill -STOP "${stray[@]}" 2>/dev/null
  kill -KILL "${stray[@]}" 2>/dev/null
  killed=$((killed + ${#stray[@]}))
done
echo "$killed ${#stray[@]}"
"""
)


@dataclass(frozen=True)
class ProcessBaseline:
    """The processes of a set-up sandbox before the agent's first turn.

    Attributes:
        processes: ``"pid starttime"`` lines (start time in clock ticks since boot).
    """

    processes: str

    @classmethod
    async def take(cls, sb: Sandbox) -> ProcessBaseline | None:
        """List ``sb``'s processes (needs ``bash`` and ``/proc`` in the sandbox).

        Returns:
            The baseline, or ``None`` when the sandbox sees this very process: it shares the
            caller's PID namespace (``local`` with ``isolation="none"``), where "every other
            process" would be the machine's own, so nothing may be stopped.

        Raises:
            SandboxError: the listing failed (the sandbox is dead or has no ``/proc``).
        """
        r = await sb.exec(["bash", "-c", _BASELINE], timeout=60)
        if not r.ok or not r.stdout.strip():
            raise SandboxError(
                f"cannot list the sandbox's processes (exit {r.exit_code}): {r.stderr.strip()}"
            )
        if _own_entry() in r.stdout.splitlines():
            return None
        return cls(r.stdout)


def _own_entry() -> str:
    """This process as the listing names it (``"pid starttime"``), or ``""`` off Linux."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return f"{os.getpid()} {fields[19]}"


async def stop_lingering(sb: Sandbox, baseline: ProcessBaseline) -> int:
    """Kill every process of ``sb`` not in ``baseline`` (but PID 1 and the killer's own
    ancestors), scanning again until none is left.

    Returns:
        How many processes were killed.

    Raises:
        SandboxError: the killer did not run, or processes were still being started after
            50 rounds (the grading must not go on beside them).
    """
    r = await sb.exec(["bash", "-c", _STOP, "stop", baseline.processes], timeout=120)
    words = r.stdout.split()
    if not r.ok or len(words) != 2 or not all(w.isdigit() for w in words):
        raise SandboxError(
            f"cannot stop the processes the agent left running (exit {r.exit_code}): "
            f"{r.stderr.strip() or r.stdout.strip()}"
        )
    if words[1] != "0":
        raise SandboxError(f"{words[1]} processes the agent left running survived 50 rounds")
    return int(words[0])
