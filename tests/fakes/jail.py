"""A fake container for the cloud fakes: a private root directory entered with bubblewrap.

The host's system directories are bound read-only; everything else (``/tmp``, the workdir,
whatever a command creates) lands in the sandbox's own writable root directory. The running
Python (its virtualenv, its base installation) and this checkout are bound read-only too when
they live under a directory the container gets its own of (a venv in ``/tmp``), as the local
backend does (``sandlot/sandboxes/local/jail.py``): the fake veFaaS starts its SWE-ReX server
with this very interpreter.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

# Host paths that are not bound (the fake container gets its own or none). ``/opt`` is the
# container's: an environment recipe installs into /opt/sandlot-env.
_PRIVATE = {
    *("proc", "dev", "sys", "tmp", "run", "testbed", "lost+found", "old_root", "mnt", "media"),
    "opt",
}
_CHECKOUT = Path(__file__).resolve().parents[2]


def private_host_paths() -> list[str]:
    """The interpreter's prefixes and the checkout, where a private top-level dir hides them.

    Outermost first, each once, nested ones dropped (a venv inside a checkout under ``/tmp``).
    """
    found: list[str] = []
    for path in (sys.prefix, sys.base_prefix, str(_CHECKOUT)):
        for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            parts = Path(candidate).parts
            if len(parts) > 2 and parts[1] in _PRIVATE and os.path.isdir(candidate):
                found.append(candidate)
    kept: list[str] = []
    for path in sorted(set(found), key=len):
        if not any(path == k or path.startswith(k + os.sep) for k in kept):
            kept.append(path)
    return kept


def jail_argv(
    root: Path,
    *,
    network: bool,
    own_pids: bool,
    env: dict[str, str],
    cwd: str = "/",
    pidns: int | None = None,
) -> list[str]:
    """bwrap argv running a command with ``root`` as ``/`` and the host's system dirs read-only.

    Args:
        root: the container's writable root directory on the host.
        network: share the host's network; ``False`` gives a namespace with loopback only.
        own_pids: a PID namespace of its own (everything dies with its first process).
        env: the complete environment of the command.
        cwd: working directory inside.
        pidns: an fd of a PID namespace to join (:func:`pid_namespace`; pass it with
            ``pass_fds``): the command sees that namespace's processes and dies with its first.
    """
    argv = ["bwrap", "--bind", str(root), "/"]
    for entry in sorted(os.listdir("/")):
        host = Path("/") / entry
        if entry in _PRIVATE:
            continue
        if host.is_symlink():
            if not os.path.lexists(root / entry):  # made once, in the root directory itself
                os.symlink(os.readlink(host), root / entry)
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{entry}"]
    for path in private_host_paths():
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--clearenv"]
    if not network:
        argv.append("--unshare-net")
    if own_pids:
        argv.append("--unshare-pid")
    if pidns is None:
        argv.append("--die-with-parent")
    else:
        # No --die-with-parent here: to join the namespace bwrap forks an intermediate child
        # that exits at once (fork_intermediate_child, bubblewrap 0.8-0.11), and when the
        # command has already set its parent-death signal by then (a loaded machine), that
        # exit SIGKILLs it: an exec that dies with 137 within ms (seen with perf's
        # signal:signal_generate). The namespace's first process has --die-with-parent, and
        # every process of the namespace dies with it.
        argv += ["--pidns", str(pidns)]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", cwd, "--"]
    return argv


def default_signals() -> None:
    """``preexec_fn`` for a fake container's process: every signal at its default action, none
    blocked, as a container runtime starts its processes (bwrap keeps what it inherits, e.g. a
    background job's ignored SIGINT).
    """
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_thread() -> None:
    default_signals()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@functools.cache
def _resets_by_exec() -> bool:
    """Whether ``setpriv --pdeathsig`` (util-linux) and ``env --default-signal`` (coreutils
    8.31) work here."""
    if shutil.which("setpriv") is None:
        return False
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "env", "--default-signal", "true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def default_start(*, die_with_thread: bool = False) -> tuple[list[str], Callable[[], None] | None]:
    """How to start a fake container's process: an argv prefix and a ``preexec_fn`` (one of
    them empty) giving it every signal at its default action (:func:`default_signals`) and,
    with ``die_with_thread``, SIGKILL when the thread that started it ends (a test run killed
    with ``kill -9`` leaves no bwrap behind, whose ``--die-with-parent`` then ends the jail).

    Where ``setpriv`` and ``env --default-signal`` exist they do it, after the fork: a
    ``preexec_fn`` makes ``subprocess`` fork() the whole test process (its page tables copied,
    its at-fork handlers run, Python run in the child), tens of ms with the fake's event loop
    blocked at every start, where it otherwise uses vfork(). The signal mask is then the
    starting thread's (the fakes' threads block none).
    """
    if _resets_by_exec():
        death = ["setpriv", "--pdeathsig", "KILL", "--"] if die_with_thread else []
        return [*death, "env", "--default-signal", "--"], None
    return [], _die_with_thread if die_with_thread else default_signals


def make_root(parent: Path, name: str) -> Path:
    """A new container root under ``parent`` with an empty ``/tmp``."""
    root = parent / name
    (root / "tmp").mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    return root


async def pid_namespace(bwrap_pid: int) -> int | None:
    """An open fd of the PID namespace that bwrap ``bwrap_pid`` (``--unshare-pid``) made: its
    child's, once it has one; ``None`` if bwrap ended first, or if bwrap made a user namespace
    too (not root: a later bwrap may not join the PID namespace; execs then see the host's)."""
    for _ in range(2000):
        found = _child_pid_namespace(bwrap_pid)
        if found != "wait":
            return found
        await asyncio.sleep(0.005)
    raise RuntimeError(f"bwrap {bwrap_pid} made no PID namespace in 10 s")


def _child_pid_namespace(bwrap_pid: int) -> int | Literal["wait"] | None:
    """:func:`pid_namespace` now, or ``"wait"`` while bwrap has no child in a new one yet."""
    try:
        with open(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children") as f:
            children = f.read().split()
        if children and os.readlink(f"/proc/{children[0]}/ns/pid") != os.readlink(
            "/proc/self/ns/pid"
        ):
            if os.readlink(f"/proc/{children[0]}/ns/user") != os.readlink("/proc/self/ns/user"):
                return None
            return os.open(f"/proc/{children[0]}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        pass
    return None if ended(bwrap_pid) else "wait"


def ended(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")
