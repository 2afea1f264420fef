"""Benchmark: what the reward-integrity defences cost an evaluation of swe-mini.

Evaluates the gold patches of the eight swe-mini instances (``examples/swe-mini``) with the
defences on (revert of the model's test infrastructure, the pytest channel and its checks; see
``docs/reward-integrity.md``) and off (the SWE-bench harness's grading), alternating the two
for ``--rounds`` rounds in the same run so that both see the same machine load. Each instance
is one ``sandlot.rewards.evaluate`` call in a fresh sandbox, ``--workers`` at a time.

Reported: wall seconds per full pass (median over rounds) for each mode, the median per-step
seconds (``apply`` includes the revert and the plugin upload; ``tests`` the test command;
``total`` adds the reading and checking of the records), and the ratio defences-on / off
(target: < 1.10). Every gold patch must resolve in both modes, else the run exits 1.

Usage: python benchmarks/eval_integrity.py [--backend local] [--rounds 3] [--workers 2]
       (docker: --backend docker --image localhost/sandlot-base:bookworm)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/eval_integrity.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.result import EvalResult

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "swe-mini"


def _instances(backend: str, image: str | None) -> list[Instance]:
    dest = Path(tempfile.mkdtemp(prefix="swe-mini-repos-"))
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    out = []
    for inst in load_instances(EXAMPLES / "instances.jsonl"):
        update: dict[str, object] = {"repo_source": str(dest / Path(inst.repo_source or "").name)}
        if image:
            update.update(image=image, environment=None)
        out.append(inst.model_copy(update=update))
    return out


async def _pass(
    insts: list[Instance], backend: str, workers: int, checks: bool
) -> tuple[float, list[EvalResult]]:
    limiter = anyio.CapacityLimiter(workers)
    results: list[EvalResult] = []

    async def one(inst: Instance) -> None:
        async with limiter:
            results.append(
                await evaluate(inst, inst.patch, backend=backend, integrity_checks=checks)
            )

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for inst in insts:
            tg.start_soon(one, inst)
    return time.monotonic() - started, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local")
    ap.add_argument("--image", default=None, help="image for container backends (has pytest)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    insts = _instances(args.backend, args.image)
    walls: dict[bool, list[float]] = {True: [], False: []}
    steps: dict[bool, dict[str, list[float]]] = {True: {}, False: {}}
    failed = []
    for _ in range(args.rounds):
        for checks in (False, True):
            wall, results = anyio.run(_pass, insts, args.backend, args.workers, checks)
            walls[checks].append(wall)
            for r in results:
                if not r.resolved:
                    failed.append(f"{r.instance_id} (defences {'on' if checks else 'off'})")
                for step, secs in r.timings_s.items():
                    steps[checks].setdefault(step, []).append(secs)
    table = Table(title=f"swe-mini gold, {len(insts)} instances, backend {args.backend}")
    table.add_column("")
    table.add_column("defences off (s)", justify="right")
    table.add_column("defences on (s)", justify="right")
    table.add_column("ratio on/off", justify="right")

    def row(label: str, off: list[float], on: list[float]) -> float:
        a, b = statistics.median(off), statistics.median(on)
        table.add_row(label, f"{a:.3f}", f"{b:.3f}", f"{b / a:.3f}")
        return b / a

    ratio = row("wall per pass (median)", walls[False], walls[True])
    for step in ("setup", "apply", "tests", "total"):
        if step in steps[False] and step in steps[True]:
            row(f"  {step} per instance (median)", steps[False][step], steps[True][step])
    Console().print(table)
    print(f"wall ratio defences on/off: {ratio:.3f} (target < 1.10)")
    if failed:
        print("NOT RESOLVED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
