"""Benchmark of the rollout scheduler: throughput on ``local`` and the scheduler's own overhead.

Two measurements, in one run:

1. **Throughput**: ``examples/swe-mini`` episodes (repeated as samples) through the real stack
   (the scripted OpenAI-compatible server of ``tests/rollout/scripted_server.py`` serving the
   ``solver`` policy over HTTP, ``OpenAIChatPolicy``, the agent loop, ``local`` bubblewrap
   sandboxes, the evaluation in a fresh sandbox, ``trajectories.jsonl`` appends) at concurrency
   1, 8, 32 and 128 (``--levels``). Reported per level: episodes per minute, the speed-up over
   concurrency 1, and the share of episode time spent in sandbox start (+ repository setup),
   model calls, tools and evaluation. Expect near-linear scaling until the machine is
   CPU-bound (every episode runs pytest twice).
2. **Scheduler overhead**: the same agent loop and scheduler with a fake sandbox (every command
   returns at once) and a fake model (a tool call per turn, at once), so everything measured is
   sandlot's own work per step: the scheduler, the agent loop, the toolbox, the trajectory and
   its durable append. Reported as milliseconds per episode step (target < 1 ms), and the
   scheduler alone (episodes that return a ready trajectory) per episode.

With ``--groups`` each level runs twice, the second time with the samples of a row sharing
one set-up (:class:`~sandlot.sandboxes.setups.cache.SetupCache`, as ``sandlot rollout -n``).

Usage: python benchmarks/rollout_throughput.py [--levels 1,8,32,128] [--episodes N]
       [--overhead-episodes 1000] [--steps 20] [--skip-throughput] [--groups]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import aclosing
from itertools import product
from pathlib import Path
from typing import Any, ClassVar

import anyio
from rich.console import Console
from rich.table import Table

# `python benchmarks/rollout_throughput.py` puts benchmarks/ first on sys.path, not the checkout.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from rollout.scripted_server import ScriptedServer  # noqa: E402  (tests/ helper, stdlib only)

from sandlot.cli.env_cmd import distinct_recipes  # noqa: E402
from sandlot.datasets.rows import TaskRow  # noqa: E402
from sandlot.result import ExecResult  # noqa: E402
from sandlot.rollout.config import AgentConfig, parse_agent_config  # noqa: E402
from sandlot.rollout.episodes import Gauges, InProcessEpisodes  # noqa: E402
from sandlot.rollout.llm import OpenAIChatPolicy  # noqa: E402
from sandlot.rollout.policy import Message, PolicyTurn  # noqa: E402
from sandlot.rollout.record import EpisodeRecord  # noqa: E402
from sandlot.rollout.rows import load_rows  # noqa: E402
from sandlot.rollout.scheduler import run_rollout  # noqa: E402
from sandlot.rollout.store import TrajectoryLog  # noqa: E402
from sandlot.rollout.trajectory import ExitReason, Trajectory  # noqa: E402
from sandlot.runtimes.observation import Observation  # noqa: E402
from sandlot.runtimes.session import BashSession  # noqa: E402
from sandlot.sandboxes.base import Command, Sandbox  # noqa: E402
from sandlot.sandboxes.registry import get_backend, register_backend  # noqa: E402
from sandlot.sandboxes.setups.cache import SetupCache  # noqa: E402
from sandlot.tools.parsers import ToolCall  # noqa: E402

SWE_MINI = ROOT / "examples" / "swe-mini"
OVERHEAD_TARGET_MS = 1.0
USER_TEMPLATE = (
    "<task id={instance_id}>\n{problem_statement}\n</task>\n"
    "The repository is in {workdir}. Fix the issue, then call submit."
)
PHASES = ("start", "model", "tools", "eval")


# --------------------------------------------------------------------------- throughput


def _swe_mini(workdir: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The swe-mini instances next to freshly built repositories."""
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(workdir / "repos")],
        check=True,
        capture_output=True,
    )
    dataset = workdir / "instances.jsonl"
    shutil.copy(SWE_MINI / "instances.jsonl", dataset)
    records = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    return dataset, records


async def _throughput_level(
    rows: list[TaskRow],
    url: str,
    config: AgentConfig,
    concurrency: int,
    episodes: int,
    out: Path,
    grouped: bool,
) -> dict[str, float]:
    samples = math.ceil(episodes / len(rows))
    log_path = out / f"c{concurrency}{'-groups' if grouped else ''}" / "trajectories.jsonl"
    async with OpenAIChatPolicy(url, "solver") as policy, aclosing(SetupCache()) as setups:
        with (
            TrajectoryLog(log_path) as log,
            InProcessEpisodes(
                policy,
                config,
                backend="local",
                model_name_or_path="solver",
                setups=setups if grouped else None,
            ) as eps,
        ):
            started = time.monotonic()
            await run_rollout(rows, eps, log, samples=samples, concurrency=concurrency)
            wall = time.monotonic() - started
            records = list(log.records.values())
    return _figures(records, wall)


def _figures(records: list[EpisodeRecord], wall: float) -> dict[str, float]:
    total = sum(r.timings_s.get("total", 0.0) for r in records) or 1.0

    def share(*keys: str) -> float:
        return sum(r.timings_s.get(k, 0.0) for r in records for k in keys) / total

    return {
        "episodes": len(records),
        "wall_s": wall,
        "per_min": len(records) / wall * 60,
        "resolved": sum(r.resolved for r in records),
        "errors": sum(r.exit_reason is ExitReason.INFRA_ERROR for r in records),
        "start": share("start", "setup"),
        "model": share("model"),
        "tools": share("tools"),
        "eval": share("eval"),
    }


def throughput(args: argparse.Namespace, console: Console) -> Table:
    levels = [int(c) for c in args.levels.split(",")]
    table = Table(
        title="swe-mini episodes on local (scripted solver over HTTP, evaluation in a fresh "
        "sandbox)"
    )
    for column in (
        "concurrency",
        "episodes",
        "wall s",
        "episodes/min",
        "speed-up",
        "resolved",
        "start+setup",
        "model",
        "tools",
        "eval",
    ):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory(prefix="sandlot-bench-rollout-") as tmp:
        work = Path(tmp)
        dataset, records = _swe_mini(work)
        rows = load_rows(dataset, backend="local")
        config = parse_agent_config(
            {
                "sandbox": {"backend": "local"},
                "prompt": {"user": USER_TEMPLATE},
                "interaction": {"max_turns": 12},
            }
        )
        local = get_backend("local")
        for recipe in distinct_recipes([r.instance for r in rows], "local"):
            anyio.run(local.build_environment, recipe)  # cached: not part of the figures
        base: float | None = None
        with ScriptedServer(records) as server:
            for concurrency, grouped in product(levels, (False, True) if args.groups else (False,)):
                episodes = args.episodes or max(8, concurrency)
                console.print(f"concurrency {concurrency}: {episodes} episodes ...")
                level = (rows, server.url, config, concurrency, episodes, work, grouped)
                f = anyio.run(_throughput_level, *level)
                base = base or f["per_min"]
                table.add_row(
                    f"{concurrency}{' groups' if grouped else ''}",
                    f"{f['episodes']:.0f}",
                    f"{f['wall_s']:.1f}",
                    f"{f['per_min']:.1f}",
                    f"{f['per_min'] / base:.2f}x",
                    f"{f['resolved']:.0f}/{f['episodes']:.0f}",
                    *(f"{f[p]:.0%}" for p in PHASES),
                )
    return table


# --------------------------------------------------------------------------- overhead


class _InstantSession(BashSession):
    async def _run(self, command: str, timeout: float | None, idle_timeout: float | None) -> Any:
        return Observation(output="ok\n", exit_code=0)

    async def _interrupt(self) -> None:
        return None

    async def _close(self) -> None:
        return None


class InstantSandbox(Sandbox):
    """Every command succeeds at once with no output (the diff of ``submit`` is empty)."""

    name: ClassVar[str] = "bench-instant"

    async def _start(self) -> None:
        return None

    async def _close(self) -> None:
        return None

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        return ExecResult(exit_code=0)

    async def _open_shell(self, name: str, config: Any) -> BashSession:
        return _InstantSession(name, config)

    async def is_alive(self) -> bool:
        return not self.closed

    async def read_file(self, path: str) -> bytes:
        return b""

    async def write_file(self, path: str, data: bytes | str) -> None:
        return None

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        return None

    async def download(self, remote_path: str, local_path: str | Path) -> None:
        return None


class InstantPolicy:
    """``steps - 1`` native ``bash`` calls, then ``submit``; answers at once."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    async def generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        turn = sum(1 for m in messages if m["role"] == "assistant") + 1
        call = ToolCall("submit") if turn >= self.steps else ToolCall("bash", {"command": "ls"})
        return PolicyTurn(
            content=f"step {turn}", tool_calls=[call], prompt_tokens=100, completion_tokens=10
        )

    def secrets(self) -> list[str]:
        return []


class ReadyEpisodes:
    """Episodes that return a ready trajectory: only the scheduler and the append remain."""

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        return Trajectory(
            instance_id=row.instance.instance_id, sample=sample, exit_reason=ExitReason.SUBMITTED
        )

    async def gauges(self) -> Gauges:
        return Gauges()


async def _overhead(episodes: int, steps: int, concurrency: int, out: Path) -> dict[str, float]:
    register_backend(InstantSandbox.name, InstantSandbox)
    # The rows' repo_source must exist on this machine, even though the fake never reads it.
    dataset, _ = _swe_mini(out)
    rows = load_rows(dataset, backend=InstantSandbox.name, image="none")
    samples = math.ceil(episodes / len(rows))
    config = parse_agent_config(
        {
            "sandbox": {"backend": InstantSandbox.name},
            "interaction": {"max_turns": steps + 1},
        }
    )
    with (
        TrajectoryLog(out / "loop" / "trajectories.jsonl") as log,
        InProcessEpisodes(InstantPolicy(steps), config, backend=InstantSandbox.name) as eps,
    ):
        started = time.perf_counter()
        await run_rollout(rows, eps, log, samples=samples, concurrency=concurrency)
        loop_s = time.perf_counter() - started
        done = list(log.records.values())
    total_steps = sum(r.num_turns for r in done)
    assert all(r.exit_reason is ExitReason.SUBMITTED for r in done), "fake episodes failed"
    with TrajectoryLog(out / "ready" / "trajectories.jsonl") as log:
        started = time.perf_counter()
        await run_rollout(rows, ReadyEpisodes(), log, samples=samples, concurrency=concurrency)
        ready_s = time.perf_counter() - started
        ready = len(log.records)
    return {
        "episodes": len(done),
        "steps": total_steps,
        "per_step_ms": loop_s / total_steps * 1e3,
        "per_episode_ms": loop_s / len(done) * 1e3,
        "scheduler_per_episode_ms": ready_s / ready * 1e3,
    }


def overhead(args: argparse.Namespace) -> Table:
    with tempfile.TemporaryDirectory(prefix="sandlot-bench-overhead-") as tmp:
        f = anyio.run(_overhead, args.overhead_episodes, args.steps, 32, Path(tmp))
    ok = f["per_step_ms"] < OVERHEAD_TARGET_MS
    verdict = "[green]met[/green]" if ok else "[red]missed[/red]"
    table = Table(
        title=f"sandlot's own work per step (fake sandbox + fake model, concurrency 32, "
        f"{f['episodes']:.0f} episodes x {args.steps} steps)"
    )
    for column in ("measurement", "value", "target"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    table.add_row(
        "scheduler + agent loop + tools + append, per step",
        f"{f['per_step_ms']:.3f} ms",
        f"< {OVERHEAD_TARGET_MS:g} ms {verdict}",
    )
    table.add_row("the same, per episode", f"{f['per_episode_ms']:.2f} ms", "")
    table.add_row(
        "scheduler + durable append alone, per episode",
        f"{f['scheduler_per_episode_ms']:.3f} ms",
        "",
    )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8,32,128", help="concurrency levels")
    parser.add_argument(
        "--episodes", type=int, default=0, help="episodes per level (default: max(8, level))"
    )
    parser.add_argument("--overhead-episodes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20, help="steps per fake episode")
    parser.add_argument("--skip-throughput", action="store_true", help="only the overhead")
    parser.add_argument(
        "--groups",
        action="store_true",
        help="run each level again with the samples of a row sharing one set-up (SetupCache)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    console = Console(width=140)
    tables = [overhead(args)]
    if not args.skip_throughput:
        tables.append(throughput(args, console))
    for table in tables:
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
