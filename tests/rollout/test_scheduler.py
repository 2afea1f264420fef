"""The rollout scheduler: durable appends, resume, infra retries, concurrency, cancellation,
statistics, and the same on a local Ray cluster.

Most tests drive :func:`run_rollout` with an in-process fake ``Episodes`` (no sandbox, no model)
so they are exact and fast; the cancellation and start-retry tests run the real agent loop
(``run_episode``) on a fake sandbox backend with a fake policy.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from requirements import EVAL, TRAIN, need_module

from sandlot.datasets.instance import Instance
from sandlot.datasets.rows import TaskRow, build_row
from sandlot.errors import SandboxStartError
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rollout.config import AgentConfig, parse_agent_config
from sandlot.rollout.episodes import Gauges, InProcessEpisodes
from sandlot.rollout.errors import TrajectoryFileError
from sandlot.rollout.policy import Message, PolicyTurn
from sandlot.rollout.record import EpisodeRecord
from sandlot.rollout.rows import load_rows
from sandlot.rollout.scheduler import run_rollout, run_until_signalled
from sandlot.rollout.stats import RolloutStats
from sandlot.rollout.store import TrajectoryLog, iter_trajectories, write_predictions
from sandlot.rollout.summary import pass_at_k, summarize
from sandlot.rollout.trajectory import ExitReason, Trajectory
from sandlot.sandboxes.base import live_sandboxes
from sandlot.sandboxes.registry import get_backend, register_backend
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.testing.simulated import SimulatedSandbox

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe-mini"
FAKE = "rollout-fake"


# --------------------------------------------------------------------------- fakes


def instance(i: int, statement: str = "fix it") -> Instance:
    return Instance(
        instance_id=f"fake__fake-{i}",
        repo="fake/fake",
        base_commit="0" * 40,
        test_patch="diff --git a/t b/t\n",
        FAIL_TO_PASS=["t::x"],
        problem_statement=statement,
        image="fake-image",
    )


def row(i: int, statement: str = "fix it") -> TaskRow:
    inst = instance(i, statement)
    return build_row(
        inst,
        index=i,
        prompt=[{"role": "user", "content": inst.problem_statement}],
        data_source="fake",
        reward_name="swe_bench",
        backend="local",
    )


def traj(iid: str, sample: int = 0, **fields: Any) -> Trajectory:
    fields.setdefault("exit_reason", ExitReason.SUBMITTED)
    return Trajectory(instance_id=iid, sample=sample, **fields)


def resolved(iid: str, sample: int = 0, ok: bool = True) -> Trajectory:
    status = EvalStatus.RESOLVED if ok else EvalStatus.UNRESOLVED
    result = EvalResult(instance_id=iid, status=status, resolved=ok, reward=float(ok))
    return traj(iid, sample, eval=result, reward=float(ok), num_turns=3)


class ScriptedEpisodes:
    """Episodes without sandboxes: ``script(row, sample, attempt)`` gives the trajectory."""

    def __init__(self, script: Any = None, delay: float = 0.0) -> None:
        self.script = script
        self.delay = delay
        self.calls: list[tuple[str, int]] = []
        self.running = 0
        self.peak = 0

    async def run(self, row: TaskRow, sample: int) -> Trajectory:
        iid = row.instance.instance_id
        self.calls.append((iid, sample))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await anyio.sleep(self.delay)
        finally:
            self.running -= 1
        attempt = self.calls.count((iid, sample))
        if self.script is not None:
            out: Trajectory = self.script(iid, sample, attempt)
            return out
        return resolved(iid, sample)

    async def gauges(self) -> Gauges:
        return Gauges()


async def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 (polls plain counters)
            await anyio.sleep(0.01)


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def keys_of(path: Path) -> list[tuple[str, int]]:
    return [(d["instance_id"], d["sample"]) for d in lines_of(path)]


class FakeSandbox(SimulatedSandbox):
    """A sandbox that exists only as an entry in :attr:`open_ids`; every command succeeds."""

    name: ClassVar[str] = FAKE
    open_ids: ClassVar[set[str]] = set()
    start_failures: ClassVar[int] = 0

    async def _start(self) -> None:
        if FakeSandbox.start_failures > 0:
            FakeSandbox.start_failures -= 1
            raise SandboxStartError("capacity: try again later", retryable=True)
        FakeSandbox.open_ids.add(self.id)

    async def _close(self) -> None:
        FakeSandbox.open_ids.discard(self.id)

    async def is_alive(self) -> bool:
        return self.id in FakeSandbox.open_ids


register_backend(FAKE, FakeSandbox)


class FakePolicy:
    """Answers without a tool call (the episode ends ``no_tool_call``); prompts that contain
    ``SLOW`` make it wait until cancelled."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        self.calls += 1
        if any("SLOW" in str(m.get("content")) for m in messages):
            await anyio.sleep_forever()
        return PolicyTurn(content="nothing to do", prompt_tokens=10, completion_tokens=2)

    def secrets(self) -> list[str]:
        return []


def fake_config(**sandbox_spec: Any) -> AgentConfig:
    spec = {"start_limits": {"max_attempts": 1}, **sandbox_spec}
    return parse_agent_config({"sandbox": {"backend": FAKE, "spec": spec}})


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    FakeSandbox.open_ids.clear()
    FakeSandbox.start_failures = 0
    yield
    FakeSandbox.start_failures = 0


# --------------------------------------------------------------------------- statistics


def test_pass_at_k_matches_its_definition() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_first_sample_avg_and_pass_at_n() -> None:
    # a: 1 of 4 resolved, sample 0 not; b: 4 of 4; c: 0 of 4, one infra error.
    records = []
    for s in range(4):
        records.append(EpisodeRecord.of(resolved("a", s, ok=s == 2)))
        records.append(EpisodeRecord.of(resolved("b", s)))
        if s == 3:
            records.append(EpisodeRecord.of(traj("c", s, exit_reason=ExitReason.INFRA_ERROR)))
        else:
            records.append(EpisodeRecord.of(resolved("c", s, ok=False)))
    summary = summarize(records)
    assert (summary.episodes, summary.instances, summary.samples) == (12, 3, 4)
    assert summary.pass_at_1 == pytest.approx(1 / 3)  # only b's first sample
    assert summary.resolved_first == 1
    assert summary.avg_at_n == pytest.approx(5 / 12)
    assert summary.pass_at_k["pass@1"] == pytest.approx(5 / 12)
    assert summary.pass_at_k["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert summary.pass_at_k["pass@4"] == pytest.approx(2 / 3)
    assert summary.resolved_instances == 2
    assert summary.exit_reasons == {"submitted": 11, "infra_error": 1}
    assert summary.infra_errors == 1
    assert summary.mean_turns == pytest.approx(33 / 12)


# --------------------------------------------------------------------------- the log


async def test_resume_skips_done_pairs_and_completes_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    rows = [row(i) for i in range(4)]
    with TrajectoryLog(path) as log:
        await log.append(resolved("fake__fake-1", 0))
        await log.append(resolved("fake__fake-2", 1))
    episodes = ScriptedEpisodes()
    with TrajectoryLog(path) as log:
        stats = await run_rollout(rows, episodes, log, samples=2, concurrency=3)
    done_before = {("fake__fake-1", 0), ("fake__fake-2", 1)}
    everything = {(f"fake__fake-{i}", s) for i in range(4) for s in range(2)}
    assert set(episodes.calls) == everything - done_before
    assert len(episodes.calls) == 6  # nothing ran twice
    keys = keys_of(path)
    assert sorted(keys) == sorted(everything) and len(keys) == 8
    assert (stats.total, stats.resumed, stats.new, stats.done) == (8, 2, 6, 8)
    # Sample-major: every row's sample 0 before any sample 1.
    firsts = [i for i, (_, s) in enumerate(episodes.calls) if s == 0]
    assert max(firsts) < min(i for i, (_, s) in enumerate(episodes.calls) if s == 1)


@pytest.mark.parametrize("tail", [b'{"instance_id": "fake__fake-2", "sam', b"{not json}\n"])
async def test_torn_last_line_is_cut_and_its_episode_rerun(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "trajectories.jsonl"
    good = [resolved("fake__fake-0").model_dump_json(), resolved("fake__fake-1").model_dump_json()]
    path.write_bytes(("\n".join(good) + "\n").encode() + tail)
    episodes = ScriptedEpisodes()
    with TrajectoryLog(path) as log:
        assert log.repaired is not None and "line 3" in log.repaired
        assert set(log.records) == {("fake__fake-0", 0), ("fake__fake-1", 0)}
        await run_rollout([row(i) for i in range(3)], episodes, log)
    assert episodes.calls == [("fake__fake-2", 0)]
    assert sorted(keys_of(path)) == [(f"fake__fake-{i}", 0) for i in range(3)]


async def test_a_damaged_line_before_the_last_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    good = resolved("fake__fake-0").model_dump_json()
    path.write_text(f"{good}\n{{oops\n{good}\n")
    with pytest.raises(TrajectoryFileError, match="line 2"):
        TrajectoryLog(path)
    with pytest.raises(TrajectoryFileError, match="line 2"):
        list(iter_trajectories(path))


def test_one_writer_per_file(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryLog(path), pytest.raises(TrajectoryFileError, match="another rollout"):
        TrajectoryLog(path)
    with TrajectoryLog(path):  # released on close
        pass


async def test_concurrent_appends_are_all_durable_and_whole(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    big = "x" * 200_000
    with TrajectoryLog(path) as log:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(log.append, traj(f"i{i}", model_patch=big if i % 7 == 0 else ""))
    assert sorted(keys_of(path)) == sorted((f"i{i}", 0) for i in range(50))


async def test_retry_errors_reruns_retryable_infra_errors_and_the_latest_wins(
    tmp_path: Path,
) -> None:
    path = tmp_path / "trajectories.jsonl"
    rows = [row(0), row(1), row(2)]
    with TrajectoryLog(path) as log:
        await log.append(traj("fake__fake-0", exit_reason=ExitReason.INFRA_ERROR, retryable=True))
        await log.append(traj("fake__fake-1", exit_reason=ExitReason.INFRA_ERROR))
        await log.append(resolved("fake__fake-2"))
    plain = ScriptedEpisodes()
    with TrajectoryLog(path) as log:
        await run_rollout(rows, plain, log)
    assert plain.calls == []  # a plain resume skips every recorded pair
    again = ScriptedEpisodes()
    with TrajectoryLog(path) as log:
        await run_rollout(rows, again, log, redo_retryable=True)
        assert log.records[("fake__fake-0", 0)].resolved
    assert again.calls == [("fake__fake-0", 0)]  # not the non-retryable one
    latest = {t.instance_id: t.exit_reason.value for t in iter_trajectories(path)}
    assert latest == {
        "fake__fake-0": "submitted",
        "fake__fake-1": "infra_error",
        "fake__fake-2": "submitted",
    }
    assert len(list(iter_trajectories(path, latest=False))) == 4


# --------------------------------------------------------------------------- scheduling


async def test_infra_errors_are_retried_then_recorded(tmp_path: Path) -> None:
    def script(iid: str, sample: int, attempt: int) -> Trajectory:
        if iid == "fake__fake-0":  # always fails, retryably
            return traj(iid, exit_reason=ExitReason.INFRA_ERROR, retryable=True, error="503")
        if iid == "fake__fake-1" and attempt == 1:  # fails once
            return traj(iid, exit_reason=ExitReason.INFRA_ERROR, retryable=True, error="503")
        if iid == "fake__fake-2":  # fails for good at once
            return traj(iid, exit_reason=ExitReason.INFRA_ERROR, retryable=False, error="bad")
        return resolved(iid, sample)

    episodes = ScriptedEpisodes(script)
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryLog(path) as log:
        stats = await run_rollout(
            [row(i) for i in range(4)],
            episodes,
            log,
            concurrency=4,
            max_retries=2,
            retry_backoff_s=0.01,
        )
    by_id = {d["instance_id"]: d for d in lines_of(path)}
    assert len(by_id) == 4 and len(lines_of(path)) == 4
    assert by_id["fake__fake-0"]["exit_reason"] == "infra_error"
    assert by_id["fake__fake-0"]["attempts"] == 3
    assert by_id["fake__fake-1"]["exit_reason"] == "submitted"
    assert by_id["fake__fake-1"]["attempts"] == 2
    assert by_id["fake__fake-2"]["attempts"] == 1
    assert by_id["fake__fake-3"]["attempts"] == 1
    assert episodes.calls.count(("fake__fake-0", 0)) == 3
    assert (stats.retries, stats.errors, stats.resolved) == (3, 2, 2)


async def test_an_episode_that_raises_is_recorded_not_fatal(tmp_path: Path) -> None:
    def script(iid: str, sample: int, attempt: int) -> Trajectory:
        if iid == "fake__fake-1":
            raise RuntimeError("boom")
        return resolved(iid, sample)

    path = tmp_path / "trajectories.jsonl"
    with TrajectoryLog(path) as log:
        await run_rollout([row(i) for i in range(3)], ScriptedEpisodes(script), log)
    by_id = {d["instance_id"]: d for d in lines_of(path)}
    assert by_id["fake__fake-1"]["exit_reason"] == "infra_error"
    assert "boom" in by_id["fake__fake-1"]["error"]
    assert by_id["fake__fake-0"]["reward"] == 1.0


async def test_concurrency_is_respected_and_queue_time_recorded(tmp_path: Path) -> None:
    episodes = ScriptedEpisodes(delay=0.1)
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryLog(path) as log:
        await run_rollout([row(i) for i in range(12)], episodes, log, concurrency=3)
    assert episodes.peak == 3
    queue = sorted(d["timings_s"]["queue"] for d in lines_of(path))
    assert max(queue[:3]) < 0.09  # the first three started at once
    assert queue[-1] >= 0.3  # the last waited for three rounds of three


async def test_every_finished_trajectory_is_on_disk_when_reported(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    seen: list[int] = []

    def on_finished(t: Trajectory) -> None:
        seen.append(len(path.read_bytes().splitlines()))

    with TrajectoryLog(path) as log:
        await run_rollout(
            [row(i) for i in range(5)],
            ScriptedEpisodes(),
            log,
            concurrency=1,
            on_finished=on_finished,
        )
    assert seen == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------- real episodes


async def test_cancellation_closes_every_sandbox_and_keeps_finished(tmp_path: Path) -> None:
    rows = [row(i) for i in range(3)] + [row(i, "SLOW") for i in range(3, 7)]
    policy = FakePolicy()
    path = tmp_path / "trajectories.jsonl"
    stats = RolloutStats()
    with TrajectoryLog(path) as log, InProcessEpisodes(policy, fake_config(), backend=FAKE) as eps:
        with anyio.move_on_after(10) as scope:

            async def run() -> None:
                await run_rollout(rows, eps, log, concurrency=8, stats=stats)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await wait_until(lambda: stats.done >= 3 and len(FakeSandbox.open_ids) >= 4)
                assert eps.alive == 4
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught
        assert eps.alive == 0
    assert FakeSandbox.open_ids == set()
    kept = lines_of(path)
    assert sorted(d["instance_id"] for d in kept) == [f"fake__fake-{i}" for i in range(3)]
    assert {d["exit_reason"] for d in kept} == {"no_tool_call"}


async def test_sandbox_start_failures_are_retried_by_the_scheduler(tmp_path: Path) -> None:
    FakeSandbox.start_failures = 1
    path = tmp_path / "trajectories.jsonl"
    with (
        TrajectoryLog(path) as log,
        InProcessEpisodes(FakePolicy(), fake_config(), backend=FAKE) as eps,
    ):
        await run_rollout([row(0)], eps, log, retry_backoff_s=0.01)
        assert FakeSandbox.start_failures == 0 and eps.alive == 0
    (only,) = lines_of(path)
    assert only["exit_reason"] == "no_tool_call" and only["attempts"] == 2
    assert set(only["timings_s"]) >= {"queue", "start", "setup", "agent", "model", "total"}


async def test_live_sandboxes_counts_started_and_not_closed_per_backend() -> None:
    before, before_all = live_sandboxes(FAKE), live_sandboxes()
    sb = get_backend(FAKE)(SandboxSpec(image="fake-image"))
    assert live_sandboxes(FAKE) == before  # opened, not started
    async with sb:
        assert live_sandboxes(FAKE) == before + 1 and live_sandboxes() == before_all + 1
        assert live_sandboxes("no-such-backend") == 0
    assert live_sandboxes(FAKE) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_cancels_the_work(signum: int) -> None:
    cleaned = anyio.Event()

    async def main() -> str:
        try:
            await anyio.sleep(30)
        finally:
            cleaned.set()
        return "finished"

    async def send_sigint() -> None:
        await anyio.sleep(0.2)
        os.kill(os.getpid(), signum)

    seen: list[tuple[int, int]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(send_sigint)
        started = time.monotonic()
        result, received = await run_until_signalled(
            main, on_signal=lambda s, n: seen.append((s, n))
        )
    assert (result, received) == (None, signum)
    assert cleaned.is_set() and seen == [(signum, 1)]
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------- inputs and outputs


def test_rows_from_instances_and_from_verl_parquet(tmp_path: Path) -> None:
    rows = load_rows(EXAMPLES / "instances.jsonl", backend="local")
    assert len(rows) == 8
    first = rows[0]
    assert first.instance.instance_id == "minicalc__minicalc-1"
    assert first.instance.repo_source and Path(first.instance.repo_source).is_absolute()
    assert first.prompt[-1].role == "user"
    picked = load_rows(
        EXAMPLES / "instances.jsonl",
        backend="docker",
        image="img:1",
        instance_ids=["ledger__ledger-2", "textkit__textkit-1"],
    )
    assert [r.instance.instance_id for r in picked] == ["textkit__textkit-1", "ledger__ledger-2"]
    assert {r.instance.image for r in picked} == {"img:1"}
    with pytest.raises(ValueError, match="nope"):
        load_rows(EXAMPLES / "instances.jsonl", backend="local", instance_ids=["nope"])

    need_module("pyarrow", EVAL)
    from sandlot.datasets.parquet import write_rows

    custom = [r.model_copy(deep=True) for r in rows[:2]]
    custom[0].prompt[-1].content = "a custom prompt"
    parquet = write_rows(custom, tmp_path / "rows.parquet")
    again = load_rows(parquet, backend="local")
    assert [r.instance.instance_id for r in again] == [r.instance.instance_id for r in custom]
    assert again[0].prompt[-1].content == "a custom prompt"


async def test_predictions_hold_each_instances_first_sample(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryLog(path) as log:
        await log.append(traj("b", 1, model_patch="b1"))
        await log.append(traj("a", 0, model_patch="a0", model_name_or_path="m"))
        await log.append(traj("b", 2, model_patch="b2"))
        await log.append(traj("a", 1, model_patch="a1"))
        count = write_predictions(
            log.records, path, tmp_path / "p.jsonl", order=["b", "a"], model_name_or_path="m2"
        )
    preds = lines_of(tmp_path / "p.jsonl")
    assert count == 2
    assert preds == [
        {"instance_id": "b", "model_name_or_path": "m2", "model_patch": "b1"},
        {"instance_id": "a", "model_name_or_path": "m", "model_patch": "a0"},
    ]


# --------------------------------------------------------------------------- Ray


def ray_policy() -> FakePolicy:
    """Policy factory for the Ray actors: also registers the fake backend in their process."""
    register_backend(FAKE, FakeSandbox)
    return FakePolicy()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = need_module("ray", TRAIN)
    # Ray workers cannot import this test module: ship it by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if ray.is_initialized():  # another test's cluster: use it, leave it running
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
async def test_ray_runs_streams_and_cancels_with_the_same_guarantees(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from sandlot.rollout.ray_episodes import RayEpisodes

    config = fake_config()
    path = tmp_path / "trajectories.jsonl"
    rows: Sequence[TaskRow] = [row(i) for i in range(6)]
    seen: list[str] = []
    with TrajectoryLog(path) as log:
        eps = RayEpisodes(ray_policy, config, backend=FAKE, concurrency=4, group_size=2)
        async with eps:
            assert 1 <= len(eps.actors) <= 4  # one per CPU, at most the concurrency
            stats = await run_rollout(
                rows, eps, log, samples=2, concurrency=4, on_finished=lambda t: seen.append("x")
            )
        assert eps.left_open == 0
    named = ray_cluster.util.list_named_actors(all_namespaces=True)
    assert not [a for a in named if a["name"].startswith("sandlot-setups-")], "not detached"
    assert stats.new == 12 and len(seen) == 12
    assert sorted(keys_of(path)) == sorted((f"fake__fake-{i}", s) for i in range(6) for s in (0, 1))
    assert {d["exit_reason"] for d in lines_of(path)} == {"no_tool_call"}

    # Cancelled mid-run: the finished ones are kept, the actors close every sandbox.
    slow = [row(i) for i in range(6, 8)] + [row(i, "SLOW") for i in range(8, 11)]
    stats = RolloutStats()
    with TrajectoryLog(path) as log:
        eps = RayEpisodes(ray_policy, config, backend=FAKE, concurrency=8)
        async with eps, anyio.create_task_group() as tg:

            async def run() -> None:
                await run_rollout(slow, eps, log, concurrency=8, stats=stats)

            tg.start_soon(run)
            await wait_until(lambda: stats.new >= 2 and stats.alive >= 3, timeout=60)
            tg.cancel_scope.cancel()
        assert eps.left_open == 0
    ids = {d["instance_id"] for d in lines_of(path)}
    assert {"fake__fake-6", "fake__fake-7"} <= ids
    assert not ids & {"fake__fake-8", "fake__fake-9", "fake__fake-10"}
