"""``sandlot train --dry-run`` is verl's start-up: every recipe in every mode passes verl 0.9.1's
own checks, re-run here independently from the printed command; a broken config fails with the
key and the fix."""

from __future__ import annotations

import copy
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from requirements import TRAIN, need_module

need_module("verl.experimental.agent_loop", TRAIN)
need_module("transfer_queue", TRAIN)

from sandlot.cli.train_cmd import train_command  # noqa: E402
from sandlot.trainer.launch import (  # noqa: E402
    ENTRY,
    LOOP_TARGET,
    LaunchError,
    TrainOptions,
    write_agent_loop_config,
)

RECIPES = sorted((Path(__file__).resolve().parents[2] / "examples" / "train").glob("*.yaml"))
RECIPES = [r for r in RECIPES if r.name != "runtime_env.yaml"]
MODES = ["async", "v1", "sync"]


@pytest.fixture(scope="module", autouse=True)
def load_each_tokenizer_once() -> Iterator[None]:
    """verl's ``HFModelConfig`` loads the model directory's tokenizer twice (``hf_tokenizer``,
    then ``hf_processor``, which falls back to the tokenizer for a text-only model), once in the
    dry run and once in :func:`verl_startup`: four loads of ``qwen_dir``'s 150k-token vocabulary
    (~2.5 s of CPU each) per test, all of the same unchanged directory. Each is loaded for real
    once per module and the same object handed out again (the checks only read it; verl's
    only edits, a missing pad token or a custom chat template, do not apply to ``qwen_dir``)."""
    from transformers import AutoProcessor, AutoTokenizer

    loaded: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as patch:
        for auto in (AutoTokenizer, AutoProcessor):

            def from_pretrained(
                path: Any,
                *args: Any,
                _auto: Any = auto,
                _load: Any = auto.from_pretrained,
                **kw: Any,
            ) -> Any:
                key = repr((_auto.__name__, str(path), args, sorted(kw.items())))
                if key not in loaded:
                    loaded[key] = _load(path, *args, **kw)
                return loaded[key]

            patch.setattr(auto, "from_pretrained", from_pretrained)
        yield


@pytest.fixture
def agent_config(tmp_path: Path) -> Path:
    path = tmp_path / "agent_config.yaml"
    path.write_text("sandbox: {backend: local}\n")
    return path


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "hi"}]]}), path)
    return path


def dry_run(args: list[str]) -> Any:
    return CliRunner().invoke(train_command, [*args, "--dry-run"])


def printed_command(output: str) -> list[str]:
    """The command ``sandlot train`` printed (one override per continued line)."""
    lines = [line for line in output.splitlines() if not line.startswith("#")]
    text = "\n".join(lines)
    start = text.index("-m ")
    return shlex.split(text[start:].replace("\\\n", " "))


def verl_startup(cmd: list[str]) -> Any:
    """What verl 0.9.1 runs before training, composed from the printed command alone: Hydra
    with the entry module's config, the entry's own edits, ``validate_config``, the workers'
    dataclass conversions and, for the V1 trainer, the trainer class's constructor."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    assert cmd[0] == "-m"
    module, overrides = cmd[1], cmd[2:]
    import verl

    root = Path(verl.__file__).parent
    if module.endswith("fully_async_main"):
        config_dir, name = (
            root / "experimental/fully_async_policy/config",
            "fully_async_ppo_trainer",
        )
    else:
        assert module == "verl.trainer.main_ppo"
        config_dir, name = root / "trainer/config", "ppo_trainer"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name=name, overrides=overrides)
    GlobalHydra.instance().clear()
    auto_set_device(cfg)
    if module.endswith("fully_async_main"):
        from verl.experimental.reward_loop import migrate_legacy_reward_impl

        cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
        cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
        cfg = migrate_legacy_reward_impl(cfg)
    validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    assert not need_critic(cfg), "no recipe should build a critic"
    arr = cfg.actor_rollout_ref
    omega_conf_to_dataclass(arr.actor)
    omega_conf_to_dataclass(arr.rollout)
    omega_conf_to_dataclass(arr.model)
    omega_conf_to_dataclass(arr.rollout.checkpoint_engine)
    assert arr.actor.use_dynamic_bsz == arr.rollout.log_prob_use_dynamic_bsz
    if need_reference_policy(cfg):
        ref = copy.deepcopy(arr.ref)
        with open_dict(ref):
            ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        omega_conf_to_dataclass(ref)
    if module.endswith("fully_async_main"):
        assert not arr.hybrid_engine and cfg.data.train_batch_size == 0
        assert cfg.data.gen_batch_size == 1 and arr.rollout.calculate_log_probs
    elif cfg.trainer.use_v1:
        from verl.trainer.ppo.v1 import get_trainer_cls

        get_trainer_cls(cfg.trainer.v1.trainer_mode)(config=copy.deepcopy(cfg))
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    return cfg


def test_registration_yaml(tmp_path: Path, agent_config: Path) -> None:
    from omegaconf import OmegaConf

    out = write_agent_loop_config(
        tmp_path / "x" / "loop.yaml", agent_config, mask_exit_reasons=["max_turns"]
    )
    entries = OmegaConf.load(out)  # as AgentLoopWorker.__init__ reads it
    assert entries[0].name == "swe_agent" and entries[0]._target_ == LOOP_TARGET
    assert entries[0].agent_config == str(agent_config.resolve())
    assert list(entries[0].mask_exit_reasons) == ["max_turns"]
    assert "check_drift" not in entries[0]
    out = write_agent_loop_config(tmp_path / "d.yaml", agent_config, check_drift=True)
    assert OmegaConf.load(out)[0].check_drift is True
    assert "trajectory_dir" not in OmegaConf.load(out)[0]
    out = write_agent_loop_config(tmp_path / "t.yaml", agent_config, trajectory_dir="kept")
    assert OmegaConf.load(out)[0].trajectory_dir == str(Path("kept").resolve())


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_every_recipe_and_mode_passes_verls_startup(
    recipe: Path, mode: str, tmp_path: Path, agent_config: Path, train_file: Path, qwen_dir: Path
) -> None:
    result = dry_run(
        [
            "--recipe",
            str(recipe),
            "--mode",
            mode,
            "--config",
            str(agent_config),
            "--train-file",
            str(train_file),
            "--model",
            str(qwen_dir),
            "--workdir",
            str(tmp_path / "w"),
        ]
    )
    assert result.exit_code == 0, result.output
    cmd = printed_command(result.output)
    assert cmd[1] == ENTRY[mode][0]  # type: ignore[index]
    cfg = verl_startup(cmd)
    recipe_opts = yaml.safe_load(recipe.read_text())
    budget = recipe_opts["max_prompt_length"] + recipe_opts["max_response_length"]
    arr = cfg.actor_rollout_ref
    assert arr.actor.use_dynamic_bsz and arr.actor.ppo_max_token_len_per_gpu >= budget
    assert cfg.algorithm.adv_estimator == "sandlot_grpo"
    assert arr.rollout.multi_turn.enable and arr.rollout.agent.agent_loop_config_path == str(
        tmp_path / "w" / "agent_loop.yaml"
    )
    if mode == "v1":
        assert arr.rollout.nnodes == recipe_opts["nnodes_rollout"]
        assert arr.rollout.checkpoint_engine.backend != "naive"
        sampler = cfg.trainer.v1.sampler
        if "max_off_policy_threshold" in recipe_opts:
            assert sampler.max_off_policy_threshold == recipe_opts["max_off_policy_threshold"]
        if "total_rollout_steps" in recipe_opts:
            sync_step = recipe_opts["trigger_parameter_sync_step"]
            prompts = sync_step * recipe_opts["ppo_mini_batch_size"]
            steps = cfg.trainer.total_training_steps
            assert (steps - 1) * prompts < recipe_opts["total_rollout_steps"] <= steps * prompts
    if mode == "async" and "total_rollout_steps" in recipe_opts:
        assert cfg.rollout.total_rollout_steps == recipe_opts["total_rollout_steps"]


def test_v1_refuses_to_turn_partial_rollout_off(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--mode async for --no-partial-rollout"):
        TrainOptions(tmp_path, tmp_path, "m", mode="v1", partial_rollout=False)


def test_the_recipes_default_to_verls_v1_trainer_but_the_baseline() -> None:
    modes = {r.stem: yaml.safe_load(r.read_text())["mode"] for r in RECIPES}
    assert modes == {"debug": "v1", "dense_8b": "v1", "moe_30b_a3b": "v1", "sync_baseline": "sync"}


def problems_of(result: Any) -> str:
    assert result.exit_code != 0, result.output
    return str(result.output)


def base_args(tmp_path: Path, agent_config: Path, train_file: Path, model: Path) -> list[str]:
    return [
        "--config",
        str(agent_config),
        "--train-file",
        str(train_file),
        "--model",
        str(model),
        "--workdir",
        str(tmp_path / "w"),
        "--nnodes-rollout",
        "1",
        "--ngpus-per-node",
        "8",
    ]


def test_missing_model_and_train_file_are_named(tmp_path: Path, agent_config: Path) -> None:
    out = problems_of(
        dry_run(base_args(tmp_path, agent_config, tmp_path / "none.parquet", tmp_path / "nomodel"))
    )
    assert "--model" in out and "no config.json" in out and "huggingface-cli download" in out
    assert "data.train_files" in out and "none.parquet does not exist" in out


@pytest.mark.slow
def test_micro_batches_without_dynamic_bsz_fail_with_the_key(
    tmp_path: Path, agent_config: Path, train_file: Path, qwen_dir: Path
) -> None:
    args = base_args(tmp_path, agent_config, train_file, qwen_dir)
    out = problems_of(dry_run([*args, "actor_rollout_ref.actor.use_dynamic_bsz=False"]))
    assert "actor_rollout_ref.actor" in out and "ppo_micro_batch_size_per_gpu" in out
    assert "fix:" in out
    assert out.count("Please set at least one of 'actor.ppo_micro_batch_size'") == 1


@pytest.mark.slow
def test_v1_asserts_come_from_verls_trainer(
    tmp_path: Path, agent_config: Path, train_file: Path, qwen_dir: Path
) -> None:
    args = [*base_args(tmp_path, agent_config, train_file, qwen_dir), "--mode", "v1"]
    out = problems_of(dry_run([*args, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"]))
    assert "trainer.v1.trainer_mode=separate_async" in out
    assert "please use nccl/nixl/mooncake" in out  # verl's own assertion text
    out = problems_of(dry_run([*args, "data.train_batch_size=7"]))
    assert "train_batch_size must equal parameter_sync_step * ppo_mini_batch_size" in out


@pytest.mark.slow
def test_gae_without_a_critic_model_is_refused(
    tmp_path: Path, agent_config: Path, train_file: Path, qwen_dir: Path
) -> None:
    args = base_args(tmp_path, agent_config, train_file, qwen_dir)
    out = problems_of(dry_run([*args, "--adv-estimator", "gae"]))
    assert "critic.model.path" in out and "sandlot_grpo" in out


@pytest.mark.slow
def test_sequence_longer_than_a_dynamic_micro_batch_is_refused(
    tmp_path: Path, agent_config: Path, train_file: Path, qwen_dir: Path
) -> None:
    args = base_args(tmp_path, agent_config, train_file, qwen_dir)
    out = problems_of(dry_run([*args, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024"]))
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" in out
    assert "set actor_rollout_ref.actor.ppo_max_token_len_per_gpu to at least" in out


@pytest.mark.slow
def test_v1_without_transfer_queue_says_what_to_install(
    tmp_path: Path,
    agent_config: Path,
    train_file: Path,
    qwen_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # import raises ImportError
    args = [*base_args(tmp_path, agent_config, train_file, qwen_dir), "--mode", "sync"]
    out = problems_of(dry_run(args))
    assert "transfer_queue" in out and "TransferQueue" in out


def test_bad_override_is_reported(tmp_path: Path, agent_config: Path, train_file: Path) -> None:
    args = base_args(tmp_path, agent_config, train_file, tmp_path)
    out = problems_of(dry_run([*args, "actor_rollout_ref.no_such_key=1"]))
    assert "overrides" in out and "no_such_key" in out


def test_recipe_with_an_unknown_key_or_mode_is_named(
    tmp_path: Path, agent_config: Path, train_file: Path
) -> None:
    args = base_args(tmp_path, agent_config, train_file, tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("mode: async\nnnodes: 2\n")
    out = problems_of(dry_run([*args, "--recipe", str(recipe)]))
    assert "unknown option(s) ['nnodes']" in out and "nnodes_train" in out
    recipe.write_text("mode: fast\n")
    out = problems_of(dry_run([*args, "--recipe", str(recipe)]))
    assert "mode 'fast': expected one of async, v1, sync" in out
