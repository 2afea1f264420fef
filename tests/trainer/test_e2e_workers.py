"""End to end on CPU through verl's own workers: ``AgentLoopManager`` starts an
``AgentLoopWorker`` Ray actor, which finds ``SandlotAgentLoop`` through the
``agent_loop_config_path`` YAML that ``sandlot train`` writes, builds it per sample, and runs a
swe-mini episode in a ``local`` sandbox against a fake ``generate`` server replaying a scripted
policy encoded with a real Qwen tokenizer and chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_server import ByInstance, ScriptedServer
from requirements import EVAL, TRAIN, bwrap_missing, need_module, needs

need_module("verl.experimental.agent_loop", TRAIN)
need_module("swebench", EVAL)
ray = need_module("ray", TRAIN)

from sandlot.datasets.loaders import load_instances  # noqa: E402
from sandlot.datasets.rows import build_row  # noqa: E402
from sandlot.rollout.trajectory import EpisodeSetups  # noqa: E402
from sandlot.sandboxes.labels import pin_run_id  # noqa: E402
from sandlot.sandboxes.setups.counts import SetupCounts  # noqa: E402
from sandlot.trainer import setup_counts  # noqa: E402
from sandlot.trainer.launch import (  # noqa: E402
    TrainOptions,
    hydra_overrides,
    write_agent_loop_config,
)
from sandlot.trainer.startup import entry_config  # noqa: E402

# verl on CPU, with a real model and tokenizer: minutes per test on a loaded machine.
pytestmark = [pytest.mark.slow, needs(bwrap_missing), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SWE_MINI = ROOT / "examples" / "swe-mini"
INSTANCE = "minicalc__minicalc-1"
RESPONSE_LENGTH = 2048


def rows(repos: Path) -> list[dict[str, Any]]:
    tasks = [("minicalc", "solver"), ("minicalc", "failer"), ("no-such-repo", "solver")]
    return records_of(repos, [(INSTANCE, repo, policy) for repo, policy in tasks])


def records_of(repos: Path, tasks: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The rows of ``(instance_id, repository directory, policy)`` tasks."""
    instances = {i.instance_id: i for i in load_instances(SWE_MINI / "instances.jsonl")}
    records = []
    for index, (instance_id, repo, policy) in enumerate(tasks):
        inst = instances[instance_id].model_copy(update={"repo_source": str(repos / repo)})
        prompt = [
            {"role": "system", "content": "You fix bugs with the tools."},
            {
                "role": "user",
                "content": f"<task id={instance_id}> policy={policy}\n{inst.problem_statement}",
            },
        ]
        row = build_row(
            inst,
            index=index,
            prompt=prompt,
            data_source="swe-mini",
            reward_name="swe",
            backend="local",
        )
        records.append(json.loads(row.model_dump_json()))
    return records


def _column(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def batch(records: list[dict[str, Any]]) -> Any:
    from verl import DataProto

    column = _column

    return DataProto(
        non_tensor_batch={
            "raw_prompt": column([np.array(r["prompt"], dtype=object) for r in records]),
            "agent_name": column([r["agent_name"] for r in records]),
            "index": column([r["extra_info"]["index"] for r in records]),
            "data_source": column([r["data_source"] for r in records]),
            "reward_model": column([r["reward_model"] for r in records]),
            "extra_info": column([r["extra_info"] for r in records]),
            "tools_kwargs": column([r["extra_info"]["tools_kwargs"] for r in records]),
        }
    )


@dataclass
class Setup:
    """What both runs share: the registration YAML, the rows, the scripted server, the Ray
    workers' environment and the directory sandboxes live in (empty once all are closed)."""

    tmp_path: Path
    loop_yaml: Path
    records: list[dict[str, Any]]
    instances: dict[str, Any]
    server: ScriptedServer
    env: dict[str, str]
    local_root: Path

    def config(
        self, qwen_dir: Path, mode: str, *, n: int = 1, loop_yaml: Path | None = None
    ) -> Any:
        from omegaconf import OmegaConf

        opts = TrainOptions(
            agent_config=self.tmp_path / "agent_config.yaml",
            train_file=self.tmp_path / "train.parquet",
            model=str(qwen_dir),
            mode=mode,  # type: ignore[arg-type]
            num_workers=1,
            n_resp_per_prompt=n,
            max_prompt_length=4096,
            max_response_length=RESPONSE_LENGTH,
        )
        cfg = entry_config(opts.mode, hydra_overrides(opts, loop_yaml or self.loop_yaml))
        OmegaConf.resolve(cfg)
        return cfg


@pytest.fixture
def setup(qwen_dir: Path, tmp_path: Path) -> Setup:
    repos = tmp_path / "repos"
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(repos)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    local_root = tmp_path / "sandboxes"
    local_root.mkdir()
    agent_config = tmp_path / "agent_config.yaml"
    agent_config.write_text(
        "sandbox: {backend: local}\ninteraction: {max_turns: 6}\nreward: {mode: same}\n"
    )
    loop_yaml = write_agent_loop_config(
        tmp_path / "agent_loop.yaml", agent_config, check_drift=True
    )
    records = rows(repos)
    instances = {INSTANCE: records[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"]}
    instances = {k: json.loads(v) if isinstance(v, str) else v for k, v in instances.items()}
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)]),
        "SANDLOT_LOCAL_ROOT": str(local_root),
        "SANDLOT_RUN_ID": pin_run_id(),  # the workers' tally is the one this process reads
    }
    for name in ("SANDLOT_TEST_CACHE", "PATH", "HOME"):
        if name in os.environ:
            env[name] = os.environ[name]
    server = ScriptedServer(str(qwen_dir), ByInstance(instances))
    return Setup(tmp_path, loop_yaml, records, instances, server, env, local_root)


def test_agent_loop_manager_runs_sandlot_episodes(
    setup: Setup, qwen_dir: Path, tokenizer: Any
) -> None:
    from verl.experimental.agent_loop import AgentLoopManager

    cfg = setup.config(qwen_dir, "async")
    server, records, instances = setup.server, setup.records, setup.instances
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": setup.env})
    try:
        manager = AgentLoopManager.create(
            config=cfg, llm_client=server, reward_loop_worker_handles=None
        )
        out = manager.generate_sequences(batch(records))
    finally:
        ray.shutdown()

    scores = out.batch["rm_scores"].sum(dim=1).tolist()
    extra = out.non_tensor_batch
    assert list(extra["exit_reason"]) == ["submitted", "submitted", "infra_error"], extra["error"]
    assert scores == [1.0, 0.0, 0.0]
    assert list(extra["masked"]) == [False, False, True]
    # check_drift from the YAML entry: the scripted replies are canonical, nothing drifted.
    assert list(extra["drift_tokens"]) == [0, 0, None]
    mask = out.batch["response_mask"]
    responses = out.batch["responses"]
    logprobs = out.batch["rollout_log_probs"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i in range(2):
        # Sampled positions: exactly the scripted replies, each ending at <|im_end|>.
        sampled = responses[i][mask[i].bool()].tolist()
        replies = ByInstance(instances)(
            f"<task id={INSTANCE}> policy={'solver' if i == 0 else 'failer'}"
        )
        expected = [t for r in replies for t in server.encode_reply(r)]
        assert sampled == expected
        assert sampled.count(im_end) == 2
        assert (logprobs[i][mask[i].bool()] == -0.5).all()
        assert (logprobs[i][~mask[i].bool()] == 0.0).all()  # none where nothing was sampled
    assert mask[2].sum() == 0 and logprobs[2].abs().sum() == 0
    assert "sandbox" in extra["error"][2] or "repo" in extra["error"][2]
    assert list(extra["min_global_steps"])[:2] == [3, 3]
    assert list(extra["max_global_steps"])[:2] == [4, 4]
    assert not list(setup.local_root.iterdir()), "sandboxes left open"


def test_the_samples_of_a_prompt_share_one_set_up(setup: Setup, qwen_dir: Path) -> None:
    """GRPO groups: n=4 samples of 2 prompts, repeated as verl's trainers repeat a batch
    (``DataProto.repeat(n, interleave=True)``), run on one worker: per prompt one agent
    set-up and one grading set-up, the other sandboxes are forks, every sample graded, and
    every snapshot is gone when the run ends."""
    from verl.experimental.agent_loop import AgentLoopManager

    fresh = setup.tmp_path / "fresh.yaml"
    fresh.write_text("sandbox: {backend: local}\ninteraction: {max_turns: 6}\n")  # fresh
    loop_yaml = write_agent_loop_config(setup.tmp_path / "fresh_loop.yaml", fresh)
    cfg = setup.config(qwen_dir, "async", n=4, loop_yaml=loop_yaml)
    repos = setup.tmp_path / "repos"
    tasks = [(INSTANCE, "minicalc", "solver"), ("textkit__textkit-1", "textkit", "solver")]
    records = records_of(repos, tasks)
    server = ScriptedServer(str(qwen_dir), ByInstance(_metadata(records)))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": setup.env})
    try:
        manager = AgentLoopManager.create(
            config=cfg, llm_client=server, reward_loop_worker_handles=None
        )
        out = manager.generate_sequences(batch(records).repeat(4, interleave=True))
        step = setup_counts.take()  # what the trainer logs at the step's advantage call
    finally:
        ray.shutdown()
        setup_counts._actor = None

    extra = out.non_tensor_batch
    assert list(extra["exit_reason"]) == ["submitted"] * 8, extra["error"]
    assert step == EpisodeSetups(
        agent=SetupCounts(set_up=2, forked=6), grading=SetupCounts(set_up=2, forked=8)
    )
    assert out.batch["rm_scores"].sum(dim=1).tolist() == [1.0] * 8
    for purpose in ("agent", "grading"):
        set_ups: Counter[str] = Counter()
        forks: Counter[str] = Counter()
        for instance, setups in zip(extra["instance_id"], extra["setups"], strict=True):
            set_ups[instance] += setups[purpose]["set_up"]
            forks[instance] += setups[purpose]["forked"]
        assert set_ups == {INSTANCE: 1, "textkit__textkit-1": 1}, purpose
        assert forks == {INSTANCE: 3 + (purpose == "grading")} | {
            "textkit__textkit-1": 3 + (purpose == "grading")
        }, purpose
    assert not list(setup.local_root.iterdir()), "sandboxes or snapshots left"


def _metadata(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The instances of ``records`` by id, for :class:`ByInstance`."""
    found = {}
    for record in records:
        meta = record["extra_info"]["tools_kwargs"]["reward"]["metadata"]
        meta = json.loads(meta) if isinstance(meta, str) else meta
        found[meta["instance_id"]] = meta
    return found


def test_v1_transfer_queue_workers_run_sandlot_episodes(setup: Setup, qwen_dir: Path) -> None:
    """``--mode sync``/``v1`` run verl's V1 trainer, whose ``AgentLoopWorkerTQ`` builds the loop
    the same way and stores each sample in TransferQueue (as ``TaskRunnerV1`` sets it up)."""
    need_module("transfer_queue", TRAIN)
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu

    cfg = setup.config(qwen_dir, "sync")
    cfg.transfer_queue.enable = True
    cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units = 1  # one storage actor
    records = setup.records
    uids = [f"prompt-{i}" for i in range(len(records))]
    # Ray's logical CPUs: TransferQueue's controller and storage actors each take one.
    ray.init(num_cpus=8, include_dashboard=False, runtime_env={"env_vars": setup.env})
    tq.init(cfg.transfer_queue)
    try:
        manager = AgentLoopManagerTQ.create(
            config=cfg,
            llm_client=setup.server,
            teacher_client=None,
            reward_loop_worker_handles=None,
        )
        prompts = tu.get_tensordict({**batch(records).non_tensor_batch, "uid": _column(uids)})
        tu.assign_non_tensor_data(prompts, "global_steps", 1)
        pending = {"is_prompt": True, "status": "pending", "global_steps": 1}
        tq.kv_batch_put(keys=uids, partition_id="train", tags=[dict(pending) for _ in uids])
        manager.generate_sequences(prompts)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            tags = tq.kv_list(partition_id="train").get("train", {})
            status = [tags.get(uid, {}).get("status") for uid in uids]
            if all(s in ("finished", "failure") for s in status):
                break
            time.sleep(1)
        assert status == ["finished"] * 3, status
        out = tq.kv_batch_get(
            keys=[f"{uid}_0_0" for uid in uids],
            partition_id="train",
            select_fields=["rm_scores", "response_mask", "extra_fields"],
        )
    finally:
        tq.close()
        ray.shutdown()
    extra = list(out["extra_fields"])
    assert [e["exit_reason"] for e in extra] == ["submitted", "submitted", "infra_error"]
    assert [e["masked"] for e in extra] == [False, False, True]
    scores = [float(row.sum()) for row in out["rm_scores"].unbind()]
    masks = [int(row.sum()) for row in out["response_mask"].unbind()]
    assert scores == [1.0, 0.0, 0.0]
    assert masks[0] > 0 and masks[1] > 0 and masks[2] == 0
    assert [e["drift_tokens"] for e in extra] == [0, 0, None]
    assert not list(setup.local_root.iterdir()), "sandboxes left open"
