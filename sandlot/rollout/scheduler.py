"""The scheduler: many episodes (rows × n samples) at once, durably logged, resumable.

``sandlot rollout`` and the throughput benchmark run episodes through :func:`run_rollout`:

* **one global limit**: ``concurrency`` workers pull episodes from one queue (sample-major: every
  row's sample 0 first, so an interrupted run still has a first sample of most instances); the
  sandboxes' STARTING cap (:mod:`sandlot.sandboxes.scale.starting`, and the cluster-wide one under
  Ray) applies inside each episode as usual. The time an episode waits for a worker is its
  ``timings_s["queue"]``;
* **infrastructure retries**: an episode that ends in ``infra_error`` with ``retryable`` set
  (a sandbox that did not start, a model server down after the client's own retries) goes back
  into the queue after an exponential backoff with jitter, at most ``max_retries`` times; then
  it is recorded as it is. One episode never takes down the batch;
* **durability**: each finished trajectory is appended to ``trajectories.jsonl`` at once
  (written, flushed and ``fsync``'d before the episode counts as done; concurrent appends share
  one ``fsync``), so a crash, even ``kill -9``, loses nothing finished. One process writes a
  file at a time (a lock file beside it). See :mod:`sandlot.rollout.store`;
* **resume**: a run over a file that already has trajectories skips the (``instance_id``,
  ``sample``) pairs it holds and runs the rest. A torn last line (the crash hit a write) is cut
  off, with a warning; damage anywhere else is an error naming the line;
* **interruption**: :func:`run_until_signalled` turns SIGINT/SIGTERM into cancellation of the
  running episodes; the agent loop closes their sandboxes on cancellation (``Sandbox.close`` is
  shielded), appends already under way are shielded too, and
  :func:`~sandlot.sandboxes.base.live_sandboxes` checks that no sandbox is left open;
* **where episodes run** (:class:`~sandlot.rollout.episodes.Episodes`): in this process
  (:class:`~sandlot.rollout.episodes.InProcessEpisodes`), or on a pool of Ray actors
  (:class:`~sandlot.rollout.ray_episodes.RayEpisodes`) with this loop on the driver.

The live display (:class:`~sandlot.rollout.display.LiveDisplay`) reads the
:class:`~sandlot.rollout.stats.RolloutStats` this loop updates;
:func:`~sandlot.rollout.summary.summarize` computes the end-of-run statistics.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import anyio

from sandlot.datasets.rows import TaskRow
from sandlot.rollout.episodes import Episodes, infra_error_trajectory
from sandlot.rollout.record import EpisodeKey, EpisodeRecord
from sandlot.rollout.stats import RolloutStats
from sandlot.rollout.store import TrajectoryLog
from sandlot.rollout.trajectory import ExitReason, Trajectory

log = logging.getLogger("sandlot.rollout")

_RETRY_BACKOFF_MAX_S = 300.0
_GAUGE_INTERVAL_S = 0.25

T = TypeVar("T")


@dataclass
class _Job:
    row: TaskRow
    sample: int
    attempt: int = 1
    queue_s: float = 0.0
    ready_at: float = 0.0

    @property
    def instance_id(self) -> str:
        return self.row.instance.instance_id


def plan(
    rows: Sequence[TaskRow],
    samples: int,
    done: Mapping[EpisodeKey, EpisodeRecord],
    *,
    redo_retryable: bool = False,
) -> list[tuple[TaskRow, int]]:
    """The episodes still to run, sample-major (every row's sample 0, then sample 1, ...).

    Args:
        rows: the dataset.
        samples: samples per row.
        done: episodes with a trajectory (skipped).
        redo_retryable: run again the episodes whose trajectory is a retryable
            ``infra_error`` (the model server was down, ...).
    """
    todo = []
    for sample in range(samples):
        for row in rows:
            record = done.get((row.instance.instance_id, sample))
            if record is None or (
                redo_retryable and record.exit_reason is ExitReason.INFRA_ERROR and record.retryable
            ):
                todo.append((row, sample))
    return todo


def retry_delay(attempt: int, backoff_s: float) -> float:
    """Seconds before attempt ``attempt + 1``: ``backoff_s`` doubled per attempt (capped at
    300 s), half fixed and half random ("equal jitter")."""
    step = min(_RETRY_BACKOFF_MAX_S, backoff_s * 2 ** (attempt - 1))
    return step / 2 + random.uniform(0, step / 2)


async def run_rollout(
    rows: Sequence[TaskRow],
    episodes: Episodes,
    log_file: TrajectoryLog,
    *,
    samples: int = 1,
    concurrency: int = 8,
    max_retries: int = 2,
    retry_backoff_s: float = 5.0,
    redo_retryable: bool = False,
    stats: RolloutStats | None = None,
    on_finished: Callable[[Trajectory], None] | None = None,
) -> RolloutStats:
    """Run every (row, sample) episode not yet in ``log_file`` (see the module docstring).

    Args:
        rows: the dataset.
        episodes: runs one episode (:class:`~sandlot.rollout.episodes.InProcessEpisodes`,
            :class:`~sandlot.rollout.ray_episodes.RayEpisodes`).
        log_file: where finished trajectories go, and what is already done.
        samples: episodes per row (``sample`` 0 .. samples-1).
        concurrency: episodes at once.
        max_retries: extra attempts for an episode that ends in a retryable ``infra_error``.
        retry_backoff_s: first backoff before a retry, doubled per attempt.
        redo_retryable: also re-run resumed episodes recorded as retryable ``infra_error``.
        stats: counters to update (a display may be reading them); a new one by default.
        on_finished: called with each trajectory once it is on disk.

    Returns:
        The counters. On cancellation (see :func:`run_until_signalled`) the running episodes
        are cancelled (their sandboxes closed) and the cancellation propagates; every
        trajectory finished before is on disk.
    """
    if samples < 1 or concurrency < 1 or max_retries < 0:
        raise ValueError("samples and concurrency must be >= 1, max_retries >= 0")
    stats = stats or RolloutStats()
    todo = plan(rows, samples, log_file.records, redo_retryable=redo_retryable)
    redo = {(row.instance.instance_id, sample) for row, sample in todo}
    stats.total = len(rows) * samples
    for row in rows:
        for sample in range(samples):
            key = (row.instance.instance_id, sample)
            record = log_file.records.get(key)
            if record is not None and key not in redo:
                stats.resumed += 1
                stats.count(record)
    stats.queued = len(todo)
    if not todo:
        return stats
    now = time.monotonic()
    send, receive = anyio.create_memory_object_stream[_Job](math.inf)
    for row, sample in todo:
        send.send_nowait(_Job(row, sample, ready_at=now))
    remaining = len(todo)

    async def finish(job: _Job, traj: Trajectory) -> None:
        nonlocal remaining
        traj.attempts = job.attempt
        traj.timings_s["queue"] = job.queue_s
        with anyio.CancelScope(shield=True):
            await log_file.append(traj)
        stats.new += 1
        stats.count(log_file.records[(traj.instance_id, traj.sample)])
        remaining -= 1
        if remaining == 0:
            send.close()
        if on_finished is not None:
            on_finished(traj)

    async def requeue(job: _Job, delay: float) -> None:
        await anyio.sleep(delay)
        job.attempt += 1
        job.ready_at = time.monotonic()
        stats.queued += 1
        send.send_nowait(job)

    async def worker(tg: anyio.abc.TaskGroup) -> None:
        async for job in receive:
            job.queue_s += time.monotonic() - job.ready_at
            stats.queued -= 1
            stats.running += 1
            try:
                traj = await episodes.run(job.row, job.sample)
            except Exception as exc:  # an Episodes implementation must not take the batch down
                log.exception("episode %s/%d raised", job.instance_id, job.sample)
                traj = infra_error_trajectory(
                    job.row, job.sample, f"{type(exc).__name__}: {exc}", retryable=False
                )
            finally:
                stats.running -= 1
            if (
                traj.exit_reason is ExitReason.INFRA_ERROR
                and traj.retryable
                and job.attempt <= max_retries
            ):
                delay = retry_delay(job.attempt, retry_backoff_s)
                stats.retries += 1
                log.warning(
                    "%s/%d: attempt %d failed (%s); retrying in %.1f s",
                    job.instance_id,
                    job.sample,
                    job.attempt,
                    traj.error,
                    delay,
                )
                tg.start_soon(requeue, job, delay)
                continue
            await finish(job, traj)

    async def gauges() -> None:
        while True:
            g = await episodes.gauges()
            stats.starting, stats.alive = g.starting, g.alive
            await anyio.sleep(_GAUGE_INTERVAL_S)

    async with anyio.create_task_group() as outer:
        outer.start_soon(gauges)
        async with send, receive, anyio.create_task_group() as tg:
            for _ in range(min(concurrency, len(todo))):
                tg.start_soon(worker, tg)
        outer.cancel_scope.cancel()
    g = await episodes.gauges()
    stats.starting, stats.alive = g.starting, g.alive
    return stats


async def run_until_signalled(
    main: Callable[[], Awaitable[T]],
    *,
    on_signal: Callable[[int, int], None] | None = None,
) -> tuple[T | None, int | None]:
    """Run ``main`` until it returns or SIGINT/SIGTERM arrives; a signal cancels it.

    Cancellation is what closes sandboxes here (``Sandbox.close`` is shielded and bounded),
    so ``main`` is awaited until its cleanup is done; further signals meanwhile only call
    ``on_signal`` (e.g. to say that sandboxes are being closed). Must run in the main thread.

    Args:
        main: the work.
        on_signal: called with (signal number, how many signals so far) on each signal.

    Returns:
        (``main``'s result or ``None`` when interrupted, the first signal's number or ``None``).

    Raises:
        Exception: what ``main`` raised, as it raised it.
    """
    result: T | None = None
    received: int | None = None
    error: Exception | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            work = anyio.CancelScope()

            async def watch() -> None:
                nonlocal received
                count = 0
                async for signum in signals:
                    count += 1
                    if received is None:
                        received = signum
                        work.cancel()
                    if on_signal is not None:
                        on_signal(signum, count)

            tg.start_soon(watch)
            try:
                with work:
                    result = await main()
            except Exception as exc:  # raised below as itself, not in the task group's group
                error = exc
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result, received
