"""``sandlot train``: the registration YAML and verl's trainer command, composed from our options.

The agent loop reaches verl's ``AgentLoopWorker`` actors through
``actor_rollout_ref.rollout.agent.agent_loop_config_path``: a YAML list of ``name``/``_target_``
entries whose extra keys become constructor arguments (verl's per-process ``@register`` does not
reach Ray workers). :func:`write_agent_loop_config` writes ours, pointing at the user's
``agent_config.yaml`` by absolute path.

Modes:

* ``async`` (the option's default): ``python -m
  verl.experimental.fully_async_policy.fully_async_main`` (Hydra config
  ``fully_async_ppo_trainer``): separate rollout and trainer GPUs, staleness, partial rollout;
* ``v1`` (the recipes' default): ``python -m verl.trainer.main_ppo trainer.use_v1=True
  trainer.v1.trainer_mode=separate_async`` (where verl's maintainers are heading): a standalone
  rollout pool of ``nnodes_rollout`` nodes, weights sent over a checkpoint engine (nccl),
  partial rollout always, staleness bounded in model versions (``max_off_policy_threshold``),
  ``total_rollout_steps`` turned into training steps;
* ``sync``: ``python -m verl.trainer.main_ppo trainer.use_v1=True trainer.v1.trainer_mode=sync``
  colocated on every node (the synchronous baseline; verl's legacy ``use_v1=False`` trainer is
  deprecated).

:mod:`sandlot.trainer.startup` runs verl's start-up checks on the composed config (``--dry-run``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sandlot.errors import SandlotError
from sandlot.rollout.config import load_agent_config
from sandlot.trainer.mapping import DEFAULT_MASKED_EXITS

LOOP_TARGET = "sandlot.trainer.agent_loop.SandlotAgentLoop"
DEFAULT_AGENT_NAME = "swe_agent"
Mode = Literal["async", "v1", "sync"]

ENTRY = {
    "async": ("verl.experimental.fully_async_policy.fully_async_main", "fully_async_ppo_trainer"),
    "v1": ("verl.trainer.main_ppo", "ppo_trainer"),
    "sync": ("verl.trainer.main_ppo", "ppo_trainer"),
}
"""Each mode's entry module and its Hydra config name."""


class LaunchError(SandlotError, ValueError):
    """The options or the composed config cannot run; the message names the knob."""


def write_agent_loop_config(
    path: str | Path,
    agent_config: str | Path,
    *,
    name: str = DEFAULT_AGENT_NAME,
    mask_exit_reasons: Sequence[str] | None = None,
    check_drift: bool = False,
    trajectory_dir: str | Path | None = None,
) -> Path:
    """Write verl's ``agent_loop_config_path`` YAML registering :data:`LOOP_TARGET` as ``name``
    (with ``check_drift``, each sample records its tokenization drift; off by default; with
    ``trajectory_dir``, each sample's trajectory is kept there for ``sandlot audit``).

    Raises:
        FileNotFoundError / sandlot.rollout.ConfigError: ``agent_config`` is missing or invalid
            (checked here, not in the first Ray worker).
    """
    config_path = Path(agent_config).expanduser().resolve()
    load_agent_config(config_path)
    entry: dict[str, Any] = {
        "name": name,
        "_target_": LOOP_TARGET,
        "agent_config": str(config_path),
    }
    reasons = [str(getattr(r, "value", r)) for r in (mask_exit_reasons or DEFAULT_MASKED_EXITS)]
    entry["mask_exit_reasons"] = reasons
    if check_drift:
        entry["check_drift"] = True
    if trajectory_dir is not None:
        entry["trajectory_dir"] = str(Path(trajectory_dir).expanduser().resolve())
    out = Path(path).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump([entry], sort_keys=False))
    return out


@dataclass
class TrainOptions:
    """What ``sandlot train`` exposes; everything else goes through ``overrides`` (Hydra)."""

    agent_config: Path
    train_file: Path
    model: str
    val_file: Path | None = None
    mode: Mode = "async"
    agent_name: str = DEFAULT_AGENT_NAME
    nnodes_train: int = 1
    nnodes_rollout: int = 1
    ngpus_per_node: int = 8
    n_resp_per_prompt: int = 8
    num_workers: int = 8
    max_prompt_length: int = 4096
    max_response_length: int = 32768
    staleness_threshold: float = 0.5
    trigger_parameter_sync_step: int = 4
    require_batches: int = 4
    partial_rollout: bool = True
    ppo_mini_batch_size: int = 32
    total_rollout_steps: int | None = None
    """Prompts to roll out in all (verl's unit: each gives ``n_resp_per_prompt`` samples);
    ``None`` = the training set times ``trainer.total_epochs``. ``async``: the rollouter's
    ``rollout.total_rollout_steps``; ``v1``: ``trainer.total_training_steps``, this over the
    prompts of a step (``trigger_parameter_sync_step`` x ``ppo_mini_batch_size``), rounded up."""
    max_off_policy_threshold: int | None = None
    """``v1``: how many model versions a trajectory may span before it is dropped
    (``trainer.v1.sampler.max_off_policy_threshold``; ``None``: verl's default, 8); what
    bounds staleness there, where ``async`` has ``staleness_threshold``."""
    rollout_name: str = "vllm"
    adv_estimator: str = "sandlot_grpo"
    """``sandlot_grpo`` / ``sandlot_rloo`` keep masked samples out of the group baseline
    (:mod:`sandlot.trainer.advantage`); any verl estimator name works too (``gae`` needs a
    critic: ``critic.model.path``)."""
    checkpoint_engine: str = "nccl"
    """How ``v1`` sends weights to the standalone rollout pool (verl: nccl, nixl, mooncake)."""
    mask_exit_reasons: list[str] = field(
        default_factory=lambda: [r.value for r in DEFAULT_MASKED_EXITS]
    )
    check_drift: bool = False
    trajectory_dir: Path | None = None
    """Where the workers keep each sample's trajectory (``sandlot audit DIR``); ``None``:
    nowhere. Shared storage when the rollout runs on several nodes."""
    overrides: list[str] = field(default_factory=list)
    workdir: Path = Path("outputs/sandlot-train")

    def __post_init__(self) -> None:
        if self.mode not in ENTRY:
            raise LaunchError(f"mode {self.mode!r}: expected one of {', '.join(ENTRY)}")
        if self.mode == "v1" and not self.partial_rollout:
            raise LaunchError(
                "mode v1: verl's separate_async trainer always resumes generations cut by a "
                "weight sync (partial rollout); use --mode async for --no-partial-rollout"
            )


def token_budget(opts: TrainOptions) -> int:
    """The longest sequence a sample can be (prompt + whole trajectory), in tokens."""
    return opts.max_prompt_length + opts.max_response_length


def hydra_overrides(opts: TrainOptions, loop_config: Path) -> list[str]:
    """Our overrides (then the user's, which win) for ``opts.mode``.

    Batching follows verl's fully-async multi-turn script (``dapo_7b_async_retool.sh``): dynamic
    batch sizes, the actor's ``ppo_max_token_len_per_gpu`` one whole sequence (prompt +
    trajectory) and the reference's log-prob budget four, so no micro batch size is needed and
    no sequence is too long for a micro batch.
    """
    budget = token_budget(opts)
    common = [
        f"data.train_files={opts.train_file.expanduser().resolve()}",
        f"data.val_files={(opts.val_file or opts.train_file).expanduser().resolve()}",
        f"data.max_prompt_length={opts.max_prompt_length}",
        f"data.max_response_length={opts.max_response_length}",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={model_path(opts.model)}",
        f"actor_rollout_ref.rollout.name={opts.rollout_name}",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_config}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={opts.agent_name}",
        f"actor_rollout_ref.rollout.agent.num_workers={opts.num_workers}",
        f"actor_rollout_ref.rollout.n={opts.n_resp_per_prompt}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={opts.ppo_mini_batch_size}",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={4 * budget}",
        f"algorithm.adv_estimator={opts.adv_estimator}",
        "reward.reward_manager.name=naive",
    ]
    if opts.mode == "async":
        steps = "null" if opts.total_rollout_steps is None else opts.total_rollout_steps
        mode = [
            "actor_rollout_ref.hybrid_engine=False",
            "data.train_batch_size=0",
            "data.gen_batch_size=1",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.actor.use_rollout_log_probs=True",
            f"trainer.nnodes={opts.nnodes_train}",
            f"trainer.n_gpus_per_node={opts.ngpus_per_node}",
            f"rollout.nnodes={opts.nnodes_rollout}",
            f"rollout.n_gpus_per_node={opts.ngpus_per_node}",
            f"rollout.n={opts.n_resp_per_prompt}",
            f"rollout.total_rollout_steps={steps}",
            f"async_training.staleness_threshold={opts.staleness_threshold}",
            f"async_training.trigger_parameter_sync_step={opts.trigger_parameter_sync_step}",
            f"async_training.require_batches={opts.require_batches}",
            f"async_training.partial_rollout={opts.partial_rollout}",
        ]
    elif opts.mode == "v1":
        # trainer_separate_async.py asserts a standalone rollout pool and a checkpoint engine
        # other than naive (the trainer's GPUs do not hold the rollout's weights).
        step_prompts = opts.trigger_parameter_sync_step * opts.ppo_mini_batch_size
        mode = [
            "trainer.use_v1=True",
            "trainer.v1.trainer_mode=separate_async",
            "actor_rollout_ref.hybrid_engine=False",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            f"actor_rollout_ref.rollout.nnodes={opts.nnodes_rollout}",
            f"actor_rollout_ref.rollout.n_gpus_per_node={opts.ngpus_per_node}",
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={opts.checkpoint_engine}",
            f"trainer.v1.separate_async.parameter_sync_step={opts.trigger_parameter_sync_step}",
            f"data.train_batch_size={step_prompts}",
            f"trainer.nnodes={opts.nnodes_train}",
            f"trainer.n_gpus_per_node={opts.ngpus_per_node}",
        ]
        if opts.total_rollout_steps is not None:
            steps = -(-opts.total_rollout_steps // step_prompts)
            mode.append(f"trainer.total_training_steps={steps}")
        if opts.max_off_policy_threshold is not None:
            threshold = opts.max_off_policy_threshold
            mode.append(f"trainer.v1.sampler.max_off_policy_threshold={threshold}")
    else:
        # verl's V1 synchronous trainer (trainer_sync.py), colocated on every node.
        mode = [
            "trainer.use_v1=True",
            "trainer.v1.trainer_mode=sync",
            "actor_rollout_ref.hybrid_engine=True",
            f"data.train_batch_size={opts.ppo_mini_batch_size * opts.require_batches}",
            f"trainer.nnodes={opts.nnodes_train + opts.nnodes_rollout}",
            f"trainer.n_gpus_per_node={opts.ngpus_per_node}",
        ]
    return [*common, *mode, *opts.overrides]


def model_path(model: str) -> str:
    """``model`` as verl should read it: a local directory made absolute (the Ray workers run
    elsewhere), anything else (``hdfs://...``) unchanged."""
    if "://" in model:
        return model
    return str(Path(model).expanduser().resolve())


def command(opts: TrainOptions, overrides: Sequence[str]) -> list[str]:
    """The trainer command line (run it on the Ray head node)."""
    module, _ = ENTRY[opts.mode]
    return [sys.executable, "-m", module, *overrides]


def render(cmd: Sequence[str]) -> str:
    """``cmd`` as one shell line (one override per line)."""
    return " \\\n    ".join(shlex.quote(part) for part in cmd)
