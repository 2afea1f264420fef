"""``sandlot train --preflight``: the GPU layout against a cluster's nodes, the backend's
credentials by name, and one real sandbox of the training set."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from requirements import EVAL, TRAIN, bwrap_missing, need_module, needs

need_module("verl.experimental.agent_loop", TRAIN)
need_module("swebench", EVAL)

from sandlot.cli.train_cmd import train_command  # noqa: E402
from sandlot.rollout.config import parse_agent_config  # noqa: E402
from sandlot.trainer import preflight  # noqa: E402
from sandlot.trainer.launch import TrainOptions, hydra_overrides  # noqa: E402
from sandlot.trainer.startup import entry_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INSTANCES = ROOT / "examples" / "swe-mini" / "instances.jsonl"


def node(gpus: int, alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"CPU": 64.0, "GPU": float(gpus)}}


def test_bundles_must_fit_on_alive_nodes() -> None:
    four = [node(8)] * 4
    assert preflight.cluster_problems(four, [8, 8, 8, 8]) == []
    # The debug recipe's two 1-GPU pools share one 2-GPU node.
    assert preflight.cluster_problems([node(2)], [1, 1]) == []
    (problem,) = preflight.cluster_problems(
        [node(8), node(8), node(8), node(8, alive=False)], [8] * 4
    )
    assert problem.key == "ray cluster" and "[8]" in problem.message and "ray start" in problem.fix
    assert preflight.cluster_problems([node(4), node(4)], [8])[0].message.count("[4, 4]") == 1


@pytest.mark.parametrize(
    ("mode", "bundles"), [("async", [8] * 4), ("v1", [8] * 4), ("sync", [8] * 4)]
)
def test_bundles_come_from_the_composed_config(
    tmp_path: Path, mode: str, bundles: list[int]
) -> None:
    opts = TrainOptions(
        agent_config=tmp_path / "a.yaml",
        train_file=tmp_path / "t.parquet",
        model=str(tmp_path),
        mode=mode,  # type: ignore[arg-type]
        nnodes_train=2,
        nnodes_rollout=2,
        ngpus_per_node=8,
    )
    cfg = entry_config(opts.mode, hydra_overrides(opts, tmp_path / "loop.yaml"))
    assert preflight.gpu_bundles(cfg, mode) == bundles


def test_credentials_are_named_never_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = parse_agent_config({"sandbox": {"backend": "modal"}})
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "none.toml"))
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    (problem,) = preflight.credential_problems(config)
    assert "MODAL_TOKEN_ID" in problem.message and "runtime_env.yaml" in problem.fix
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-value-never-printed")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "sk-value-never-printed")
    assert preflight.credential_problems(config) == []
    config = parse_agent_config({"sandbox": {"backend": "vefaas"}})
    for name in (
        "VOLCE_ACCESS_KEY",
        "VOLCENGINE_ACCESS_KEY",
        "VOLCE_SECRET_KEY",
        "VOLCENGINE_SECRET_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VOLCENGINE_ACCESS_KEY", "ak-value-never-printed")
    (problem,) = preflight.credential_problems(config)
    assert "VOLCENGINE_SECRET_KEY" in problem.message and "never-printed" not in str(problem)


@pytest.mark.slow
@needs(bwrap_missing)
def test_one_sandbox_of_the_training_set_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    config = parse_agent_config({"sandbox": {"backend": "local"}})
    problems, seconds = anyio.run(preflight.sandbox_problems, config, INSTANCES)
    assert problems == [] and seconds > 0
    broken = parse_agent_config(
        {"sandbox": {"backend": "local", "spec": {"post_setup_cmd": "exit 3"}}}
    )
    problems, _ = anyio.run(preflight.sandbox_problems, broken, INSTANCES)
    assert problems and problems[0].key == "backend local sandbox"


def _no_ray_cluster_on_this_machine(wait_s: float = 120) -> None:
    """Wait until no Ray GCS runs on this machine (the check looks for one with "auto", which
    joins any): the Ray tests before this one (xdist group ``ray``) shut theirs down, and
    ``ray.shutdown()`` returns before its processes have exited."""
    from ray._private.services import find_gcs_addresses

    deadline = time.monotonic() + wait_s
    while gcs := find_gcs_addresses():
        if time.monotonic() > deadline:
            pytest.fail(f"a Ray cluster still runs on this machine after {wait_s} s: {gcs}")
        time.sleep(0.5)


@pytest.mark.slow
@needs(bwrap_missing)
def test_preflight_without_a_ray_cluster_fails_with_a_table(
    tmp_path: Path, qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _no_ray_cluster_on_this_machine()
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    agent_config = tmp_path / "agent_config.yaml"
    agent_config.write_text("sandbox: {backend: local}\n")
    train = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "hi"}]]}), train)
    result = CliRunner().invoke(
        train_command,
        [
            "--config",
            str(agent_config),
            "--train-file",
            str(train),
            "--model",
            str(qwen_dir),
            "--workdir",
            str(tmp_path / "w"),
            "--preflight",
        ],
    )
    assert result.exit_code != 0
    assert "ray cluster" in result.output and "ray start --head" in result.output


def test_wandb_logger_needs_a_key_on_the_head_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from omegaconf import OmegaConf

    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    cfg = OmegaConf.create({"trainer": {"logger": ["console", "wandb"]}})
    (problem,) = preflight.logger_problems(cfg)
    assert "WANDB_API_KEY" in problem.message and "trainer.logger" in problem.fix
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password x\n")
    assert preflight.logger_problems(cfg) == []
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert preflight.logger_problems(cfg) == []
    assert preflight.logger_problems(OmegaConf.create({"trainer": {"logger": "console"}})) == []
