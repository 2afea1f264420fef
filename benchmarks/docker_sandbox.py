"""sandlot's docker backend against the raw docker SDK, on the same engine in one run.

    export DOCKER_HOST=...   # any Docker API engine (docs/docker.md); unset: the default socket
    python benchmarks/docker_sandbox.py [--rounds 30] [--execs 100] [--image IMAGE]

Measures, as median and p95 in milliseconds:
  * lifecycle: start -> first exec("true") -> close;
  * exec: one exec("true") in a running sandbox / container;
and the number of sandboxes started per second at concurrency 1, 8 and 32. The raw baseline
makes the same engine calls with the SDK's low-level ``APIClient`` (create + start,
exec_create + exec_start + exec_inspect, remove with force), synchronously, for a container
configured like sandlot's (PID 1, labels, working directory, no network, pids limit), so the
ratios show sandlot's own overhead (target: at most 1.2x). sandlot makes no exec_inspect (the
exit status comes with the output) but runs every command under its wrapper shell.

Run it from the repository root so that ``sandlot`` imports from the working tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import docker
from rich.console import Console
from rich.table import Table

from sandlot.sandboxes.docker import DockerOptions, DockerSandbox
from sandlot.sandboxes.shared.remote_shell import init_argv
from sandlot.sandboxes.spec import SandboxSpec

INIT = init_argv(3600)
LEVELS = (1, 8, 32)


def summary(samples: list[float]) -> tuple[float, float]:
    """(median, p95) of ``samples`` in seconds."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


# --------------------------------------------------------------------------- raw SDK


class Raw:
    """The same steps with the low-level SDK client."""

    def __init__(self, image: str) -> None:
        self.api = docker.from_env(max_pool_size=32).api
        self.image = image

    def start(self) -> str:
        host_config = self.api.create_host_config(network_mode="none", pids_limit=4096)
        name = f"raw-{uuid.uuid4().hex[:12]}"
        labels = {"bench.run_id": "raw", "bench.created_at": str(int(time.time()))}
        labels |= {"bench.owner": "bench@host", "bench.sandbox_id": name}
        cid: str = self.api.create_container(
            self.image,
            entrypoint=INIT,
            name=name,
            labels=labels,
            working_dir="/testbed",
            host_config=host_config,
            detach=True,
        )["Id"]
        self.api.start(cid)
        return cid

    def exec_true(self, cid: str) -> int:
        exec_id = self.api.exec_create(cid, ["true"])["Id"]
        self.api.exec_start(exec_id)
        code: int = self.api.exec_inspect(exec_id)["ExitCode"]
        return code

    def close(self, cid: str) -> None:
        self.api.remove_container(cid, force=True)

    def lifecycle(self) -> None:
        cid = self.start()
        self.exec_true(cid)
        self.close(cid)

    def started_per_second(self, concurrency: int, total: int) -> float:
        began = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            cids = list(pool.map(lambda _: self.start(), range(total)))
        rate = total / (time.perf_counter() - began)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self.close, cids))
        return rate


def timed_sync(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


# --------------------------------------------------------------------------- sandlot


def sandbox(image: str) -> DockerSandbox:
    return DockerSandbox(SandboxSpec(image=image), DockerOptions(pull="never"))


async def timed_async(fn: Callable[[], Awaitable[object]]) -> float:
    began = time.perf_counter()
    await fn()
    return time.perf_counter() - began


async def sandlot_lifecycle(image: str) -> None:
    async with sandbox(image) as sb:
        await sb.exec("true")


async def sandlot_started_per_second(image: str, concurrency: int, total: int) -> float:
    limit = anyio.Semaphore(concurrency)
    boxes = [sandbox(image) for _ in range(total)]

    async def start(sb: DockerSandbox) -> None:
        async with limit:
            await sb.start()

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for sb in boxes:
            tg.start_soon(start, sb)
    rate = total / (time.perf_counter() - began)
    async with anyio.create_task_group() as tg:
        for sb in boxes:
            tg.start_soon(sb.close)
    return rate


async def measure(raw: Raw, image: str, rounds: int, execs: int) -> dict[str, Any]:
    """All measurements; raw and sandlot alternate so that load drift hits both alike.

    The raw calls block the event loop, which is idle meanwhile.
    """
    raw.lifecycle()  # warm-up: images, connections, client creation
    await sandlot_lifecycle(image)
    got: dict[str, Any] = {"lifecycle": ([], []), "exec": ([], []), "rates": {}}
    for _ in range(rounds):
        got["lifecycle"][0].append(await timed_async(lambda: sandlot_lifecycle(image)))
        got["lifecycle"][1].append(timed_sync(raw.lifecycle))
    cid = raw.start()
    try:
        async with sandbox(image) as sb:
            for _ in range(execs):
                got["exec"][0].append(await timed_async(lambda: sb.exec("true")))
                got["exec"][1].append(timed_sync(lambda: raw.exec_true(cid)))
    finally:
        raw.close(cid)
    for c in LEVELS:
        ours = await sandlot_started_per_second(image, c, 32)
        got["rates"][c] = (ours, raw.started_per_second(c, 32))
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="lifecycles per side")
    parser.add_argument("--execs", type=int, default=100, help="exec('true') calls per side")
    parser.add_argument(
        "--image", default=os.environ.get("SANDLOT_TEST_IMAGE", "localhost/sandlot-base:bookworm")
    )
    args = parser.parse_args()
    console = Console(width=max(Console().width, 100))
    console.print(f"engine: DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}, {args.image}")

    got = anyio.run(measure, Raw(args.image), args.image, args.rounds, args.execs)

    table = Table(title="sandlot docker backend vs raw docker SDK, milliseconds")
    for col in ("step", "sandlot p50", "sandlot p95", "raw p50", "raw p95", "p50 ratio"):
        table.add_column(col, justify="right" if col != "step" else "left")
    for name, key in (("start+exec+close", "lifecycle"), ("exec(true)", "exec")):
        mine, base = got[key]
        (m_med, m_p95), (r_med, r_p95) = summary(mine), summary(base)
        table.add_row(
            name,
            f"{m_med * 1e3:.1f}",
            f"{m_p95 * 1e3:.1f}",
            f"{r_med * 1e3:.1f}",
            f"{r_p95 * 1e3:.1f}",
            f"{m_med / r_med:.2f}x",
        )
    console.print(table)

    rates = Table(title="sandboxes started per second (32 per level)")
    for col in ("concurrency", "sandlot /s", "raw SDK threads /s", "raw/sandlot"):
        rates.add_column(col, justify="right")
    for c in LEVELS:
        ours, theirs = got["rates"][c]
        rates.add_row(str(c), f"{ours:.1f}", f"{theirs:.1f}", f"{theirs / ours:.2f}x")
    console.print(rates)


if __name__ == "__main__":
    main()
