"""What a rollout keeps on disk: ``trajectories.jsonl`` and the files made from it.

* :class:`TrajectoryLog` appends to it durably: each trajectory is written, flushed and
  ``fsync``'d before its episode counts as done (concurrent appends share one ``fsync``), so a
  crash, even ``kill -9``, loses nothing finished; a lock file beside it keeps a second process
  out. Opening it reads what finished before (what resume skips) and cuts off a torn last line
  (the crash hit a write), with a warning; damage anywhere else is an error naming the line.
* :func:`iter_trajectories` reads it back one line at a time, the latest trajectory per episode.
* :func:`write_predictions` and :func:`atomic_write` write the files derived from it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import anyio
from filelock import FileLock
from filelock import Timeout as LockTimeout
from pydantic import ValidationError

from sandlot.rollout.errors import TrajectoryFileError
from sandlot.rollout.record import EpisodeKey, EpisodeRecord
from sandlot.rollout.trajectory import ExitReason, Trajectory

log = logging.getLogger("sandlot.rollout")

TRAJECTORIES_FILE = "trajectories.jsonl"


_Line = tuple[int, int, bytes, bool]  # (line number, byte offset, text, ends with a newline)


def _lines(path: Path) -> Iterator[_Line]:
    """The non-blank lines of ``path``, read one at a time."""
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            body = raw.rstrip(b"\r\n")
            if body.strip():
                yield lineno, offset, body, raw.endswith(b"\n")
            offset += len(raw)


def _decode(path: Path, line: _Line, *, last: bool) -> Trajectory | None:
    """The trajectory of one line; ``None`` for a torn last line (no newline: the write was
    cut; or not a trajectory). A bad line that is not the last raises."""
    lineno, _, body, complete = line
    if last and not complete:
        return None
    try:
        return Trajectory.model_validate_json(body)
    except ValidationError as exc:
        if last:
            return None
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "<line>"
        raise TrajectoryFileError(
            f"{path}: line {lineno} is not a trajectory ({where}: {first['msg']}); only a torn "
            "last line is repaired: fix or remove the line, or use another --output"
        ) from None


def _parse(path: Path) -> Iterator[tuple[_Line, Trajectory | None]]:
    """Every line with its trajectory (``None`` only for a torn last line)."""
    previous: _Line | None = None
    for line in _lines(path):
        if previous is not None:
            yield previous, _decode(path, previous, last=False)
        previous = line
    if previous is not None:
        yield previous, _decode(path, previous, last=True)


def iter_trajectories(path: str | os.PathLike[str], *, latest: bool = True) -> Iterator[Trajectory]:
    """The trajectories of a ``trajectories.jsonl``, in file order, read one at a time (a torn
    last line is skipped).

    Args:
        path: the file.
        latest: keep only the last trajectory of each (``instance_id``, ``sample``) (a
            re-run of a retryable ``infra_error`` appends a newer one).

    Raises:
        FileNotFoundError: no such file.
        TrajectoryFileError: a line other than the last is not a trajectory.
    """
    file = Path(path)
    keep: set[int] | None = None
    if latest:
        last: dict[EpisodeKey, int] = {}
        for (lineno, *_), traj in _parse(file):
            if traj is not None:
                last[(traj.instance_id, traj.sample)] = lineno
        keep = set(last.values())
    for (lineno, *_), traj in _parse(file):
        if traj is not None and (keep is None or lineno in keep):
            yield traj


class TrajectoryLog:
    """``trajectories.jsonl``, open for appending: what finished before, and durable appends.

    Opening reads the records already there (the last per key wins), cuts a torn last line off
    the file (``repaired`` says what was dropped) and takes the lock file beside it.

    Args:
        path: the file (created with its directory when missing).

    Raises:
        TrajectoryFileError: another process holds the lock, or a line other than the last is
            not a trajectory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path.parent / f".{self.path.name}.lock"))
        try:
            self._lock.acquire(timeout=0)
        except LockTimeout:
            raise TrajectoryFileError(
                f"another rollout is writing {self.path} (its lock file is held); wait for it "
                "or choose another --output"
            ) from None
        try:
            self.records: dict[EpisodeKey, EpisodeRecord] = {}
            self.repaired: str | None = None
            if self.path.exists():
                self._load()
            self._file = self.path.open("ab")
        except BaseException:
            self._lock.release()
            raise
        self._pending: list[bytes] = []
        self._flushing = False
        self._batch: anyio.Event | None = None
        self._error: BaseException | None = None

    def _load(self) -> None:
        for (lineno, offset, _, complete), traj in _parse(self.path):
            if traj is not None:
                self.records[(traj.instance_id, traj.sample)] = EpisodeRecord.of(traj)
                continue
            why = "has no end (the write was cut)" if not complete else "is not a trajectory"
            size = self.path.stat().st_size
            with self.path.open("r+b") as f:
                f.truncate(offset)
                f.flush()
                os.fsync(f.fileno())
            self.repaired = f"last line {lineno} {why}; dropped its {size - offset} bytes"
            log.warning("%s: %s", self.path, self.repaired)

    def __enter__(self) -> TrajectoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file and release the lock. Idempotent."""
        if not self._file.closed:
            self._file.close()
            self._lock.release()

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    async def append(self, traj: Trajectory) -> None:
        """Append ``traj`` and return once it is on disk (``fsync``'d).

        Appends that arrive while a write is under way are written together by the next
        write, with one ``fsync`` (group commit). Shield the call from cancellation if the
        trajectory must not be lost (the scheduler does).

        Raises:
            OSError: the file cannot be written (disk full, ...).
        """
        self._pending.append(traj.model_dump_json().encode() + b"\n")
        if self._batch is None:
            self._batch = anyio.Event()
        batch = self._batch
        if self._flushing:
            await batch.wait()
            if self._error is not None:
                raise self._error
        else:
            self._flushing = True
            try:
                while self._pending:
                    data, self._pending = b"".join(self._pending), []
                    done, self._batch = self._batch, anyio.Event()
                    try:
                        await anyio.to_thread.run_sync(self._write, data)
                    except BaseException as exc:
                        self._error = exc
                        raise
                    finally:
                        if done is not None:
                            done.set()
            finally:
                self._flushing = False
        self.records[(traj.instance_id, traj.sample)] = EpisodeRecord.of(traj)


def write_predictions(
    records: Mapping[EpisodeKey, EpisodeRecord],
    trajectories: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    order: Sequence[str] = (),
    model_name_or_path: str = "",
) -> int:
    """Write SWE-bench predictions (``instance_id``, ``model_name_or_path``, ``model_patch``):
    one per instance, its first recorded sample's patch. Written atomically.

    An instance whose first sample ended in ``infra_error`` is left out: the model submitted
    nothing there, and the SWE-bench harness counts every line as a submission (an empty patch
    would score as the model's). ``sandlot eval`` and the harness count it as incomplete.

    Args:
        records: the episodes (keys say which sample of an instance is the first).
        trajectories: the ``trajectories.jsonl`` holding their patches.
        dest: the predictions file.
        order: instance ids in the order to write (the dataset's); others follow, sorted.
        model_name_or_path: written when a trajectory has none.

    Returns:
        The number of predictions written.
    """
    first: dict[str, int] = {}
    for iid, sample in records:
        if iid not in first or sample < first[iid]:
            first[iid] = sample
    patches: dict[str, tuple[str, str]] = {}
    for traj in iter_trajectories(trajectories):
        infra = traj.exit_reason is ExitReason.INFRA_ERROR
        if first.get(traj.instance_id) == traj.sample and not infra:
            patches[traj.instance_id] = (
                traj.model_name_or_path or model_name_or_path,
                traj.model_patch,
            )
    rank = {iid: i for i, iid in enumerate(order)}
    ids = sorted(patches, key=lambda iid: (rank.get(iid, len(rank)), iid))
    lines = [
        json.dumps({"instance_id": iid, "model_name_or_path": name, "model_patch": patch})
        for iid in ids
        for name, patch in [patches[iid]]
    ]
    atomic_write(dest, "".join(line + "\n" for line in lines))
    return len(lines)


def atomic_write(dest: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``dest`` through a temporary file and a rename."""
    target = Path(dest)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
