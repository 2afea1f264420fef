"""Resource limits of sandboxed commands, set by the sandbox's init in each command's process
after ``fork`` (see :mod:`sandlot.sandboxes.local.init`); if they cannot be set the command does
not run (exit status 126)."""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Per-process limits of one sandbox.

    Attributes:
        max_processes: ``RLIMIT_NPROC`` (processes of the user, host-wide; ignored for root).
        max_file_size_bytes: ``RLIMIT_FSIZE``: largest file a process may write.
        cpu_time_s: ``RLIMIT_CPU`` in seconds, or ``None``.
        memory_bytes: ``RLIMIT_AS`` (virtual address space per process), or ``None``.
    """

    max_processes: int
    max_file_size_bytes: int
    cpu_time_s: int | None = None
    memory_bytes: int | None = None


def _clamp(kind: int, wanted: int) -> int:
    # Raising a limit above our own hard limit is not allowed without CAP_SYS_RESOURCE, so a
    # request above it would make every command fail; the inherited hard limit already applies.
    _, hard = resource.getrlimit(kind)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def init_limits(limits: Limits) -> str:
    """``limits`` in the init's ``LIMITS`` format (``NAME=soft:hard`` items, comma separated).

    Soft and hard are equal so a command cannot raise them (that needs CAP_SYS_RESOURCE, which
    the jail drops), except CPU time: the soft limit sends SIGXCPU (exit 152), which a program
    may catch to clean up, and the hard limit one second later SIGKILL.
    """
    items = [
        ("NPROC", _clamp(resource.RLIMIT_NPROC, limits.max_processes)),
        ("FSIZE", _clamp(resource.RLIMIT_FSIZE, limits.max_file_size_bytes)),
    ]
    if limits.memory_bytes is not None:
        items.append(("AS", _clamp(resource.RLIMIT_AS, limits.memory_bytes)))
    out = [f"{name}={value}:{value}" for name, value in items]
    if limits.cpu_time_s is not None:
        cpu = _clamp(resource.RLIMIT_CPU, limits.cpu_time_s + 1)
        out.append(f"CPU={cpu - 1}:{cpu}")
    return ",".join(out)
