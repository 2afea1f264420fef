"""Benchmark of the ``local`` backend against a bare process spawn.

Measures, in one run and interleaved so that machine load affects all of them alike:

* ``subprocess.run(["bash", "-c", "true"])``: the floor, a process with no isolation;
* ``exec("true")`` in one open sandbox: a request to the sandbox's init, which forks
  ``bash -c true`` inside the sandbox's long-lived jail;
* open -> ``exec("true")`` -> close of a fresh sandbox (a jail and its init per sandbox);

then opens ``--concurrent`` sandboxes at once (all open at the same moment, each with its init
and running one command, nothing bounding them), counts the failures, and reports the memory
each idle sandbox costs (the host's available memory before and with all of them open).

Targets: exec median within 1.5x the raw spawn, open+exec+close median at most 10 ms, every
concurrent sandbox succeeding (issue #12).

Usage: python benchmarks/local_sandbox.py [--n 200] [--concurrent 1000] [--isolation bwrap]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/local_sandbox.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sandlot

EXEC_RATIO_TARGET = 1.5
OPEN_EXEC_CLOSE_TARGET_MS = 10.0
_WARMUP = 5


def _ms(samples: Sequence[float]) -> tuple[float, float]:
    """Median and 95th percentile of ``samples`` (seconds), in milliseconds."""
    return statistics.median(samples) * 1e3, statistics.quantiles(samples, n=20)[18] * 1e3


def _raw_spawn() -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-c", "true"], stdin=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


async def _sequential(n: int, isolation: str) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"raw": [], "exec": [], "open_exec_close": []}
    async with sandlot.open("local", isolation=isolation) as sb:
        for i in range(n + _WARMUP):
            raw = _raw_spawn()
            started = time.perf_counter()
            r = await sb.exec("true")
            exec_s = time.perf_counter() - started
            assert r.ok, r
            started = time.perf_counter()
            async with sandlot.open("local", isolation=isolation) as fresh:
                assert (await fresh.exec("true")).ok
            cycle_s = time.perf_counter() - started
            if i >= _WARMUP:
                samples["raw"].append(raw)
                samples["exec"].append(exec_s)
                samples["open_exec_close"].append(cycle_s)
    return samples


def _available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


async def _concurrent(count: int, isolation: str) -> tuple[int, list[str], float, float]:
    """Open ``count`` sandboxes, hold them all open, run one command in each, close them.

    Returns successes, failures, wall seconds, and MiB of host memory per open idle sandbox.
    """
    opened = 0
    all_open = anyio.Event()
    failures: list[str] = []
    succeeded = 0
    before = _available_kib()
    per_sandbox_mib = 0.0

    async def one(i: int) -> None:
        nonlocal opened, succeeded, per_sandbox_mib
        try:
            async with sandlot.open("local", isolation=isolation) as sb:
                opened += 1
                if opened == count:
                    await anyio.sleep(1)  # let the inits settle
                    per_sandbox_mib = (before - _available_kib()) / 1024 / count
                    all_open.set()
                await all_open.wait()
                r = await sb.exec(f"echo {i}")
                if r.stdout != f"{i}\n":
                    raise AssertionError(f"unexpected result {r}")
                succeeded += 1
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            all_open.set()  # the others must not wait for one that will never open

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return succeeded, failures, time.perf_counter() - started, per_sandbox_mib


def _verdict(ok: bool) -> str:
    return "[green]met[/green]" if ok else "[red]missed[/red]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="samples per measurement")
    parser.add_argument("--concurrent", type=int, default=1000, help="sandboxes open at once")
    parser.add_argument("--isolation", choices=["bwrap", "none"], default="bwrap")
    args = parser.parse_args(argv)

    console = Console()
    samples = anyio.run(_sequential, args.n, args.isolation)
    succeeded, failures, wall_s, mib = anyio.run(_concurrent, args.concurrent, args.isolation)

    raw, exec_, cycle = (_ms(samples[k]) for k in ("raw", "exec", "open_exec_close"))
    ratio = exec_[0] / raw[0]
    table = Table(title=f"local backend (isolation={args.isolation}, n={args.n})")
    for column in ("measurement", "median ms", "p95 ms", "target", "result"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    table.add_row('subprocess.run(["bash","-c","true"])', f"{raw[0]:.2f}", f"{raw[1]:.2f}", "", "")
    table.add_row(
        'exec("true")',
        f"{exec_[0]:.2f}",
        f"{exec_[1]:.2f}",
        f"<= {EXEC_RATIO_TARGET:g}x raw",
        f"{ratio:.2f}x raw {_verdict(ratio <= EXEC_RATIO_TARGET)}",
    )
    table.add_row(
        "open -> exec -> close",
        f"{cycle[0]:.2f}",
        f"{cycle[1]:.2f}",
        f"<= {OPEN_EXEC_CLOSE_TARGET_MS:.0f} ms",
        f"{cycle[0] / raw[0]:.2f}x raw {_verdict(cycle[0] <= OPEN_EXEC_CLOSE_TARGET_MS)}",
    )
    table.add_row(
        f"{args.concurrent} sandboxes open at once",
        "",
        "",
        "all succeed",
        f"{succeeded}/{args.concurrent} in {wall_s:.2f} s {_verdict(not failures)}",
    )
    table.add_row("host memory per idle open sandbox", f"{mib:.2f} MiB", "", "", "")
    console.print(table)
    for failure in sorted(set(failures))[:10]:
        console.print(f"[red]failure:[/red] {failure}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
