"""Trajectories kept by training: each worker process appends to its own file of a shared
directory, ``trajectories.<host>.<pid>.jsonl``, one :class:`Trajectory` a line (the format of
``trajectories.jsonl``), for ``sandlot audit DIR``.

verl runs many agent loops in each of many worker processes, on several nodes: one file per
process needs no lock between processes; the appends of one process are serialised by a lock
and each is ``fsync``'d. A crash can leave a torn last line, which the readers
(:func:`~sandlot.rollout.store.iter_trajectories`) skip.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import anyio

from sandlot.rollout.trajectory import Trajectory

DUMP_GLOB = "trajectories.*.jsonl"
"""The names of the files :class:`TrajectoryDump` writes."""

_lock = threading.Lock()


class TrajectoryDump:
    """This process's file of trajectories in ``directory`` (created when missing).

    Args:
        directory: a directory the workers share (on several nodes: shared storage).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / f"trajectories.{socket.gethostname()}.{os.getpid()}.jsonl"

    def _write(self, data: bytes) -> None:
        with _lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

    async def append(self, traj: Trajectory) -> None:
        """Append ``traj`` (in a worker thread; returns once it is on disk).

        Raises:
            OSError: the file cannot be written.
        """
        await anyio.to_thread.run_sync(self._write, traj.model_dump_json().encode() + b"\n")
