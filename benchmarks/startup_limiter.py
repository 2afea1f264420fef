"""Benchmark of the STARTING cap: 2,000 sandboxes against a simulated provider.

The provider (:class:`sandlot.testing.SimulatedCloud`, the one the scale tests use; no
network, no cloud) behaves the way the clouds do under a burst:

* it provisions ``--workers`` sandboxes at a time, each taking ``--create-s`` seconds (with
  +-50 % jitter); the rest wait in its queue;
* a create that has waited ``--queue-timeout-s`` in the queue fails ("runtime did not start",
  retryable), the failure uni-agent saw at concurrency >= 128 on Modal;
* with more than ``--burst`` creates in flight it refuses new ones at once (429, retryable).

Every sandbox starts through the real ``Sandbox.start()`` (retries with backoff and jitter, the
start budget, the process STARTING cap of :mod:`sandlot.sandboxes.scale.starting`), first with no
cap under a plain ``asyncio.gather`` (the naive baseline), then with STARTING caps 32 / 128 / 512,
in the same run. Time is simulated at ``--scale`` real seconds per simulated second, so the run
takes seconds; every figure is reported in simulated seconds.

Reported per configuration: time until every start has ended (started, or failed after all its
attempts), how many started, the peak number in STARTING (in the provider's hands), and the
failed create attempts (queue timeouts, 429s).

Usage: python benchmarks/startup_limiter.py [--n 2000] [--caps 32,128,512] [--scale 0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/startup_limiter.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandlot import SandboxSpec
from sandlot.sandboxes.scale.starting import StartLimits
from sandlot.testing import SimulatedCloud, SimulatedSandbox


@dataclass
class Outcome:
    label: str
    all_started_s: float
    peak_starting: int
    timeouts: int
    refused: int
    never_started: int


def run_one(label: str, cap: int, args: argparse.Namespace) -> Outcome:
    """Start ``args.n`` sandboxes with STARTING cap ``cap`` (0: none) under ``asyncio.gather``."""
    scale = args.scale
    provider = SimulatedCloud(
        latency_s=args.create_s,
        workers=args.workers,
        queue_timeout_s=args.queue_timeout_s,
        burst=args.burst,
        scale=scale,
        seed=0,
    )
    SimulatedSandbox.cloud = provider
    os.environ["SANDLOT_MAX_STARTING"] = str(cap)  # the process's STARTING cap, a setting
    limits = StartLimits(
        max_attempts=args.attempts,
        backoff_s=args.backoff_s * scale,
        backoff_max_s=30 * scale,
        budget_s=args.budget_s * scale,
    )
    spec = SandboxSpec(image="simulated", start_limits=limits)
    boxes = [SimulatedSandbox(spec) for _ in range(args.n)]

    async def main() -> float:
        began = time.monotonic()
        results = await asyncio.gather(*(sb.start() for sb in boxes), return_exceptions=True)
        elapsed = time.monotonic() - began
        failures = [r for r in results if isinstance(r, BaseException)]
        outcome.never_started = len(failures)
        return elapsed / scale

    outcome = Outcome(label, 0.0, 0, 0, 0, 0)
    outcome.all_started_s = anyio.run(main)
    outcome.peak_starting = provider.peak
    outcome.timeouts = provider.timeouts
    outcome.refused = provider.refused
    return outcome


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="sandboxes started at once")
    parser.add_argument("--caps", default="32,128,512", help="STARTING caps to compare")
    parser.add_argument("--workers", type=int, default=64, help="creates the provider runs at once")
    parser.add_argument("--create-s", type=float, default=2.0, help="seconds one create takes")
    parser.add_argument("--queue-timeout-s", type=float, default=30.0, help="queue wait that fails")
    parser.add_argument("--burst", type=int, default=1000, help="in-flight creates before 429s")
    parser.add_argument("--attempts", type=int, default=3, help="attempts per start")
    parser.add_argument("--backoff-s", type=float, default=2.0, help="first retry backoff")
    parser.add_argument("--budget-s", type=float, default=900.0, help="start budget")
    parser.add_argument("--scale", type=float, default=0.01, help="real seconds per simulated s")
    args = parser.parse_args(argv)
    logging.getLogger("sandlot").setLevel(logging.ERROR)  # one warning per retry otherwise

    outcomes = [run_one("naive asyncio.gather (no cap)", 0, args)]
    for cap in (int(c) for c in args.caps.split(",")):
        outcomes.append(run_one(f"STARTING cap {cap}", cap, args))

    table = Table(
        title=f"{args.n} sandboxes, provider: {args.workers} creates at a time x "
        f"{args.create_s:g} s, "
        f"queue timeout {args.queue_timeout_s:g} s, 429 above {args.burst} in flight "
        "(simulated seconds)"
    )
    for column in (
        "configuration",
        "all done (s)",
        "started",
        "peak STARTING",
        "queue timeouts",
        "429s",
    ):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for o in outcomes:
        table.add_row(
            o.label,
            f"{o.all_started_s:.1f}",
            f"{args.n - o.never_started}/{args.n}",
            str(o.peak_starting),
            str(o.timeouts),
            str(o.refused),
        )
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
