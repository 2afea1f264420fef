"""``sandlot train``: the registration YAML and verl's trainer command, composed from our options.

The agent loop reaches verl's ``AgentLoopWorker`` actors through
``actor_rollout_ref.rollout.agent.agent_loop_config_path``: a YAML list of ``name``/``_target_``
entries whose extra keys become constructor arguments (verl's per-process ``@register`` does not
reach Ray workers). :func:`write_agent_loop_config` writes ours, pointing at the user's
``agent_config.yaml`` by absolute path.

Modes:

* ``async`` (default): ``python -m verl.experimental.fully_async_policy.fully_async_main``
  (Hydra config ``fully_async_ppo_trainer``): separate rollout and trainer GPUs, staleness,
  partial rollout;
* ``v1``: ``python -m verl.trainer.main_ppo trainer.use_v1=True
  trainer.v1.trainer_mode=separate_async`` (where verl's maintainers are heading);
* ``sync``: ``python -m verl.trainer.main_ppo`` colocated (the synchronous baseline).

:func:`compose` loads the same Hydra config on CPU (``--dry-run``) and checks what our loop needs.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

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


class LaunchError(ValueError):
    """The options or the composed config cannot run; the message names the knob."""


def write_agent_loop_config(
    path: str | Path,
    agent_config: str | Path,
    *,
    name: str = DEFAULT_AGENT_NAME,
    mask_exit_reasons: Sequence[str] | None = None,
) -> Path:
    """Write verl's ``agent_loop_config_path`` YAML registering :data:`LOOP_TARGET` as ``name``.

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
    rollout_name: str = "vllm"
    mask_exit_reasons: list[str] = field(
        default_factory=lambda: [r.value for r in DEFAULT_MASKED_EXITS]
    )
    overrides: list[str] = field(default_factory=list)
    workdir: Path = Path("outputs/sandlot-train")


def hydra_overrides(opts: TrainOptions, loop_config: Path) -> list[str]:
    """Our overrides (then the user's, which win) for ``opts.mode``."""
    common = [
        f"data.train_files={opts.train_file.expanduser().resolve()}",
        f"data.val_files={(opts.val_file or opts.train_file).expanduser().resolve()}",
        f"data.max_prompt_length={opts.max_prompt_length}",
        f"data.max_response_length={opts.max_response_length}",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={opts.model}",
        f"actor_rollout_ref.rollout.name={opts.rollout_name}",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_config}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={opts.agent_name}",
        f"actor_rollout_ref.rollout.agent.num_workers={opts.num_workers}",
        f"actor_rollout_ref.rollout.n={opts.n_resp_per_prompt}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={opts.ppo_mini_batch_size}",
        "reward.reward_manager.name=naive",
    ]
    if opts.mode == "async":
        steps = opts.total_rollout_steps or 512 * opts.n_resp_per_prompt
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
        mode = [
            "trainer.use_v1=True",
            "trainer.v1.trainer_mode=separate_async",
            "actor_rollout_ref.hybrid_engine=False",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            f"trainer.v1.separate_async.parameter_sync_step={opts.trigger_parameter_sync_step}",
            f"data.train_batch_size={opts.trigger_parameter_sync_step * opts.ppo_mini_batch_size}",
            f"trainer.nnodes={opts.nnodes_train}",
            f"trainer.n_gpus_per_node={opts.ngpus_per_node}",
        ]
    else:
        mode = [
            "actor_rollout_ref.hybrid_engine=True",
            f"data.train_batch_size={opts.ppo_mini_batch_size * opts.require_batches}",
            f"trainer.nnodes={opts.nnodes_train + opts.nnodes_rollout}",
            f"trainer.n_gpus_per_node={opts.ngpus_per_node}",
        ]
    return [*common, *mode, *opts.overrides]


def command(opts: TrainOptions, overrides: Sequence[str]) -> list[str]:
    """The trainer command line (run it on the Ray head node)."""
    module, _ = ENTRY[opts.mode]
    return [sys.executable, "-m", module, *overrides]


def config_dir(mode: Mode) -> Path:
    """verl's Hydra config directory of ``mode``'s entry point."""
    import verl

    root = Path(verl.__file__).parent
    if mode == "async":
        return root / "experimental" / "fully_async_policy" / "config"
    return root / "trainer" / "config"


def compose(opts: TrainOptions, overrides: Sequence[str]) -> Any:
    """Compose the whole Hydra config as the entry point would (on CPU) and check what our loop
    needs; returns the ``DictConfig``.

    Raises:
        LaunchError: Hydra rejected an override, or the result would not run our loop.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    _, name = ENTRY[opts.mode]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir(opts.mode)), version_base=None):
            cfg = hydra_compose(config_name=name, overrides=list(overrides))
        OmegaConf.resolve(cfg)
    except Exception as exc:  # hydra's errors name the bad override
        raise LaunchError(f"verl rejected the config: {type(exc).__name__}: {exc}") from None
    check(cfg, opts)
    return cfg


def check(cfg: Any, opts: TrainOptions) -> None:
    """What verl asserts at start-up (on GPUs, after minutes) and what our loop needs."""
    rollout = cfg.actor_rollout_ref.rollout
    problems = []
    if not rollout.multi_turn.enable:
        problems.append(
            "actor_rollout_ref.rollout.multi_turn.enable must be True (else the fully-async "
            "trainer replaces agent_name with single_turn_agent)"
        )
    loop_yaml = Path(str(rollout.agent.agent_loop_config_path))
    if not loop_yaml.is_absolute() or not loop_yaml.exists():
        problems.append(f"agent_loop_config_path {loop_yaml} must be an existing absolute path")
    else:
        names = [e.get("name") for e in yaml.safe_load(loop_yaml.read_text()) or []]
        if opts.agent_name not in names:
            problems.append(f"agent {opts.agent_name!r} is not in {loop_yaml} (has {names})")
    if rollout.mode != "async":
        problems.append("actor_rollout_ref.rollout.mode must be async (agent loops)")
    if opts.mode in ("async", "v1"):
        if cfg.actor_rollout_ref.hybrid_engine:
            problems.append(f"mode {opts.mode} needs actor_rollout_ref.hybrid_engine=False")
        if not rollout.calculate_log_probs:
            problems.append("actor_rollout_ref.rollout.calculate_log_probs must be True")
    if opts.mode == "async":
        if cfg.data.train_batch_size != 0 or cfg.data.gen_batch_size != 1:
            problems.append("fully async needs data.train_batch_size=0 and data.gen_batch_size=1")
        if not cfg.actor_rollout_ref.actor.use_rollout_log_probs:
            problems.append("fully async needs actor_rollout_ref.actor.use_rollout_log_probs=True")
        if not cfg.async_training.staleness_threshold >= 0:
            problems.append("async_training.staleness_threshold must be >= 0")
    if opts.mode == "sync" and not cfg.actor_rollout_ref.hybrid_engine:
        problems.append("mode sync needs actor_rollout_ref.hybrid_engine=True")
    if int(rollout.response_length) <= 0 or int(rollout.prompt_length) <= 0:
        problems.append("prompt and response lengths must be positive")
    if not problems:
        from verl.utils.config import omega_conf_to_dataclass

        try:  # what each AgentLoopWorker does first
            omega_conf_to_dataclass(rollout)
        except Exception as exc:
            problems.append(f"actor_rollout_ref.rollout: {type(exc).__name__}: {exc}")
    if problems:
        raise LaunchError("; ".join(problems))


def render(cmd: Sequence[str]) -> str:
    """``cmd`` as one shell line (one override per line)."""
    return " \\\n    ".join(shlex.quote(part) for part in cmd)
