"""The init of a ``local`` sandbox: one long-lived process that runs every command of it.

This file is a standalone script (standard library only, no ``sandlot`` import), passed as
``python -I -S -c SOURCE FD LIMITS`` so that nothing of the caller's tree needs to be
visible inside the jail, or loaded once by a zygote (:mod:`sandlot.sandboxes.local.zygote`)
whose forked children call :func:`main`. Under bubblewrap (``--as-pid-1``) or forked by a
zygote it is PID 1 of the jail's PID namespace: it reaps every zombie, and when it dies the
kernel kills everything in the jail. As PID 1 it is not dumpable (``prctl(PR_SET_DUMPABLE)``
through ``_ctypes``, which the image's Python must be able to load): the commands' descriptors
pass through it, and a command must not ``ptrace`` it or read its ``/proc/1/mem``.
With ``isolation="none"`` it is a plain host process.

Protocol, over the ``AF_UNIX``/``SOCK_SEQPACKET`` socket at file descriptor ``FD``: one packet
per message, fields separated by NUL bytes (argv and environment entries cannot hold NUL).

init -> host:

* ``R`` ready, sent once at start;
* ``P id pid``: command ``id`` runs as process ``pid`` (as the jail sees pids), the leader of
  its own session and process group;
* ``X id status duration_ns``: command ``id`` ended with ``status`` (``128 + N`` when killed by
  signal N) after ``duration_ns`` nanoseconds;
* ``F id message``: command ``id`` could not be forked (e.g. the process cap is reached).

host -> init:

* ``S id cwd argc argv... env...`` with three file descriptors attached (``SCM_RIGHTS``:
  stdin, stdout, stderr): run ``argv`` (looked up on the environment's ``PATH``) in ``cwd``
  with exactly that environment plus ``SANDLOT_EXEC_ID=id``, under the limits. A missing
  ``cwd`` ends it with status 1, a missing program 127 (126 when not executable), limits that
  cannot be applied 126, each with a message on its stderr;
* ``K id sig``: send ``sig`` to command ``id``'s process tree (see :func:`_tree`);
* ``T pid sig newer``: send ``sig`` to the processes of ``pid``'s tree allocated after pid
  ``newer`` (across the wrap-around of pids; ``-1``: ``pid`` itself only);
* ``A prefix``: SIGKILL every process of the sandbox (without a PID namespace: the init's
  descendants and processes whose command id starts with ``prefix``), then exit.

``LIMITS`` is ``name=soft:hard`` items joined by commas (``resource.RLIMIT_<name>``): ``NPROC``
and ``FSIZE`` are set on the init (commands inherit them), the others in each command's
process after ``fork``; without those, commands start with ``posix_spawn``. The host puts
the init in the sandbox's cgroups (while it starts: a cgroup v1 migration waits for an RCU
grace period) before its first request, so every command is born in them.
"""

# Every import costs each sandbox's start: only builtin and C modules (no `signal`, which
# imports enum; no `contextlib`, which imports collections and functools).
import _signal  # type: ignore[import-not-found]
import _socket
import os
import resource
import select
import sys
import time

_MARKER = "SANDLOT_EXEC_ID"
_BUF = 1 << 20
_KILL_PASSES = 50
_PR_SET_DUMPABLE = 4
_RESERVED_PIDS = 300
# Every command starts with every signal at its default action and none blocked, as a container
# runtime starts its processes: dispositions and the mask are inherited across fork and exec,
# and Python ignores SIGPIPE and SIGXFSZ, a background job's parent (`nohup`, `cmd &` in a
# script) SIGINT and SIGQUIT. A shell that inherits an ignored SIGINT cannot trap it, so a
# session's timeout would have to kill it. SIGKILL and SIGSTOP cannot be caught or ignored.
_DEFAULT_SIGNALS = tuple(
    sig for sig in _signal.valid_signals() if sig not in (_signal.SIGKILL, _signal.SIGSTOP)
)


def _limits(spec: str) -> list[tuple[int, int, int]]:
    out = []
    for item in filter(None, spec.split(",")):
        name, _, values = item.partition("=")
        soft, _, hard = values.partition(":")
        out.append((getattr(resource, "RLIMIT_" + name), int(soft), int(hard)))
    return out


def _child(fields: list[bytes], fds: list[int], limits: list[tuple[int, int, int]]) -> None:
    """In the forked child: become a session leader, wire stdio, apply limits, exec."""
    try:
        os.setsid()
        # Every other descriptor of ours is close-on-exec (closing up to a limit would cost a
        # syscall per number on kernels without close_range).
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for sig in _DEFAULT_SIGNALS:  # see _DEFAULT_SIGNALS
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        cwd, argv, env = _request(fields)
        try:
            for kind, soft, hard in limits:
                resource.setrlimit(kind, (soft, hard))
        except (OSError, ValueError) as exc:
            os.write(2, f"sandlot: could not apply the sandbox limits: {exc}\n".encode())
            os._exit(126)
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(2, f"sandlot: cannot change directory to {cwd!r}: {exc.strerror}\n".encode())
            os._exit(1)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, f"sandlot: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)
    finally:
        os._exit(127)


class _Ended(Exception):
    """The command ended before it ran (missing directory or program), with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _request(fields: list[bytes]) -> tuple[str, list[str], dict[str, str]]:
    """cwd, argv and environment (with the command's id) of an ``S`` request."""
    argc = int(fields[3])
    argv = [os.fsdecode(a) for a in fields[4 : 4 + argc]]
    env = {}
    for entry in fields[4 + argc :]:
        key, _, value = entry.partition(b"=")
        env[os.fsdecode(key)] = os.fsdecode(value)
    env[_MARKER] = os.fsdecode(fields[1])
    return os.fsdecode(fields[2]), argv, env


def _spawn(fields: list[bytes], fds: list[int]) -> int:
    """Start the command with ``posix_spawn`` (a vfork: no copy of this interpreter), when
    no limit has to be set in the child: the inherited ones are set on the init itself.

    Raises:
        _Ended: the directory or the program is missing (message on the command's stderr).
        OSError: the process could not be created.
    """
    cwd, argv, env = _request(fields)
    try:
        os.chdir(cwd)  # inherited by the child; we are single-threaded
    except OSError as exc:
        os.write(fds[2], f"sandlot: cannot change directory to {cwd!r}: {exc.strerror}\n".encode())
        raise _Ended(1) from exc
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    try:
        return os.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=actions,
            setsid=True,
            setsigdef=_DEFAULT_SIGNALS,  # see _DEFAULT_SIGNALS
            setsigmask=(),
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        os.write(fds[2], f"sandlot: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        raise _Ended(127 if isinstance(exc, FileNotFoundError) else 126) from exc


def _fork(fields: list[bytes], fds: list[int], limits: list[tuple[int, int, int]]) -> int:
    """Start the command with ``fork``, setting ``limits`` in the child (see :func:`_child`)."""
    pid = os.fork()
    if pid == 0:
        _child(fields, fds, limits)
    return pid


def _procs() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) of every visible process that is not a zombie."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":
            continue
        found[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return found


def _marked(pid: int, prefix: bytes, exact: bool) -> bool:
    """Whether process ``pid``'s environment has the entry ``prefix`` (or one starting with it)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
        return prefix in entries if exact else any(e.startswith(prefix) for e in entries)
    except OSError:
        return False


def _with_descendants(procs: dict[int, tuple[int, int, int]], chosen: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    queue = list(chosen)
    while queue:
        for child in children.get(queue.pop(), ()):
            if child not in chosen:
                chosen.add(child)
                queue.append(child)
    chosen.discard(os.getpid())
    return chosen


def _tree(root: int, marker: bytes | None) -> set[int]:
    """``root``, its process group and session, every process whose environment carries
    ``marker`` (when given), and all their descendants: what a command started, also after
    ``setsid`` and double forks (orphans are re-parented to the init, so ancestry is lost)."""
    procs = _procs()
    chosen = {p for p, (_, pgid, sid) in procs.items() if p == root or root in (pgid, sid)}
    if marker is not None:
        chosen |= {p for p in procs if _marked(p, marker, True)}
    return _with_descendants(procs, chosen)


def _sandbox(prefix: bytes) -> set[int]:
    """Every process of the sandbox: all but us in our own PID namespace; without one, our
    descendants and every process marked with one of the sandbox's command ids."""
    procs = _procs()
    if os.getpid() == 1:
        return set(procs) - {1}
    return _with_descendants(procs, {p for p in procs if _marked(p, prefix, False)} | {os.getpid()})


def _newer(pids: set[int], fence: int) -> set[int]:
    """The ``pids`` allocated after ``fence`` (:func:`_is_newer`), the last pid allocated
    read from ``/proc/loadavg`` after the listing."""
    with open("/proc/loadavg", "rb") as f:
        last = int(f.read().split()[-1])
    return {p for p in pids if _is_newer(fence, last, p)}


def _is_newer(fence: int, last: int, pid: int) -> bool:
    """Whether ``pid`` was allocated after ``fence``, ``last`` being the last pid allocated.
    Pids are handed out cyclically: up to ``pid_max``, then again from 300 (``RESERVED_PIDS``,
    Linux ``kernel/pid.c``). So those are the pids above the fence up to the last one or, once
    the counter has wrapped, above the fence or from 300 up to the last. The sh copy is
    ``newer`` in :data:`sandlot.sandboxes.shared.remote_shell.SCAN_FUNCTIONS`; one table tests
    both."""
    if last >= fence:
        return fence < pid <= last
    return pid > fence or _RESERVED_PIDS <= pid <= last


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:  # noqa: SIM105 (contextlib costs an import)
            os.kill(pid, sig)
        except OSError:
            pass


def _undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: a process without ``CAP_SYS_PTRACE`` (every command)
    can then neither ``ptrace`` us nor open our ``/proc/1/mem``, ``fd``, ``environ``, ...
    (``ptrace(2)``, access mode checks), where the descriptors of every command pass. A command
    is dumpable again once it executes its program (``execve(2)``).

    Through ``_ctypes`` itself: the ``ctypes`` package costs 5 ms of imports, this one 0.7.
    """
    try:
        import _ctypes
    except ImportError as exc:  # a root filesystem's python3 without ctypes or libffi
        raise OSError(
            f"the sandbox's init cannot make itself untraceable by its commands: {sys.executable}"
            f" cannot load _ctypes ({exc}); give the image a python3 with ctypes (and libffi)"
        ) from exc

    class _Int(_ctypes._SimpleCData):
        _type_ = "i"

    class _Long(_ctypes._SimpleCData):
        _type_ = "l"

    class _Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = _Int
        _argtypes_ = (_Int, _Long, _Long, _Long, _Long)

    class _Libc:
        _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # dlopen(NULL): ourselves

    prctl = _Function(("prctl", _Libc))  # type: ignore[arg-type]  # duck-typed: a _handle
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = _ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE): {os.strerror(errno)}")


def prepare() -> tuple[int, int]:
    """Route SIGCHLD to a new pipe that :func:`main` polls; return its read and write ends. A
    zygote calls it for itself, and its spare before it is asked for a sandbox, so that the
    sandbox need not wait. As PID 1 of a jail, also make us undumpable (see
    :func:`_undumpable`)."""
    if os.getpid() == 1:
        _undumpable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    _signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def main(fd: int, limit_spec: str, wake_r: int | None = None) -> None:
    """Serve the host on socket ``fd`` under the limits ``limit_spec`` until it goes away
    (``wake_r``: from :func:`prepare`, called now when ``None``)."""
    # Limits a command inherits are set on us once; only those that would hurt the init (its
    # own CPU time, its address space) are set per command, which then needs a fork.
    limits = []
    for kind, soft, hard in _limits(limit_spec):
        if kind in (resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE):
            resource.setrlimit(kind, (soft, hard))
        else:
            limits.append((kind, soft, hard))
    os.set_inheritable(fd, False)
    sock = _socket.socket(fileno=fd)
    if wake_r is None:
        wake_r = prepare()[0]
    running: dict[int, tuple[bytes, int]] = {}  # pid -> (id, start ns)
    by_id: dict[bytes, int] = {}
    sock.send(b"R")
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                _reap(sock, running, by_id)
                continue
            try:
                data, ancdata, _, _ = sock.recvmsg(
                    _BUF, _socket.CMSG_SPACE(3 * 4), _socket.MSG_CMSG_CLOEXEC
                )
            except InterruptedError:
                continue
            if not data:
                return  # the host is gone
            fds: list[int] = []
            for level, kind, payload in ancdata:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    n = len(payload) // 4
                    fds += [int.from_bytes(payload[4 * i : 4 * i + 4], "little") for i in range(n)]
            _handle(sock, data.split(b"\0"), fds, limits, running, by_id)


def _handle(
    sock: _socket.socket,
    fields: list[bytes],
    fds: list[int],
    limits: list[tuple[int, int, int]],
    running: dict[int, tuple[bytes, int]],
    by_id: dict[bytes, int],
) -> None:
    op = fields[0]
    if op == b"S":
        exec_id = fields[1]
        try:
            pid = _spawn(fields, fds) if not limits else _fork(fields, fds, limits)
        except _Ended as ended:
            sock.send(b"X\0" + exec_id + b"\0" + str(ended.status).encode() + b"\0" + b"0")
        except OSError as exc:
            sock.send(b"F\0" + exec_id + b"\0" + str(exc).encode())
        else:
            running[pid] = (exec_id, time.monotonic_ns())
            by_id[exec_id] = pid
            sock.send(b"P\0" + exec_id + b"\0" + str(pid).encode())
        for fd in fds:
            os.close(fd)
    elif op == b"K":
        # The leader may be gone while what it started is not: the marker still finds that.
        marker = _MARKER.encode() + b"=" + fields[1]
        sig = int(fields[2])
        for _ in range(_KILL_PASSES if sig == 9 else 1):
            # A fork bomb forks between our scan and our kill: scan again until none is left.
            found = _tree(by_id.get(fields[1], -1), marker)
            if not found:
                break
            if sig == 9:
                # Frozen first: killed one by one, a shell whose child died before it could
                # run its next command in between (`sleep 300; echo never` printed "never").
                _signal_all(found, _signal.SIGSTOP)
            _signal_all(found, sig)
    elif op == b"T":
        pid, sig, newer = int(fields[1]), int(fields[2]), int(fields[3])
        chosen = {pid} if newer < 0 else _newer(_tree(pid, None), newer)
        _signal_all(chosen, sig)
    elif op == b"A":
        _signal_all(_sandbox(_MARKER.encode() + b"=" + fields[1]), 9)
        os._exit(0)


def _reap(
    sock: _socket.socket, running: dict[int, tuple[bytes, int]], by_id: dict[bytes, int]
) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        entry = running.pop(pid, None)
        if entry is None:
            continue  # an orphan re-parented to us
        exec_id, started = entry
        by_id.pop(exec_id, None)
        code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        elapsed = time.monotonic_ns() - started
        sock.send(b"X\0" + exec_id + b"\0" + str(code).encode() + b"\0" + str(elapsed).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
