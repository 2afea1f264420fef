"""Finding the processes below a host process in ``/proc`` (Linux), with their namespace pids."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    """A live process.

    Attributes:
        pid: its pid on the host.
        nspid: its pid in its innermost pid namespace (what a jailed shell sees as ``$$``);
            equal to ``pid`` outside any pid namespace.
    """

    pid: int
    nspid: int


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # exited meanwhile
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat[stat.rfind(b")") + 2 :].split(maxsplit=2)[1])


def _nspid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        return None
    return pid  # kernels before 4.1 have no NSpid line: no nested namespaces to report


def descendants(root: int) -> list[Proc]:
    """Every live descendant of host process ``root`` (not ``root`` itself), parents first.

    Reads ``/proc/*/stat`` of every process on the host (a few milliseconds): the kernel's
    ``children`` files are optional. Processes that exit meanwhile are skipped.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _parent(entry)
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    found: list[Proc] = []
    queue = list(children.get(root, ()))
    while queue:
        pid = queue.pop(0)
        nspid = _nspid(pid)
        if nspid is not None:
            found.append(Proc(pid, nspid))
        queue += children.get(pid, ())
    return found


def nspid_of(pid: int) -> int | None:
    """The innermost-namespace pid of host process ``pid``, or ``None`` if it is gone."""
    return _nspid(pid)
