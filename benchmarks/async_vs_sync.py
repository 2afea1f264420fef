"""Discrete-event simulation: synchronous (colocated) RL batches vs verl's fully-async trainer.

Model (stdlib only, seeded, deterministic; one run per GPU count, the same latency draws for
both modes):

* **Work.** One training step consumes ``S = prompts x n`` samples (default 512 x 16, the 7B
  DAPO run of verl's README: mini-batch 32 x ``require_batches`` 4 x ``trigger`` 4). An
  episode holds one rollout *slot* for its whole latency (model calls and tool time alike);
  a GPU has ``--slots`` slots and counts ``busy slots / slots`` busy. Latencies are i.i.d.
  draws, independent of load and GPU count. Training costs ``--train-s`` GPU-seconds per
  sample, split perfectly over the training GPUs.
* **(a) sync / colocate.** All G GPUs generate the batch (list scheduling onto ``G x slots``
  slots; the phase ends with the slowest episode), then all G train, plus ``--switch-s`` per
  step to swap rollout and training state.
* **(b) fully async** (verl ``fully_async_policy``, verl.md §2.2-2.4). G/2 rollout and G/2
  trainer GPUs. The rollouter keeps every slot busy, within the staleness budget: between two
  weight syncs it starts at most ``(1 + staleness) x P - leftover`` samples, where
  ``P = trigger x require_batches x mini_batch x n`` and ``leftover`` is what was queued or
  in flight at the sync. The trainer pulls ``require_batches x mini_batch x n`` samples per
  local update; every ``trigger`` updates a weight sync pauses both pools for ``--sync-s``
  (checkpoint engine + the client's 1 s resume sleep). Partial rollout: in-flight episodes
  are paused, not lost.
* **Not modelled:** decode throughput vs batch occupancy, prefix caching, response-length
  effects of staleness on learning, dynamic resource scheduling, stragglers' token budgets.

Output: per GPU count, the wall time of ``--steps`` steps in each mode, GPU utilisation
(busy GPU-seconds / (G x wall time)) and the speedup sync/async.

Usage: python benchmarks/async_vs_sync.py [--episodes trajectories.jsonl|times.json]
       [--gpus 8,16,32,64,128] [--steps 20] [--seed 0] (see --help for the rest)
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Default latency: lognormal, median 120 s, sigma 1.0 (mean ~198 s, p99 ~1230 s), capped at
# 1800 s (the response-length cap): the long tail of multi-turn agent episodes.
MEDIAN_S, SIGMA, CAP_S = 120.0, 1.0, 1800.0


@dataclass
class Params:
    prompts: int = 512  # per step (train_batch_size of the colocated run)
    n: int = 16
    mini_batch: int = 32  # prompts
    require_batches: int = 4
    trigger: int = 4
    staleness: float = 0.5
    slots: int = 16  # concurrent episodes per rollout GPU
    train_s: float = 4.0  # training GPU-seconds per sample
    switch_s: float = 10.0  # colocated rollout <-> train switch per step
    sync_s: float = 1.5  # fully-async weight sync (pause) per trigger
    steps: int = 20


def load_latencies(path: Path) -> list[float]:
    """Seconds per episode: a JSON list, or ``timings_s.total`` of each ``trajectories.jsonl``
    line (as ``sandlot rollout`` writes them)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        values = [r.get("timings_s", {}).get("total") for r in rows]
    else:
        values = json.loads(text)
    out = [float(v) for v in values if v is not None and float(v) > 0]
    if not out:
        raise SystemExit(f"{path}: no episode times")
    return out


def sampler(seed: int, measured: list[float] | None) -> Callable[[], float]:
    rng = random.Random(seed)
    if measured:
        return lambda: rng.choice(measured)  # bootstrap from the measured times
    return lambda: min(CAP_S, rng.lognormvariate(math.log(MEDIAN_S), SIGMA))


def simulate_sync(gpus: int, p: Params, draw: Callable[[], float]) -> tuple[float, float]:
    """(wall time, busy GPU-seconds) of ``p.steps`` colocated steps."""
    wall = busy = 0.0
    samples = p.prompts * p.n
    for _ in range(p.steps):
        slots = [0.0] * (gpus * p.slots)  # each slot's finish time, as a heap
        for _ in range(samples):
            start = heapq.heappop(slots)
            latency = draw()
            busy += latency / p.slots
            heapq.heappush(slots, start + latency)
        train = samples * p.train_s / gpus
        wall += max(slots) + train + p.switch_s
        busy += train * gpus
    return wall, busy


def simulate_async(gpus: int, p: Params, draw: Callable[[], float]) -> tuple[float, float]:
    """(wall time, busy GPU-seconds) until the trainer has consumed ``p.steps`` steps."""
    rollout_gpus, train_gpus = gpus // 2, gpus - gpus // 2
    update = p.require_batches * p.mini_batch * p.n  # samples per local update
    per_sync = p.trigger * update
    total = p.steps * p.prompts * p.n
    t = busy = 0.0
    inflight: list[float] = []  # finish times
    queued = consumed = updates = started_in_window = 0
    budget = (1 + p.staleness) * per_sync
    trainer_done: float | None = None  # finish time of the running update
    while consumed < total:
        while len(inflight) < rollout_gpus * p.slots and started_in_window < budget:
            latency = draw()
            busy += latency / p.slots
            heapq.heappush(inflight, t + latency)
            started_in_window += 1
        if trainer_done is None and queued >= update:
            queued -= update
            trainer_done = t + update * p.train_s / train_gpus
            busy += update * p.train_s
        next_finish = inflight[0] if inflight else math.inf
        if trainer_done is not None and trainer_done <= next_finish:
            t, trainer_done = trainer_done, None
            consumed += update
            updates += 1
            if updates % p.trigger == 0:  # weight sync: both pools pause, nothing is lost
                t += p.sync_s
                inflight = [f + p.sync_s for f in inflight]
                heapq.heapify(inflight)
                budget = (1 + p.staleness) * per_sync - (queued + len(inflight))
                started_in_window = 0
        elif inflight:
            t = heapq.heappop(inflight)
            queued += 1
        else:
            raise RuntimeError("deadlock: staleness budget below one update")
    return t, busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=Path, help="measured episode times (.json/.jsonl)")
    parser.add_argument("--gpus", default="8,16,32,64,128")
    parser.add_argument("--seed", type=int, default=0)
    for name, value in vars(Params()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    p = Params(**{k: getattr(args, k) for k in vars(Params())})
    measured = load_latencies(args.episodes) if args.episodes else None

    probe = sampler(args.seed, measured)
    draws = sorted(probe() for _ in range(20000))
    source = (
        f"{args.episodes} ({len(measured)} episodes, bootstrap)"
        if measured
        else (f"lognormal median {MEDIAN_S:.0f} s, sigma {SIGMA}, cap {CAP_S:.0f} s")
    )
    print(f"episode latency: {source}")
    print(
        f"  mean {sum(draws) / len(draws):.0f} s, p50 {draws[10000]:.0f} s, "
        f"p90 {draws[18000]:.0f} s, p99 {draws[19800]:.0f} s, max {draws[-1]:.0f} s"
    )
    print("inputs: " + ", ".join(f"{k}={v}" for k, v in vars(p).items()) + f", seed={args.seed}")
    print("async: rollout:trainer = G/2:G/2, partial rollout on\n")
    header = f"{'GPUs':>5} {'sync wall h':>11} {'sync util':>9} {'async wall h':>12} "
    print(header + f"{'async util':>10} {'speedup':>7}")
    for gpus in (int(g) for g in args.gpus.split(",")):
        sync_wall, sync_busy = simulate_sync(gpus, p, sampler(args.seed, measured))
        async_wall, async_busy = simulate_async(gpus, p, sampler(args.seed, measured))
        print(
            f"{gpus:>5} {sync_wall / 3600:>11.2f} {sync_busy / (gpus * sync_wall):>9.0%} "
            f"{async_wall / 3600:>12.2f} {async_busy / (gpus * async_wall):>10.0%} "
            f"{sync_wall / async_wall:>6.2f}x"
        )
    print(
        "\nverl published (verl.md §2.5, from verl/experimental/fully_async_policy/README.md ="
        " docs/advance/fully_async.md;\nQwen2.5-Math-7B DAPO on H20, colocate vs rollout:trainer,"
        " staleness 0.5, partial rollout):\n  32 GPUs 1.72x@100 / 2.66x@400 steps, 64 GPUs"
        " 2.09x / 1.92x, 128 GPUs 2.67x / 2.35x."
    )


if __name__ == "__main__":
    main()
