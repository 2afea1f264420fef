"""``sandlot train --dry-run``: every recipe composes to a valid verl config on CPU, and the
registration YAML is what verl's worker reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from requirements import TRAIN, need_module

need_module("verl.experimental.agent_loop", TRAIN)

from sandlot.cli.train_cmd import train_command  # noqa: E402
from sandlot.trainer.launch import LOOP_TARGET, write_agent_loop_config  # noqa: E402

RECIPES = sorted((Path(__file__).resolve().parents[2] / "examples" / "train").glob("*.yaml"))
RECIPES = [r for r in RECIPES if r.name != "runtime_env.yaml"]


@pytest.fixture
def agent_config(tmp_path: Path) -> Path:
    path = tmp_path / "agent_config.yaml"
    path.write_text("sandbox: {backend: local}\n")
    return path


def test_registration_yaml(tmp_path: Path, agent_config: Path) -> None:
    from omegaconf import OmegaConf

    out = write_agent_loop_config(
        tmp_path / "x" / "loop.yaml", agent_config, mask_exit_reasons=["max_turns"]
    )
    entries = OmegaConf.load(out)  # as AgentLoopWorker.__init__ reads it
    assert entries[0].name == "swe_agent" and entries[0]._target_ == LOOP_TARGET
    assert entries[0].agent_config == str(agent_config.resolve())
    assert list(entries[0].mask_exit_reasons) == ["max_turns"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_composes(recipe: Path, tmp_path: Path, agent_config: Path) -> None:
    result = CliRunner().invoke(
        train_command,
        [
            "--recipe",
            str(recipe),
            "--config",
            str(agent_config),
            "--train-file",
            str(tmp_path / "train.parquet"),
            "--model",
            "/models/x",
            "--workdir",
            str(tmp_path / "w"),
            "--dry-run",
            "trainer.project_name=t",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "actor_rollout_ref.rollout.multi_turn.enable=True" in result.output
    assert f"agent_loop_config_path={tmp_path / 'w' / 'agent_loop.yaml'}" in result.output
    assert (
        yaml.safe_load((tmp_path / "w" / "agent_loop.yaml").read_text())[0]["name"] == "swe_agent"
    )


def test_bad_override_is_reported(tmp_path: Path, agent_config: Path) -> None:
    result = CliRunner().invoke(
        train_command,
        [
            "--config",
            str(agent_config),
            "--train-file",
            str(tmp_path / "t.parquet"),
            "--model",
            "/m",
            "--mode",
            "v1",
            "--workdir",
            str(tmp_path / "w"),
            "--dry-run",
            "actor_rollout_ref.rollout.multi_turn.enable=False",
        ],
    )
    assert result.exit_code != 0
    assert "multi_turn.enable must be True" in result.output
