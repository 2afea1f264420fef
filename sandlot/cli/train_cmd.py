"""``sandlot train``: compose verl's trainer command for our loop, check it, run it.

``--dry-run`` composes the config as the entry point will and runs verl's start-up checks on CPU
(:mod:`sandlot.trainer.startup`), then prints the command; ``--preflight`` adds the cluster's
checks on the head node (:mod:`sandlot.trainer.preflight`). Without either the checks run and
then the command (on the Ray head node of a GPU cluster).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import click
import yaml

from sandlot._optional import require
from sandlot.cli.backend_choice import chosen_backend
from sandlot.rollout.config import ConfigError, load_agent_config


@click.command("train", context_settings={"ignore_unknown_options": True})
@click.option(
    "--config",
    "agent_config",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="agent_config.yaml (the sandbox backend is one line in it).",
)
@click.option(
    "--train-file",
    required=True,
    type=click.Path(path_type=Path),
    help="Training parquet (sandlot rows).",
)
@click.option(
    "--val-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Validation parquet (default: the training file).",
)
@click.option(
    "--model",
    required=True,
    help="Model directory (config.json, tokenizer; checked by the dry run), or an hdfs:// path.",
)
@click.option(
    "--recipe",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A YAML of these options (examples/train/*.yaml); flags win.",
)
@click.option(
    "--mode",
    type=click.Choice(["async", "v1", "sync"]),
    default=None,
    help="async: verl's fully-async trainer (the default without a recipe); v1: verl's V1 "
    "separate_async trainer (standalone rollout pool; the recipes' default); sync: verl's V1 "
    "synchronous trainer, colocated (the baseline).",
)
@click.option(
    "--agent-name",
    default=None,
    help="Registry name of the loop (the rows' agent_name; default swe_agent).",
)
@click.option("--nnodes-train", type=int, default=None, help="NNODES_TRAIN.")
@click.option("--nnodes-rollout", type=int, default=None, help="NNODES_ROLLOUT.")
@click.option("--ngpus-per-node", type=int, default=None, help="NGPUS_PER_NODE.")
@click.option("--n-resp-per-prompt", type=int, default=None)
@click.option("--num-workers", type=int, default=None, help="AgentLoopWorker actors.")
@click.option("--max-prompt-length", type=int, default=None)
@click.option(
    "--max-response-length", type=int, default=None, help="Token budget of a whole trajectory."
)
@click.option("--staleness-threshold", type=float, default=None)
@click.option("--trigger-parameter-sync-step", type=int, default=None)
@click.option("--require-batches", type=int, default=None)
@click.option("--partial-rollout/--no-partial-rollout", default=None)
@click.option("--ppo-mini-batch-size", type=int, default=None)
@click.option(
    "--total-rollout-steps",
    type=int,
    default=None,
    help="Prompts to roll out in all (verl's unit; x n samples each; v1: turned into "
    "training steps); default: the training set x trainer.total_epochs.",
)
@click.option(
    "--max-off-policy-threshold",
    type=int,
    default=None,
    help="v1: model versions a trajectory may span before it is dropped (verl's default 8); "
    "async bounds staleness with --staleness-threshold instead.",
)
@click.option(
    "--adv-estimator",
    default=None,
    help="sandlot_grpo (default) or sandlot_rloo keep masked samples out of the group "
    "baseline; any verl estimator name also works.",
)
@click.option(
    "--mask-exit-reason",
    "mask_exit_reasons",
    multiple=True,
    help="Exit reasons whose samples get no gradient "
    "(repeatable; default infra_error, sandbox_dead).",
)
@click.option(
    "--check-drift/--no-check-drift",
    default=None,
    help="Record each sample's tokenization drift (extra_fields drift_tokens); off by default.",
)
@click.option(
    "--trajectory-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep each sample's trajectory there (one file per rollout worker) for `sandlot "
    "audit DIR`; shared storage on several nodes. Default: kept nowhere.",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the registration YAML is written.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run verl's start-up checks on the composed config (CPU); print the command.",
)
@click.option(
    "--preflight",
    is_flag=True,
    help="The dry run, plus on the head node: the Ray cluster's GPUs, the backend's "
    "credentials and one sandbox start.",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def train_command(
    recipe: Path | None,
    dry_run: bool,
    preflight: bool,
    overrides: tuple[str, ...],
    **flags: object,
) -> None:
    """Train with verl on sandlot rows. Extra arguments are Hydra overrides passed to verl."""
    require("verl", "train")
    from sandlot.trainer.launch import (
        LaunchError,
        TrainOptions,
        command,
        hydra_overrides,
        render,
        write_agent_loop_config,
    )
    from sandlot.trainer.startup import check_startup

    fields: dict[str, object] = {}
    if recipe is not None:
        loaded = yaml.safe_load(recipe.read_text()) or {}
        if not isinstance(loaded, dict):
            raise click.ClickException(f"recipe {recipe}: expected a mapping of options")
        known = {f.name for f in dataclasses.fields(TrainOptions)}
        unknown = sorted(k for k in loaded if k.replace("-", "_") not in known)
        if unknown:
            raise click.ClickException(
                f"recipe {recipe}: unknown option(s) {unknown}; known: {sorted(known)} "
                "(verl's own keys go under `overrides:`)"
            )
        fields.update({k.replace("-", "_"): v for k, v in loaded.items()})
    fields.update({k: v for k, v in flags.items() if v is not None and v != ()})
    recipe_overrides: Any = fields.get("overrides") or []
    fields["overrides"] = [*recipe_overrides, *overrides]
    for key in ("agent_config", "train_file", "val_file", "workdir", "trajectory_dir"):
        if fields.get(key) is not None:
            fields[key] = Path(str(fields[key]))
    if "mask_exit_reasons" in fields:
        fields["mask_exit_reasons"] = list(fields["mask_exit_reasons"])  # type: ignore[call-overload]
    try:
        opts = TrainOptions(**fields)  # type: ignore[arg-type]
        loop_yaml = write_agent_loop_config(
            opts.workdir / "agent_loop.yaml",
            opts.agent_config,
            name=opts.agent_name,
            mask_exit_reasons=opts.mask_exit_reasons,
            check_drift=opts.check_drift,
            trajectory_dir=opts.trajectory_dir,
        )
        cmd = command(opts, hydra_overrides(opts, loop_yaml))
        cfg = check_startup(opts, cmd[3:])
    except (LaunchError, ConfigError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    # Said, and checked, here: the rollout workers choose the same way from the same variables.
    sandbox = load_agent_config(opts.agent_config).sandbox
    chosen_backend(None, sandbox.file_backend(), f"{opts.agent_config}'s sandbox.backend")
    click.echo(render(cmd))
    click.echo(f"# verl's start-up checks passed ({opts.mode}); loop in {loop_yaml}", err=True)
    if preflight:
        _preflight(opts, cfg)
    if dry_run or preflight:
        return
    raise SystemExit(subprocess.call(cmd))


def _preflight(opts: Any, cfg: Any) -> None:
    """The cluster's checks (:mod:`sandlot.trainer.preflight`), a table, exit 1 on a problem."""
    import anyio
    from rich.console import Console
    from rich.table import Table

    from sandlot.trainer import preflight

    config = load_agent_config(opts.agent_config)
    table = Table("check", "result")
    problems: list[Any] = []

    def record(check: str, found: list[Any], ok: str = "ok") -> None:
        problems.extend(found)
        table.add_row(check, "FAILED" if found else ok)

    try:
        bundles = preflight.gpu_bundles(cfg, opts.mode)
        found = preflight.cluster_problems(preflight.ray_nodes(), bundles)
    except ConnectionError as exc:
        found = [preflight.Problem("ray cluster", str(exc), "run --preflight on the head node")]
    record("ray cluster", found)
    try:
        backend = config.sandbox.resolved_backend()
    except ConfigError as exc:  # $SANDLOT_BACKEND or $DEPLOYMENT names no backend
        raise click.ClickException(str(exc)) from None
    record(f"{backend} credentials", preflight.credential_problems(config))
    record("trainer.logger", preflight.logger_problems(cfg))
    found, seconds = anyio.run(preflight.sandbox_problems, config, opts.train_file)
    record("one sandbox", found, ok=f"ok ({seconds:.1f} s)")
    Console(stderr=True).print(table)
    if problems:
        raise click.ClickException("\n".join(f"- {p}" for p in problems))
