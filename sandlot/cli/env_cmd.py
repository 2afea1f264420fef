"""``sandlot env``: the local backend's cache of test environments (list, build, prune)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import anyio
import click
from rich.console import Console
from rich.table import Table

from sandlot.cli.backend_choice import chosen_backend
from sandlot.cli.gc_cmd import parse_duration
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sandbox_setup import instance_environment
from sandlot.errors import EnvironmentBuildError
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.local.venv import cache_dir, list_environments, prune_environments
from sandlot.sandboxes.registry import get_backend


def distinct_recipes(instances: Iterable[Instance], backend: str) -> list[EnvironmentRecipe]:
    """The different package recipes ``instances`` need on ``backend``, in first-seen order."""
    seen: dict[str, EnvironmentRecipe] = {}
    for inst in instances:
        try:
            recipe = instance_environment(inst, backend)
        except ValueError:
            continue  # no image for the backend: that instance's own run says so
        if recipe is not None and recipe.has_packages:
            seen.setdefault(recipe.packages_only().digest(), recipe.packages_only())
    return list(seen.values())


def build_recipes(console: Console, recipes: list[EnvironmentRecipe], backend: str) -> int:
    """Build each recipe for ``backend`` with a spinner; print failures. Returns the failures."""
    cls = get_backend(backend)
    failures = 0
    for n, recipe in enumerate(recipes, 1):
        label = f"environment {n}/{len(recipes)}: {recipe.describe()}"
        started = time.monotonic()
        with console.status(f"building {label} (cached after the first build)"):
            try:
                anyio.run(cls.build_environment, recipe)
            except EnvironmentBuildError as exc:
                failures += 1
                console.print(f"[red]failed[/] {label}: {exc}")
                continue
        console.print(f"[green]ready[/] {label} ({time.monotonic() - started:.1f} s)")
    return failures


@click.group("env")
def env_group() -> None:
    """The local backend's cached test environments (one virtualenv per recipe)."""


@env_group.command("list")
def list_command() -> None:
    """List the cached environments with their packages, size and last use."""
    console = Console()
    envs = list_environments()
    table = Table(title=f"environments in {cache_dir()}")
    for column in ("key", "python", "packages", "size", "last used", "state"):
        table.add_column(column)
    now = time.time()
    for env in envs:
        recipe = env.info.get("recipe") if env.complete else None
        packages = ", ".join(recipe.get("pip_packages", [])) if isinstance(recipe, dict) else ""
        table.add_row(
            env.path.name,
            str(env.info.get("python_version", "?")),
            packages,
            f"{env.size_bytes / 2**20:.0f} MiB",
            f"{(now - env.last_used) / 3600:.1f} h ago",
            "ready" if env.complete else "unfinished (pruned next time)",
        )
    console.print(table)


@env_group.command("build")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Instances (.jsonl/.json/.parquet or a directory) whose environments to build.",
)
@click.option(
    "--backend",
    default=None,
    help="Backend to build for (default: $SANDLOT_BACKEND, then $DEPLOYMENT, then local).",
)
def build_command(dataset: Path, backend: str | None) -> None:
    """Build the environments a dataset needs, before evaluating it."""
    console = Console(stderr=True)
    backend = chosen_backend(backend)
    try:
        recipes = distinct_recipes(load_instances(dataset), backend)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not recipes:
        console.print("no instance of this dataset needs an environment on " + backend)
        return
    if build_recipes(console, recipes, backend):
        raise SystemExit(1)


@env_group.command("prune")
@click.option(
    "--older-than",
    default=None,
    help="Only environments unused for this long (90s, 30m, 2h, 7d); default: all.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
def prune_command(older_than: str | None, dry_run: bool) -> None:
    """Delete cached environments (unfinished ones always); ones being built are kept."""
    seconds = parse_duration(older_than) if older_than else None
    removed = prune_environments(older_than_s=seconds, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    freed = sum(e.size_bytes for e in removed) / 2**20
    click.echo(f"{verb} {len(removed)} environment(s), {freed:.0f} MiB")
