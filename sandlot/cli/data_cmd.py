"""``sandlot data``: prepare verl parquet files from SWE datasets, validate them, show a row."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from sandlot.datasets.images import (
    DEPLOYMENT_ENV,
    DEPLOYMENTS,
    UnknownDeploymentError,
    resolve_deployment,
)
from sandlot.datasets.local import REPO_MIRROR_ENV
from sandlot.datasets.prepare import PrepareOptions, Preprocessor, prepare
from sandlot.datasets.prompts import PromptTemplate, load_prompt_template
from sandlot.datasets.rows import DEFAULT_AGENT_NAME, TaskRow
from sandlot.datasets.validate import ValidationReport, validate_file
from sandlot.sandboxes.images import load_image_overrides

PREPROCESSORS = {
    "swe_bench_verified": "sandlot.datasets.swe_bench_verified",
    "swe_rebench": "sandlot.datasets.swe_rebench",
    "r2e_gym_subset": "sandlot.datasets.r2e_gym_subset",
}
"""Name → module holding its ``PREPROCESSOR`` (also runnable as ``python -m <module>``)."""

_MAX_ERRORS_SHOWN = 50


def _deployment(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    try:
        return resolve_deployment(value)
    except UnknownDeploymentError as exc:
        raise click.BadParameter(str(exc)) from None


def _prepare_command(pre: Preprocessor) -> click.Command:
    @click.command(
        pre.name,
        context_settings={"help_option_names": ["-h", "--help"]},
        help=f"Convert {pre.hf_id} (or --input) into <local-save-dir>/"
        f"{pre.output_stem}_<deployment>.parquet ({{split}} is --split). The source schema, "
        f"image names and row schema are in docs/datasets.md.",
    )
    @click.option(
        "--local-save-dir",
        default="~/data/swe_agent",
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Directory of the output file.",
    )
    @click.option(
        "--input",
        "input_",
        default=None,
        help=f"A local .jsonl/.json/.parquet file of source rows, or a Hugging Face dataset id "
        f"[default: {pre.hf_id}].",
    )
    @click.option("--split", default=pre.default_split, show_default=True, help="Hub split.")
    @click.option(
        "--max-instances",
        type=click.IntRange(min=0),
        default=None,
        help="Keep the first N rows (after the --seed shuffle).",
    )
    @click.option("--seed", type=int, default=None, help="Shuffle the rows with this seed.")
    @click.option(
        "--deployment",
        envvar=DEPLOYMENT_ENV,
        default=None,
        callback=_deployment,
        help=f"Image naming: {' | '.join(DEPLOYMENTS)} [env {DEPLOYMENT_ENV}; default docker].",
    )
    @click.option(
        "--repo-mirror",
        envvar=REPO_MIRROR_ENV,
        default=None,
        help=f"Directory of git mirrors <owner>__<name> for local rows [env {REPO_MIRROR_ENV}].",
    )
    @click.option(
        "--prompt-template",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="YAML/JSON file with `system` and `user` templates.",
    )
    @click.option(
        "--image-overrides",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="YAML/JSON object mapping instance ids to image names.",
    )
    @click.option("--agent-name", default=DEFAULT_AGENT_NAME, show_default=True)
    def command(
        local_save_dir: Path,
        input_: str | None,
        split: str,
        max_instances: int | None,
        seed: int | None,
        deployment: Any,
        repo_mirror: str | None,
        prompt_template: Path | None,
        image_overrides: Path | None,
        agent_name: str,
    ) -> None:
        console = Console(stderr=True)
        try:
            options = PrepareOptions(
                local_save_dir=local_save_dir,
                deployment=deployment,
                input=input_,
                split=split,
                max_instances=max_instances,
                seed=seed,
                template=load_prompt_template(prompt_template)
                if prompt_template
                else PromptTemplate(),
                image_overrides=load_image_overrides(image_overrides) if image_overrides else {},
                repo_mirror=repo_mirror,
                agent_name=agent_name,
            )
            console.print(
                f"[bold]sandlot data prepare[/] {pre.name}: {input_ or pre.hf_id} → "
                f"deployment [cyan]{deployment}[/]"
            )
            result = prepare(pre, options)
        except (OSError, ValueError, ImportError) as exc:
            raise click.ClickException(str(exc)) from exc
        _print_summary(console, result.report)
        click.echo(f"wrote {result.rows} rows to {result.path}")

    return command


def _preprocessor(name: str) -> Preprocessor:
    pre: Preprocessor = importlib.import_module(PREPROCESSORS[name]).PREPROCESSOR
    return pre


def run_preprocessor(pre: Preprocessor) -> None:
    """Entry point of ``python -m sandlot.datasets.<name>``."""
    _prepare_command(pre).main(prog_name=f"python -m sandlot.datasets.{pre.name}")


class _PrepareGroup(click.Group):
    """Subcommands built on demand from :data:`PREPROCESSORS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(PREPROCESSORS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _prepare_command(_preprocessor(cmd_name)) if cmd_name in PREPROCESSORS else None


@click.group("data")
def data_group() -> None:
    """Prepare, validate and inspect verl parquet datasets of SWE tasks."""


@data_group.group("prepare", cls=_PrepareGroup)
def prepare_group() -> None:
    """Convert a source dataset into verl parquet rows (one subcommand per source)."""


@data_group.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def validate_command(file: Path) -> None:
    """Check every row of FILE; print each problem with its fix, or a summary."""
    console = Console(stderr=True)
    report = validate_file(file)
    if report.ok:
        _print_summary(console, report)
        click.echo(f"{file}: {report.rows} rows OK")
        return
    for problem in report.errors[:_MAX_ERRORS_SHOWN]:
        click.echo(f"✗ {problem}", err=True)
    if len(report.errors) > _MAX_ERRORS_SHOWN:
        click.echo(f"... and {len(report.errors) - _MAX_ERRORS_SHOWN} more", err=True)
    raise click.ClickException(f"{file}: {len(report.errors)} problem(s) in {report.rows} rows")


@data_group.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--index",
    "index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Row position in the file (0-based).",
)
def show_command(file: Path, index: int) -> None:
    """Pretty-print one row of FILE, with its JSON fields decoded."""
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    if index >= table.num_rows:
        raise click.BadParameter(f"{file} has {table.num_rows} rows", param_hint="--index")
    record = table.slice(index, 1).to_pylist()[0]
    try:
        row = TaskRow.from_record(record)
    except ValueError as exc:
        raise click.ClickException(f"row {index} is not a valid task row:\n{exc}") from exc
    _print_row(Console(), row, index)


def _print_row(console: Console, row: TaskRow, index: int) -> None:
    env = row.extra_info.tools_kwargs.env
    head = Table.grid(padding=(0, 2))
    for key, value in (
        ("row", str(index)),
        ("instance_id", row.extra_info.instance_id),
        ("data_source", row.data_source),
        ("agent_name", row.agent_name),
        ("reward", f"{row.extra_info.tools_kwargs.reward.name} ({row.reward_model.style})"),
        ("image", env.image),
        ("backend", f"{env.sandbox.backend} (network {'on' if env.sandbox.network else 'off'})"),
        ("workdir", env.workdir),
        ("repo_source", env.repo_source or "-"),
        ("env_variables", json.dumps(env.env_variables)),
    ):
        head.add_row(f"[bold]{key}[/]", value)
    console.print(Panel(head, title="row"))
    for message in row.prompt:
        console.print(Panel(message.content, title=f"prompt: {message.role}"))
    if env.post_setup_cmd:
        console.print(
            Panel(Syntax(env.post_setup_cmd, "bash", word_wrap=True), title="post_setup_cmd")
        )
    console.print(
        Panel(
            Syntax(row.instance.model_dump_json(indent=2), "json", word_wrap=True), title="metadata"
        )
    )


def _print_summary(console: Console, report: ValidationReport) -> None:
    table = Table(title=f"{report.path.name}", show_header=False)

    def top(counter: Any, n: int = 3) -> str:
        shown = ", ".join(f"{k} ({v})" for k, v in counter.most_common(n))
        return f"{len(counter)}: {shown}" + (" ..." if len(counter) > n else "")

    table.add_row("rows", str(report.rows))
    table.add_row("repos", top(report.repos))
    table.add_row("images", top(report.images, 2))
    table.add_row("deployments", top(report.deployments))
    table.add_row("data sources", top(report.data_sources))
    table.add_row("agent names", top(report.agent_names))
    table.add_row("extra columns (kept)", ", ".join(report.extra_columns) or "none")
    console.print(table)
