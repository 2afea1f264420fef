"""Resource limits of sandboxed commands, applied by the command's own shell.

anyio's ``open_process`` has no ``preexec_fn``, and wrapping every command in ``prlimit(1)``
would cost one more exec per command. Instead the ``bash -c`` that runs a command starts with a
short prelude on the command's first line: ``ulimit`` (soft and hard, so the command cannot raise
them again: raising a hard limit needs CAP_SYS_RESOURCE, which the jail drops) and, when the
sandbox has a pids cgroup, ``echo 0 > cgroup.procs`` to join it. Both are shell builtins, so
this adds no process. If either fails the command does not run (exit status 126).

Keeping the prelude on the command's first line keeps ``$LINENO`` right.
"""

from __future__ import annotations

import resource
import shlex
from dataclasses import dataclass

LIMIT_FAILED_EXIT_CODE = 126


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


def shell_prelude(limits: Limits, cgroup_procs: str | None) -> str:
    """The text put in front of every command; ends with ``; ``.

    Args:
        limits: the limits to apply.
        cgroup_procs: path (as the command sees it) of the ``cgroup.procs`` file to join, or
            ``None`` when the sandbox has no pids cgroup.
    """
    # bash's ulimit counts -f in 1024-byte blocks and -v in KiB (outside POSIX mode).
    flags = [
        f"-u {_clamp(resource.RLIMIT_NPROC, limits.max_processes)}",
        f"-f {_clamp(resource.RLIMIT_FSIZE, limits.max_file_size_bytes) // 1024}",
    ]
    if limits.memory_bytes is not None:
        flags.append(f"-v {_clamp(resource.RLIMIT_AS, limits.memory_bytes) // 1024}")
    steps = [f"ulimit -SH {' '.join(flags)}"]
    if limits.cpu_time_s is not None:
        # The soft limit sends SIGXCPU (exit 152), which a program may catch to clean up; the
        # hard limit one second later sends SIGKILL. Equal limits would SIGKILL at once.
        cpu = _clamp(resource.RLIMIT_CPU, limits.cpu_time_s + 1)
        steps.append(f"ulimit -S -t {cpu - 1} && ulimit -H -t {cpu}")
    if cgroup_procs is not None:
        steps.append(f"echo 0 >{shlex.quote(cgroup_procs)}")
    fail = f"echo 'sandlot: could not apply the sandbox limits' >&2; exit {LIMIT_FAILED_EXIT_CODE}"
    return f"{{ {' && '.join(steps)}; }} || {{ {fail}; }}; "
