"""The kubelet of the fake Kubernetes API server (``fakes.fake_kubernetes``): a pod's container
is a private root directory (``fakes.jail``), its PID 1 and every exec a bubblewrap process
over it, tagged ``FAKE_K8S_POD=<uid>`` so that killing the pod kills them all. PID 1 has a PID
namespace of its own, which every exec joins (``bwrap --pidns``), as a CRI exec joins its
container's: a command sees the pod's processes only, not the host's (when the tests run as
root; otherwise bwrap makes a user namespace per process, and execs see the host's PIDs).

A pod is cut off the network (``--unshare-net``, loopback only) when a NetworkPolicy of its
namespace selects it and allows no egress, read at each process's start: a fake of a deny-all
policy that the network plugin enforces (a real pod keeps its interface; the traffic is
dropped). This machine's package mirrors (:data:`MIRRORS`) are bound read-only into processes
with the network. Exec processes outlive a client that goes away, as under a real kubelet; they die
with their pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from fakes.jail import default_start, ended, jail_argv, make_root, pid_namespace

MARKER = "FAKE_K8S_POD"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The package mirrors of this machine's pip configuration (file:// indexes, find-links), which
# stand for a cluster's package mirror: a process with the network sees them, one without
# does not (so an environment install must be given the network, as on a cluster).
MIRRORS = tuple(p for p in ("/opt/pypi", "/opt/pypi-more", "/opt/wheels") if os.path.isdir(p))


class Container:
    """The processes and files of one pod's container.

    Args:
        parent: where the root directory goes.
        uid: the pod's uid (the marker's value, the root's name).
        env: the container's ``env`` as ``{name: value}``.
    """

    def __init__(self, parent: Path, uid: str, env: dict[str, str]) -> None:
        self.uid = uid
        self.root = make_root(parent, uid)
        (self.root / "root").mkdir(mode=0o700)
        self.env = {"PATH": IMAGE_PATH, "HOME": "/root", **env, MARKER: uid}
        self.init: asyncio.subprocess.Process | None = None
        self._pidns: int | None = None  # an open fd of the PID namespace of PID 1
        self.sockets: set[Any] = set()  # exec websockets to drop when the pod dies
        self._writers: dict[int, tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = {}

    async def spawn(
        self, argv: list[str], *, network: bool, pipes: bool = True, own_pids: bool = False
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` in the container (``pipes``: stdin, stdout and stderr are pipes;
        ``own_pids``: in a PID namespace of its own, whose processes die with it)."""
        # An exec joins the PID namespace of the container's PID 1, as a CRI exec does: it sees
        # the container's processes only (not the host's), and dies with PID 1.
        join = None if own_pids else self._pidns
        pidns = () if join is None else (join,)
        jail = jail_argv(self.root, network=network, own_pids=own_pids, env=self.env, pidns=join)
        # A container's /root is its own and writable (git config --global, pip's cache); the
        # interpreter running the tests may live under the host's, read-only as before.
        home = ["--bind", str(self.root / "root"), "/root"]
        for path in dict.fromkeys((sys.prefix, sys.base_prefix)):
            if path.startswith("/root/"):
                home += ["--ro-bind", path, path]
        if network:  # the mirror is a network service: reachable with a network only
            for mirror in MIRRORS:
                home += ["--ro-bind", mirror, mirror]
        end = jail.index("--proc")
        jail[end:end] = home
        prefix, setup = default_start(die_with_thread=True)
        if not pipes:
            null = asyncio.subprocess.DEVNULL
            return await asyncio.create_subprocess_exec(
                *prefix,
                *jail,
                *argv,
                stdin=null,
                stdout=null,
                stderr=null,
                preexec_fn=setup,
                pass_fds=pidns,
            )
        # stdout and stderr are socket pairs, not pipes: sandlot's exec wrapper kills what
        # holds its output (`-ef` on /proc/PID/fd/1), and both ends of a pipe are one inode,
        # so after a PID wrap-around it would take this very test process for a holder; the
        # two ends of a socket pair are two.
        out, err = socket.socketpair(), socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                *prefix,
                *jail,
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=out[1].fileno(),
                stderr=err[1].fileno(),
                preexec_fn=setup,
                pass_fds=pidns,
            )
        finally:
            out[1].close()
            err[1].close()
        proc.stdout, out_writer = await asyncio.open_unix_connection(sock=out[0])
        proc.stderr, err_writer = await asyncio.open_unix_connection(sock=err[0])
        self._writers[proc.pid] = (out_writer, err_writer)  # a dropped writer closes its socket
        return proc

    async def start(self, command: list[str], *, network: bool) -> None:
        """Start PID 1 (``command``, the pod's ``command``)."""
        # In a PID namespace of its own: its children die with it (a killed test run leaves
        # no init behind), and its own kills reach no process of the host.
        self.init = await self.spawn(command, network=network, pipes=False, own_pids=True)
        self._pidns = await pid_namespace(self.init.pid)

    def signal_all(self, sig: int) -> list[int]:
        """Send ``sig`` to every process of the container; their pids."""
        pids = _pids_with(f"{MARKER}={self.uid}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, up to ``grace_s`` for them to go, SIGKILL; the files removed.

        The grace watches the processes that got the SIGTERM (a read of their ``stat``, not a
        scan of every process's environment 20 times a second); any process started meanwhile
        is found and killed by :meth:`kill`, which scans until none is left."""
        self.drop_sockets()
        if termed := self.signal_all(signal.SIGTERM):
            for _ in range(int(grace_s / 0.05)):
                await asyncio.sleep(0.05)
                if all(ended(pid) for pid in termed):
                    break
        self.kill()

    def release(self, proc: asyncio.subprocess.Process) -> None:
        """Close the output sockets of ``proc`` (an exec that ended)."""
        for writer in self._writers.pop(proc.pid, ()):
            writer.close()

    def kill(self) -> None:
        """Every process killed at once, exec sockets dropped, files removed."""
        self.drop_sockets()
        while self.signal_all(signal.SIGKILL):
            pass
        if self._pidns is not None:
            os.close(self._pidns)
            self._pidns = None
        shutil.rmtree(self.root, ignore_errors=True)

    def drop_sockets(self) -> None:
        """Close the exec websockets' connections without a status (the node went away)."""
        for ws in list(self.sockets):
            transport = getattr(getattr(ws, "_req", None), "transport", None)
            if transport is not None:
                transport.abort()
        self.sockets.clear()


def _pids_with(marker: str) -> list[int]:
    needle = marker.encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found
