"""Benchmark of sandbox groups (issue #22): set an instance up once, fork it n times.

A group of ``--n`` (8) sandboxes of one instance whose ``post_setup_cmd`` writes a small
repository (``--files`` files) and then takes ``--setup-s`` (2) seconds, opened two ways in
the same run, on each backend given:

* **independent**: ``--n`` sandboxes, each opened and set up from the spec (concurrently);
* **snapshot + fork**: one sandbox set up, ``snapshot()``, closed; ``--n`` forks
  (``sandlot.open(snapshot=)``) started concurrently.

Reported: the set-up cost summed over the sandboxes, each from "open" to "ready to run the
first command" (``start()`` returned; what a busy cluster pays, whatever the parallelism), for
the fork path the set-up sandbox's start and the snapshot included; their ratio (goal >= 5x);
the cost of one fork (mean start of the ``--n`` started at once, and of one started alone
afterwards: what the backend's start costs without the others competing for the engine and
the cores). Then the same with a CPU-bound set-up (an ``awk`` loop
calibrated to take ``--setup-s`` alone, so ``--n`` at once share this machine's cores): the
wall time until all ``--n`` sandboxes are ready, independent vs ``sandlot.open_group``.

Last, a **training-shaped** case (issue #35): the ``--n`` samples of one instance, as
``sandlot rollout -n`` and the verl loop run them, each opening an agent sandbox, working in
it for ``--agent-s`` (1) seconds, a little longer per sample (episodes end apart), closing it,
then opening a sandbox for its grading and running the tests there. The set-up (``prepare``:
the repository, then ``--setup-s`` seconds) is the same for both. Three ways, in the same run:
**none** (every sandbox set up), **agents shared** (the agents through a
:class:`~sandlot.sandboxes.setups.cache.SetupCache`, every grading set up: the code before
this issue) and **agents + gradings** (the gradings fork the instance's clean set-up too).
The cost is sandbox-seconds spent making sandboxes ready, summed over the group: every
``start()`` (set-up sandboxes and forks), every ``prepare`` and every ``snapshot()``; a
sample waiting for its group's set-up spends none. The goal: agents + gradings >= 4x lower
than agents shared.

Backends: ``local`` (``image="host"``), ``local-image`` (``--local-image``, a container image
reference for ``local``, e.g. ``oci-archive:/tmp/x.tar``), ``docker`` (``$SANDLOT_TEST_IMAGE``
on ``$DOCKER_HOST``).

Usage: python benchmarks/groups.py [--backends local,local-image,docker] [--n 8]
       [--setup-s 2] [--agent-s 1] [--local-image REF] [--cases groups,cpu,training]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/groups.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sandlot
from sandlot import Sandbox
from sandlot.sandboxes.setups.cache import SetupCache

RATIO_TARGET = 5.0
TRAINING_TARGET = 4.0


@dataclass
class Costs:
    """Seconds from open to ready: the sum over a group, and the parts of the fork path."""

    independent: list[float]
    builder: float = 0.0
    snapshot: float = 0.0
    forks: tuple[float, ...] = ()
    alone: float = 0.0

    @property
    def grouped(self) -> float:
        return self.builder + self.snapshot + sum(self.forks)


def _fields(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    if backend == "local":
        return {"backend": "local"}
    if backend == "local-image":
        return {"backend": "local", "image": args.local_image}
    return {"backend": "docker", "image": os.environ["SANDLOT_TEST_IMAGE"], "pull": "never"}


def _repository(files: int) -> str:
    return f"mkdir -p repo && for i in $(seq {files}); do echo $i > repo/f$i.py; done"


async def _timed_start(sb: Sandbox) -> float:
    started = time.perf_counter()
    await sb.start()
    return time.perf_counter() - started


async def _concurrently(sandboxes: list[Sandbox]) -> list[float]:
    """Start all, concurrently; each one's open -> ready seconds (they stay open)."""
    times: list[float] = [0.0] * len(sandboxes)

    async def one(i: int) -> None:
        times[i] = await _timed_start(sandboxes[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(sandboxes)):
            tg.start_soon(one, i)
    return times


async def _closing(
    sandboxes: list[Sandbox], body: Callable[[], Awaitable[list[float]]]
) -> list[float]:
    try:
        return await body()
    finally:
        for sb in sandboxes:
            await sb.close()


async def sleep_costs(fields: dict[str, Any], args: argparse.Namespace) -> Costs:
    """The set-up cost of a group, independent vs snapshot + fork (set-up: a sleep)."""
    setup = f"{_repository(args.files)} && sleep {args.setup_s}"
    group = [sandlot.open(post_setup_cmd=setup, **fields) for _ in range(args.n)]
    costs = Costs(await _closing(group, lambda: _concurrently(group)))
    builder = sandlot.open(post_setup_cmd=setup, **fields)
    try:
        costs.builder = await _timed_start(builder)
        started = time.perf_counter()
        snap = await builder.snapshot()
        costs.snapshot = time.perf_counter() - started
    finally:
        await builder.close()
    try:
        forks = [sandlot.open(snapshot=snap) for _ in range(args.n)]
        costs.forks = tuple(await _closing(forks, lambda: _concurrently(forks)))
        alone = [sandlot.open(snapshot=snap)]
        (costs.alone,) = await _closing(alone, lambda: _concurrently(alone))
    finally:
        await snap.delete()
    return costs


async def _calibrate(fields: dict[str, Any], seconds: float) -> int:
    """Iterations of the ``awk`` loop that take ``seconds`` of one core in a sandbox."""
    iterations = 2_000_000
    async with sandlot.open(**fields) as sb:
        while True:
            r = await sb.exec(f"awk 'BEGIN{{for(i=0;i<{iterations};i++)s+=i}}'")
            if r.duration_s >= 0.5:
                return int(iterations * seconds / r.duration_s)
            iterations *= 4


async def cpu_walls(fields: dict[str, Any], args: argparse.Namespace) -> tuple[float, float]:
    """Wall seconds until ``n`` sandboxes are ready with a CPU-bound set-up: independent,
    then ``open_group``."""
    loops = await _calibrate(fields, args.setup_s)
    setup = f"{_repository(args.files)} && awk 'BEGIN{{for(i=0;i<{loops};i++)s+=i}}'"
    group = [sandlot.open(post_setup_cmd=setup, **fields) for _ in range(args.n)]
    started = time.perf_counter()
    await _closing(group, lambda: _concurrently(group))
    independent = time.perf_counter() - started
    started = time.perf_counter()
    async with sandlot.open_group(n=args.n, post_setup_cmd=setup, **fields):
        grouped = time.perf_counter() - started
    return independent, grouped


class _Meter:
    """Sandbox-seconds spent making sandboxes ready: every ``Sandbox.start`` and
    ``Sandbox.snapshot`` while metering (the benchmark's own instrument), and the set-ups
    the case adds."""

    def __init__(self) -> None:
        self.spent = 0.0

    @contextlib.contextmanager
    def metering(self) -> Iterator[None]:
        start, snapshot = Sandbox.start, Sandbox.snapshot

        async def timed_start(sb: Sandbox) -> None:
            started = time.perf_counter()
            try:
                await start(sb)
            finally:
                self.spent += time.perf_counter() - started

        async def timed_snapshot(sb: Sandbox) -> Any:
            started = time.perf_counter()
            try:
                return await snapshot(sb)
            finally:
                self.spent += time.perf_counter() - started

        Sandbox.start = timed_start  # type: ignore[method-assign,assignment]
        Sandbox.snapshot = timed_snapshot  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            Sandbox.start = start  # type: ignore[method-assign]
            Sandbox.snapshot = snapshot  # type: ignore[method-assign]


async def training_cost(fields: dict[str, Any], args: argparse.Namespace, way: str) -> float:
    """The summed set-up cost of one group of ``n`` samples, agent + grading, ``way``:
    ``"none"``, ``"agents"`` (agents shared) or ``"both"`` (agents and gradings shared)."""
    proto = sandlot.open(**fields)  # validated once, never started
    backend, spec, options = proto.name, proto.spec, proto.options
    meter = _Meter()
    repository = _repository(args.files)

    async def prepare(sb: Sandbox) -> None:
        started = time.perf_counter()
        await sb.exec(f"{repository} && sleep {args.setup_s}")
        meter.spent += time.perf_counter() - started

    async def opened(setups: SetupCache | None, key: str, fork_first: bool) -> Sandbox:
        if setups is None:
            sb = sandlot.open(backend, spec, options=options)
            await sb.start()
            try:
                await prepare(sb)
            except BaseException:
                await sb.close()
                raise
            return sb
        return await setups.open(
            key, backend, spec, options, prepare, group_size=args.n, fork_first=fork_first
        )

    async def sample(i: int, agents: SetupCache | None, gradings: SetupCache | None) -> None:
        async with await opened(agents, "agent", False) as sb:
            await anyio.sleep(args.agent_s * (1 + i / args.n))
            await sb.exec("echo patch >> repo/f1.py")
        async with await opened(gradings, "grading", True) as sb:
            await sb.exec("cat repo/f1.py > /dev/null")

    with meter.metering():
        async with contextlib.AsyncExitStack() as stack:
            setups = await stack.enter_async_context(contextlib.aclosing(SetupCache()))
            agents = setups if way in ("agents", "both") else None
            gradings = setups if way == "both" else None
            async with anyio.create_task_group() as tg:
                for i in range(args.n):
                    tg.start_soon(sample, i, agents, gradings)
    return meter.spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,local-image,docker")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--setup-s", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--local-image", default=None)
    parser.add_argument("--agent-s", type=float, default=1.0)
    parser.add_argument("--cases", default="groups,cpu,training")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    backends = [b for b in args.backends.split(",") if b != "local-image" or args.local_image]
    console = Console()
    costs = Table(title=f"set-up cost of a group of {args.n}, summed open -> ready (s)")
    for column in ("backend", "independent", "snapshot + fork", "ratio", "set-up + snapshot",
                   "per fork", "fork alone", "goal"):  # fmt: skip
        costs.add_column(column, justify="right")
    walls = Table(title=f"CPU-bound set-up: wall time to {args.n} ready sandboxes (s)")
    for column in ("backend", "independent", "open_group", "ratio"):
        walls.add_column(column, justify="right")
    training = Table(
        title=f"training-shaped: {args.n} samples, agent + grading, set-up cost summed (s)"
    )
    for column in ("backend", "none", "agents shared", "agents + gradings", "ratio", "goal"):
        training.add_column(column, justify="right")
    for backend in backends:
        fields = _fields(backend, args)
        if "training" in cases:
            none, before, both = (
                anyio.run(training_cost, fields, args, way) for way in ("none", "agents", "both")
            )
            ratio = before / both
            training.add_row(
                backend,
                f"{none:.2f}",
                f"{before:.2f}",
                f"{both:.2f}",
                f"{ratio:.1f}x ({none / both:.1f}x vs none)",
                "met" if ratio >= TRAINING_TARGET else f"missed (< {TRAINING_TARGET:g}x)",
            )
        if "groups" in cases:
            c = anyio.run(sleep_costs, fields, args)
            ratio = sum(c.independent) / c.grouped
            costs.add_row(
                backend,
                f"{sum(c.independent):.2f}",
                f"{c.grouped:.2f}",
                f"{ratio:.1f}x",
                f"{c.builder:.2f} + {c.snapshot:.2f}",
                f"{statistics.mean(c.forks):.3f}",
                f"{c.alone:.3f}",
                "met" if ratio >= RATIO_TARGET else f"missed (< {RATIO_TARGET:g}x)",
            )
        if "cpu" in cases:
            independent, grouped = anyio.run(cpu_walls, fields, args)
            walls.add_row(backend, f"{independent:.2f}", f"{grouped:.2f}",
                          f"{independent / grouped:.1f}x")  # fmt: skip
    for table, case in ((costs, "groups"), (walls, "cpu"), (training, "training")):
        if case in cases:
            console.print(table)
    console.print(f"{os.cpu_count()} cores; set-up {args.setup_s:g} s, {args.files} files")


if __name__ == "__main__":
    main()
