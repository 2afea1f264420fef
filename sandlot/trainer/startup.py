"""verl's start-up, on CPU: what ``sandlot train --dry-run`` runs before it says "config valid".

A training run that dies at start-up dies after the Ray cluster has spun up and the GPUs are
reserved. This module runs, on any machine, the checks verl 0.9.1 runs before training, with
verl's own code wherever verl has a function for it:

1. **The config, as the entry point builds it**: Hydra composes the mode's config
   (``fully_async_ppo_trainer`` or ``ppo_trainer``) from the same overrides, then the entry
   point's own edits are applied: ``auto_set_device``; for ``async`` (``fully_async_main.main``)
   the copy of ``rollout.nnodes``/``n_gpus_per_node`` into ``actor_rollout_ref.rollout`` and
   ``migrate_legacy_reward_impl``.
2. **Files**: the model directory (``config.json``), the train and validation files, the
   agent-loop registration YAML and the loop's name in it.
3. **verl's checks**: ``verl.utils.config.validate_config`` (what ``main_ppo.main`` runs), then
   every section the workers convert to dataclasses: actor (``ActorConfig``), ref when used (as
   ``engine_workers.py`` renames its ``log_prob_*`` keys), critic when used (``CriticConfig``
   and its ``validate``), rollout (``RolloutConfig``), model (``HFModelConfig``, which loads the
   tokenizer and ``config.json``), checkpoint engine, and the advantage estimator's registry
   entry.
4. **Asserts verl makes inside Ray actors**, repeated here with their source: the actor and
   rollout must agree on dynamic batching (``engine_workers.py``); no sequence may exceed a
   dynamic micro batch (``seqlen_balancing.py``); the fully-async rollouter's and trainer's
   constructor asserts (``fully_async_rollouter.py``, ``fully_async_trainer.py``).
5. **The V1 trainer itself** (``v1``, ``sync``): ``transfer_queue`` must import, and the
   trainer class ``get_trainer_cls(trainer.v1.trainer_mode)`` is constructed on the config,
   which runs its asserts (``trainer_separate_async.py``: train batch = sync step × mini batch,
   a standalone rollout pool, a checkpoint engine other than ``naive``).
6. **What our loop needs**: multi-turn on (else the fully-async trainer replaces ``agent_name``
   with ``single_turn_agent``), the async rollout mode, rollout log-probs for the async modes.

Every failure is a :class:`Problem` naming the config key (or option), verl's message and the
fix; :func:`check_startup` raises one :class:`StartupError` listing all of them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandlot.trainer.launch import ENTRY, LaunchError, Mode, TrainOptions


@dataclass(frozen=True)
class Problem:
    """One reason verl would not start.

    Attributes:
        key: the config key (``actor_rollout_ref.actor``) or option (``--model``) at fault.
        message: what is wrong (verl's own message where verl raised it).
        fix: what to change.
    """

    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}\n    fix: {self.fix}"


class StartupError(LaunchError):
    """verl would not start with this config; :attr:`problems` says why, each with its fix."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"verl would not start ({len(self.problems)} problem(s)):\n{lines}")


def config_dir(mode: Mode) -> Path:
    """verl's Hydra config directory of ``mode``'s entry point."""
    import verl

    root = Path(verl.__file__).parent
    if mode == "async":
        return root / "experimental" / "fully_async_policy" / "config"
    return root / "trainer" / "config"


def entry_config(mode: Mode, overrides: Sequence[str]) -> Any:
    """The ``DictConfig`` ``mode``'s entry point hands to its task runner (step 1 above).

    Raises:
        StartupError: Hydra rejected an override (the message names it).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.utils.device import auto_set_device

    _, name = ENTRY[mode]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir(mode)), version_base=None):
            cfg = compose(config_name=name, overrides=list(overrides))
    except Exception as exc:  # hydra's errors name the bad override
        raise StartupError(
            [Problem("overrides", f"{type(exc).__name__}: {exc}", "correct or drop that override")]
        ) from None
    finally:
        GlobalHydra.instance().clear()
    auto_set_device(cfg)
    if mode == "async":
        from verl.experimental.reward_loop import migrate_legacy_reward_impl

        cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
        cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
        cfg = migrate_legacy_reward_impl(cfg)
    return cfg


def check_startup(opts: TrainOptions, overrides: Sequence[str]) -> Any:
    """Compose ``mode``'s config from ``overrides`` and run every check above.

    Returns:
        The composed ``DictConfig`` (unresolved, as verl's task runner receives it).

    Raises:
        StartupError: one or more problems, each naming its key and fix.
    """
    cfg = entry_config(opts.mode, overrides)
    problems = list(startup_problems(cfg, opts))
    if problems:
        raise StartupError(problems)
    return cfg


def startup_problems(cfg: Any, opts: TrainOptions) -> Iterator[Problem]:
    """Every problem of ``cfg`` (composed by :func:`entry_config`) for ``opts.mode``."""
    files = list(_file_problems(cfg, opts))
    yield from files
    yield from _loop_problems(cfg, opts)
    seen: set[str] = set()  # validate_config converts the actor too: say its failure once
    for problem in _verl_problems(cfg, opts, model_ok=not any(p.key == "--model" for p in files)):
        if problem.message not in seen:
            seen.add(problem.message)
            yield problem


def _run(key: str, fix: str, check: Callable[[], object]) -> Iterator[Problem]:
    """``check()``; any exception it raises becomes a :class:`Problem` at ``key``."""
    try:
        check()
    except Exception as exc:
        yield Problem(key, _message(exc), fix)


def _message(exc: BaseException) -> str:
    # hydra wraps a dataclass's assertion in InstantiationException, whose text quotes it.
    return f"{type(exc).__name__}: {str(exc).strip()}"


def _file_problems(cfg: Any, opts: TrainOptions) -> Iterator[Problem]:
    model = str(cfg.actor_rollout_ref.model.path)
    if "://" not in model and not (Path(model) / "config.json").is_file():
        yield Problem(
            "--model",
            f"{model} is not a model directory (no config.json)",
            "download the model first (e.g. `huggingface-cli download Qwen/Qwen3-8B "
            "--local-dir DIR`) and pass that directory; the dry run loads its tokenizer and "
            "config as verl does",
        )
    seen: set[str] = set()  # the validation file defaults to the training file
    for key in ("train_files", "val_files"):
        value = cfg.data.get(key)
        paths = [value] if isinstance(value, str) else list(value or [])
        option = "--train-file" if key == "train_files" else "--val-file"
        for path in map(str, paths):
            if "://" in path or path in seen:
                continue
            seen.add(path)
            if not Path(path).is_file():
                yield Problem(
                    f"data.{key}",
                    f"{path} does not exist",
                    f"pass an existing parquet file with {option} (`sandlot data` or "
                    "`python -m sandlot.datasets.<dataset>` writes one)",
                )
                continue
            yield from _parquet_problems(Path(path), f"data.{key}", str(cfg.data.prompt_key))


def _parquet_problems(path: Path, key: str, prompt_key: str) -> Iterator[Problem]:
    """verl's ``RLHFDataset`` reads ``data.prompt_key`` from every row."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as exc:
        yield Problem(key, f"{path} is not a parquet file: {exc}", "pass a verl parquet file")
        return
    if prompt_key not in names:
        yield Problem(
            key,
            f"{path} has no {prompt_key!r} column (it has {names})",
            "prepare it with `sandlot data` (verl's row format), or set data.prompt_key",
        )


def _loop_problems(cfg: Any, opts: TrainOptions) -> Iterator[Problem]:
    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.multi_turn.enable:
        yield Problem(
            "actor_rollout_ref.rollout.multi_turn.enable",
            "is False: the fully-async trainer then replaces agent_name with single_turn_agent",
            "drop the override (sandlot train sets it True)",
        )
    if rollout.mode != "async":
        yield Problem(
            "actor_rollout_ref.rollout.mode",
            f"is {rollout.mode!r}; agent loops run only on the async rollout",
            "drop the override (sandlot train sets async)",
        )
    loop_yaml = Path(str(rollout.agent.agent_loop_config_path))
    if not loop_yaml.is_absolute() or not loop_yaml.is_file():
        yield Problem(
            "actor_rollout_ref.rollout.agent.agent_loop_config_path",
            f"{loop_yaml} is not an existing absolute path",
            "drop the override (sandlot train writes the file under --workdir)",
        )
    else:
        names = [e.get("name") for e in yaml.safe_load(loop_yaml.read_text()) or []]
        if opts.agent_name not in names:
            yield Problem(
                "--agent-name",
                f"{opts.agent_name!r} is not registered in {loop_yaml} (it has {names})",
                "use the rows' agent_name, registered by sandlot train",
            )
    if opts.mode in ("async", "v1") and not rollout.calculate_log_probs:
        yield Problem(
            "actor_rollout_ref.rollout.calculate_log_probs",
            "is False; the asynchronous trainers train on the rollout's log-probs",
            "drop the override",
        )


def _verl_problems(cfg: Any, opts: TrainOptions, *, model_ok: bool) -> Iterator[Problem]:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    arr = cfg.actor_rollout_ref
    use_ref, use_critic = need_reference_policy(cfg), need_critic(cfg)
    yield from _run(
        "validate_config",
        "follow verl's message; the keys it names are Hydra overrides",
        lambda: validate_config(cfg, use_reference_policy=use_ref, use_critic=use_critic),
    )
    yield from _run(
        "actor_rollout_ref.actor",
        "keep actor_rollout_ref.actor.use_dynamic_bsz=True (sandlot train sets it) or set "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        lambda: omega_conf_to_dataclass(arr.actor),
    )
    if use_ref:
        yield from _run(
            "actor_rollout_ref.ref",
            "keep use_dynamic_bsz=True or set "
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            lambda: omega_conf_to_dataclass(_ref_as_worker_builds_it(arr)),
        )
    if use_critic:
        yield from _critic_problems(cfg)
    yield from _run(
        "actor_rollout_ref.rollout",
        "follow verl's message",
        lambda: omega_conf_to_dataclass(arr.rollout),
    )
    if model_ok:
        yield from _run(
            "actor_rollout_ref.model",
            "the directory needs config.json with one `architectures` entry, a tokenizer and a "
            "chat template",
            lambda: omega_conf_to_dataclass(arr.model),
        )
    yield from _run(
        "actor_rollout_ref.rollout.checkpoint_engine",
        "use a backend verl ships (naive, nccl, nixl, mooncake)",
        lambda: omega_conf_to_dataclass(arr.rollout.checkpoint_engine),
    )
    yield from _estimator_problems(cfg)
    yield from _batching_problems(cfg)
    if opts.mode == "async":
        yield from _fully_async_problems(cfg)
    else:
        yield from _v1_trainer_problems(cfg)


def _ref_as_worker_builds_it(arr: Any) -> Any:
    """The ref section as ``engine_workers.py`` (``init_model``) renames it for ``ActorConfig``."""
    from omegaconf import open_dict

    ref = copy.deepcopy(arr.ref)
    with open_dict(ref):
        ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def _critic_problems(cfg: Any) -> Iterator[Problem]:
    from verl.utils.config import omega_conf_to_dataclass

    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes

    def convert() -> None:
        critic = omega_conf_to_dataclass(cfg.critic)
        critic.validate(n_gpus, cfg.data.train_batch_size)

    yield from _run("critic", "follow verl's message", convert)
    path = str(cfg.critic.model.get("path") or "")
    if "://" not in path and not (Path(path).expanduser() / "config.json").is_file():
        yield Problem(
            "critic.model.path",
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} builds a critic, and "
            f"{path!r} is not a model directory (verl's placeholder unless you set it)",
            "use a critic-free estimator (--adv-estimator sandlot_grpo, the default) or set "
            "critic.model.path to a local model directory",
        )


def _estimator_problems(cfg: Any) -> Iterator[Problem]:
    from verl.trainer.ppo import core_algos

    name = str(cfg.algorithm.adv_estimator)
    if name in ("gae", "grpo"):  # handled inline by verl's compute_advantage
        return
    yield from _run(
        "algorithm.adv_estimator",
        "use a registered estimator: sandlot_grpo, sandlot_rloo, or one of verl's "
        f"({', '.join(sorted(core_algos.ADV_ESTIMATOR_REGISTRY))}); sandlot's are registered "
        "through its verl.plugins entry point (reinstall sandlot if they are missing)",
        lambda: core_algos.get_adv_estimator_fn(name),
    )


def _batching_problems(cfg: Any) -> Iterator[Problem]:
    arr = cfg.actor_rollout_ref
    if bool(arr.actor.use_dynamic_bsz) != bool(arr.rollout.log_prob_use_dynamic_bsz):
        yield Problem(  # engine_workers.py asserts it when the actor worker starts
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
            "differs from actor_rollout_ref.actor.use_dynamic_bsz",
            "drop the override: it follows the actor's by default",
        )
    longest = int(arr.rollout.prompt_length) + int(arr.rollout.response_length)
    sp = int(arr.actor.get("ulysses_sequence_parallel_size", 1) or 1)
    budgets = {
        "actor": ("use_dynamic_bsz", "ppo_max_token_len_per_gpu"),
        "rollout": ("log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"),
    }
    if cfg.algorithm.get("use_kl_in_reward") or arr.actor.use_kl_loss:
        budgets["ref"] = ("log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu")
    for section, (switch, field) in budgets.items():
        dynamic, per_gpu = arr[section].get(switch), arr[section].get(field)
        key = f"actor_rollout_ref.{section}.{field}"
        if dynamic and per_gpu is not None and int(per_gpu) * sp < longest:
            yield Problem(  # seqlen_balancing.py: max_token_len must be >= the sequence length
                key,
                f"{per_gpu} x ulysses_sequence_parallel_size {sp} < {longest}, the longest "
                "sequence (max_prompt_length + max_response_length): verl fails at the first "
                "batch holding one",
                f"set {key} to at least {-(-longest // sp)}",
            )


def _fully_async_problems(cfg: Any) -> Iterator[Problem]:
    """The constructor asserts of ``FullyAsyncRollouter`` and ``FullyAsyncTrainer`` (Ray
    actors, so repeated here; ``verl/experimental/fully_async_policy/``)."""
    if cfg.actor_rollout_ref.hybrid_engine:
        yield Problem("actor_rollout_ref.hybrid_engine", "must be False", "drop the override")
    if cfg.data.train_batch_size != 0:
        yield Problem("data.train_batch_size", "must be 0 in fully async", "drop the override")
    if cfg.data.gen_batch_size != 1:
        yield Problem("data.gen_batch_size", "must be 1 in fully async", "drop the override")
    if not cfg.async_training.staleness_threshold >= 0:
        yield Problem(
            "async_training.staleness_threshold", "must be >= 0", "--staleness-threshold >= 0"
        )
    if not cfg.async_training.trigger_parameter_sync_step >= 1:
        yield Problem(
            "async_training.trigger_parameter_sync_step",
            "must be >= 1",
            "--trigger-parameter-sync-step >= 1",
        )
    if cfg.reward.reward_model.enable and not cfg.reward.reward_model.enable_resource_pool:
        yield Problem(
            "reward.reward_model.enable_resource_pool",
            "a reward model in fully async needs its own resource pool",
            "set reward.reward_model.enable_resource_pool=True",
        )
    # With no rollout node only dynamic resource scheduling serves generations.
    dynamic = cfg.async_training.get("use_dynamic_resource_scheduling")
    if not dynamic and cfg.rollout.nnodes < 1:
        yield Problem("rollout.nnodes", "no rollout nodes", "--nnodes-rollout >= 1")


def _v1_trainer_problems(cfg: Any) -> Iterator[Problem]:
    """Construct verl's V1 trainer class on the config: its constructor's asserts are the check."""
    try:
        import transfer_queue  # noqa: F401
    except ImportError:
        yield Problem(
            "trainer.use_v1",
            "verl's V1 trainer imports transfer_queue, which is not installed",
            "pip install 'TransferQueue>=0.1.10' (in sandlot[train]), or use --mode async",
        )
        return
    from verl.trainer.ppo.v1 import get_trainer_cls

    mode = str(cfg.trainer.v1.trainer_mode)
    yield from _run(
        f"trainer.v1.trainer_mode={mode}",
        "follow verl's message; for separate_async: --nnodes-rollout >= 1, "
        "data.train_batch_size = --trigger-parameter-sync-step x --ppo-mini-batch-size, and a "
        "checkpoint engine other than naive (sandlot train sets all three)",
        lambda: get_trainer_cls(mode)(config=copy.deepcopy(cfg)),
    )
