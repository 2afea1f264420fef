"""``sandlot train``: compose verl's fully-async (or synchronous) trainer command for our loop.

``--dry-run`` composes and validates the whole Hydra config on CPU and prints the command;
without it the command is run (on the Ray head node of a GPU cluster).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import click
import yaml

from sandlot._optional import require
from sandlot.rollout.config import ConfigError


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
@click.option("--model", required=True, help="Hugging Face model directory or name.")
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
    help="async: verl's fully-async trainer (default); v1: trainer.use_v1 separate_async; "
    "sync: colocated baseline.",
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
@click.option("--total-rollout-steps", type=int, default=None)
@click.option(
    "--mask-exit-reason",
    "mask_exit_reasons",
    multiple=True,
    help="Exit reasons whose samples get no gradient "
    "(repeatable; default infra_error, sandbox_dead).",
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
    help="Compose and validate the Hydra config on CPU; print the command.",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def train_command(
    recipe: Path | None, dry_run: bool, overrides: tuple[str, ...], **flags: object
) -> None:
    """Train with verl on sandlot rows. Extra arguments are Hydra overrides passed to verl."""
    require("verl", "train")
    from sandlot.trainer.launch import (
        LaunchError,
        TrainOptions,
        command,
        compose,
        hydra_overrides,
        render,
        write_agent_loop_config,
    )

    fields: dict[str, object] = {}
    if recipe is not None:
        loaded = yaml.safe_load(recipe.read_text()) or {}
        fields.update({k.replace("-", "_"): v for k, v in loaded.items()})
    fields.update({k: v for k, v in flags.items() if v is not None and v != ()})
    recipe_overrides: Any = fields.get("overrides") or []
    fields["overrides"] = [*recipe_overrides, *overrides]
    for key in ("agent_config", "train_file", "val_file", "workdir"):
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
        )
        cmd = command(opts, hydra_overrides(opts, loop_yaml))
        if dry_run:
            compose(opts, cmd[3:])
    except (LaunchError, ConfigError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(cmd))
    if dry_run:
        click.echo(f"# config valid ({opts.mode}); loop registered in {loop_yaml}", err=True)
        return
    raise SystemExit(subprocess.call(cmd))
