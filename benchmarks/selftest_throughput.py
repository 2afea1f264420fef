"""Benchmark of ``sandlot data selftest`` (issue #36): what judging every row costs beside
evaluating its gold and empty patches separately.

The swe-mini examples (8 rows, their repositories built in a temporary directory), ``-j``
(4) evaluations at a time, through the API the commands use, on each backend given; rounds
(``--rounds``, 3) alternate the three ways so the machine's load falls on each alike, after one
warm-up round (environments built, images ready) that is not counted:

* **selftest**: :func:`~sandlot.rewards.selftest.run_selftest`: per row one set-up,
  snapshotted, and two forks: the gold patch and the repository before the fix, tests run in
  both (``--repeats 1``);
* **eval gold + empty**: ``sandlot eval --predictions gold``, then ``--predictions`` of the
  empty patches, as two runs (``run_evaluation``); an empty patch is graded without a sandbox,
  so the second run costs nothing and tests nothing;
* **eval gold + before**: the same work as selftest done separately: the gold run, then a
  run of the empty patches with their tests run (``test_empty``), each evaluation setting its
  sandbox up.

Reported: the median wall time of each way over the rounds, and selftest's ratio to each
baseline (goal <= 1.2x). Every verdict is checked (8 kept, gold 8/8) so a broken run cannot
pass for a fast one.

Usage: python benchmarks/selftest_throughput.py [--backends local,docker] [-j 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/selftest_throughput.py` puts benchmarks/ first on sys.path, not the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.predictions import Prediction, gold_predictions
from sandlot.rewards.runner import run_evaluation
from sandlot.rewards.selftest import run_selftest

SWE_MINI = Path(__file__).resolve().parents[1] / "examples" / "swe-mini"
TARGET = 1.2
TEST_IMAGE = "localhost/sandlot-base:bookworm"


def _rows(root: Path, backend: str, image: str) -> list[Instance]:
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(root / "repos")],
        check=True,
        capture_output=True,
    )
    shutil.copy(SWE_MINI / "instances.jsonl", root / "instances.jsonl")
    rows = load_instances(root / "instances.jsonl")
    return [r.model_copy(update={"image": image}) for r in rows] if backend == "docker" else rows


def _empty(rows: list[Instance], model: str) -> dict[str, Prediction]:
    return {
        r.instance_id: Prediction(instance_id=r.instance_id, model_name_or_path=model) for r in rows
    }


async def _selftest(rows: list[Instance], out: Path, backend: str, workers: int) -> None:
    outcome = await run_selftest(
        rows, run_id="selftest", output_dir=out, backend=backend, workers=workers
    )
    rejected = [v.model_dump(mode="json") for v in outcome.verdicts if not v.kept]
    assert not rejected, json.dumps(rejected, indent=1)


async def _gold(rows: list[Instance], out: Path, backend: str, workers: int) -> None:
    gold = await run_evaluation(
        rows, gold_predictions(rows), run_id="gold", output_dir=out, backend=backend,
        workers=workers,
    )  # fmt: skip
    assert gold.report["resolved_instances"] == len(rows), gold.report


async def _gold_and_empty(rows: list[Instance], out: Path, backend: str, workers: int) -> None:
    await _gold(rows, out, backend, workers)
    empty = await run_evaluation(
        rows, _empty(rows, "empty"), run_id="empty", output_dir=out, backend=backend,
        workers=workers,
    )  # fmt: skip
    assert empty.report["empty_patch_instances"] == len(rows), empty.report


async def _gold_and_before(rows: list[Instance], out: Path, backend: str, workers: int) -> None:
    await _gold(rows, out, backend, workers)
    before = await run_evaluation(
        rows, _empty(rows, "before"), run_id="before", output_dir=out, backend=backend,
        workers=workers, test_empty=True,
    )  # fmt: skip
    assert before.report["error_instances"] == 0, before.report
    assert not any(r.resolved for r in before.results.values())


WAYS: dict[str, Callable[[list[Instance], Path, str, int], Awaitable[None]]] = {
    "selftest": _selftest,
    "eval gold + empty": _gold_and_empty,
    "eval gold + before": _gold_and_before,
}


def _timed(way: str, rows: list[Instance], backend: str, workers: int) -> float:
    with tempfile.TemporaryDirectory(prefix="selftest-bench-") as out:
        started = time.monotonic()
        anyio.run(WAYS[way], rows, Path(out), backend, workers)
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="local")
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default=TEST_IMAGE, help="the docker backend's image")
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"selftest vs separate evaluations, swe-mini (8 rows), -j {args.workers}")
    for column in ("backend", "way", "median s", "runs s", "selftest / this"):
        table.add_column(column)
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="selftest-rows-") as root:
            rows = _rows(Path(root), backend, args.image)
            for way in WAYS:  # warm-up: environments, images
                _timed(way, rows, backend, args.workers)
            runs: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(args.rounds):
                for way in WAYS:
                    runs[way].append(_timed(way, rows, backend, args.workers))
                    console.print(f"{backend} {way}: {runs[way][-1]:.2f} s")
        medians = {way: statistics.median(times) for way, times in runs.items()}
        for way, times in runs.items():
            ratio = medians["selftest"] / medians[way]
            verdict = (
                ""
                if way == "selftest"
                else f"{ratio:.2f}x" + (" (goal <= 1.2x)" if ratio > TARGET else "")
            )
            table.add_row(
                backend, way, f"{medians[way]:.2f}", " ".join(f"{t:.1f}" for t in times), verdict
            )
    console.print(table)


if __name__ == "__main__":
    main()
