"""``sandlot data``: prepare verl parquet files from SWE datasets, validate them, convert
another tool's rows (uni-agent), show a row."""

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

from sandlot.datasets.command import prepare_command, print_summary
from sandlot.datasets.convert import SOURCES, convert_file
from sandlot.datasets.errors import DatasetError
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.prepare import Preprocessor
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.uni_agent import LAYOUT as UNI_AGENT
from sandlot.datasets.validate import validate_file
from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.registry import check_backend_name

PREPROCESSORS = {
    "swe_bench_verified": "sandlot.datasets.swe_bench_verified",
    "swe_rebench": "sandlot.datasets.swe_rebench",
    "r2e_gym_subset": "sandlot.datasets.r2e_gym_subset",
}
"""Name → module holding its ``PREPROCESSOR`` (also runnable as ``python -m <module>``)."""

_MAX_ERRORS_SHOWN = 50


def _preprocessor(name: str) -> Preprocessor:
    pre: Preprocessor = importlib.import_module(PREPROCESSORS[name]).PREPROCESSOR
    return pre


class _PrepareGroup(click.Group):
    """Subcommands built on demand from :data:`PREPROCESSORS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(PREPROCESSORS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return prepare_command(_preprocessor(cmd_name)) if cmd_name in PREPROCESSORS else None


@click.group("data")
def data_group() -> None:
    """Prepare, validate and inspect verl parquet datasets of SWE tasks."""


@data_group.group("prepare", cls=_PrepareGroup)
def prepare_group() -> None:
    """Convert a source dataset into verl parquet rows (one subcommand per source)."""


@data_group.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def validate_command(file: Path) -> None:
    """Check every row of FILE; print each problem with its fix, or a summary.

    FILE is a parquet file of rows (`sandlot data prepare`), or SWE-bench instances
    (.jsonl/.json), checked as `sandlot eval` and `sandlot rollout` read them.
    """
    if file.suffix in (".jsonl", ".json"):  # instances; rows are parquet
        _validate_instances(file)
        return
    console = Console(stderr=True)
    report = validate_file(file)
    if report.layout == UNI_AGENT:
        click.echo(
            f"{file} has uni-agent's row layout (its preprocessing scripts): sandlot eval, "
            "rollout and train read it as converted below; `sandlot data convert --from "
            "uni-agent` writes it in sandlot's layout",
            err=True,
        )
    if report.ok:
        print_summary(console, report)
        click.echo(f"{file}: {report.rows} rows OK")
        return
    for problem in report.errors[:_MAX_ERRORS_SHOWN]:
        click.echo(f"✗ {problem}", err=True)
    if len(report.errors) > _MAX_ERRORS_SHOWN:
        click.echo(f"... and {len(report.errors) - _MAX_ERRORS_SHOWN} more", err=True)
    raise click.ClickException(f"{file}: {len(report.errors)} problem(s) in {report.rows} rows")


def _validate_instances(file: Path) -> None:
    """Load every instance of ``file``; the first bad record is the error (file, line, field).

    Raises:
        click.ClickException: a record is not a valid instance, or there is none.
    """
    try:
        count = len(load_instances(file))
    except DatasetError as exc:
        raise click.ClickException(f"{exc} (fix that record)") from None
    if count == 0:
        raise click.ClickException(f"{file}: no instances (one JSON object per line)")
    click.echo(f"{file}: {count} instances OK")


def _registered_backend(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> str | None:
    """``--backend`` of ``data convert``: any registered backend, else the error listing them."""
    if value is None:
        return None
    try:
        check_backend_name(value.strip().lower())
    except BackendNotFoundError as exc:
        raise click.BadParameter(str(exc)) from None
    return value.strip().lower()


@data_group.command("convert")
@click.option(
    "--from", "layout", type=click.Choice(SOURCES), required=True, help="The input's layout."
)
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--backend",
    "--deployment",
    "backend",
    default=None,
    callback=_registered_backend,
    help="sandbox.backend of the rows, any registered backend "
    "[default: vefaas for veFaaS registry images, else docker].",
)
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Leave invalid rows out and list them in <output>.rejected.jsonl.",
)
def convert_command(
    layout: str, source: Path, output: Path, backend: Any, skip_invalid: bool
) -> None:
    """Rewrite SOURCE (rows of another tool) into sandlot rows at OUTPUT (parquet)."""
    try:
        result = convert_file(source, output, backend=backend, skip_invalid=skip_invalid)
    except (OSError, ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None
    print_summary(Console(stderr=True), result.report)
    if result.rejected_path is not None:
        click.echo(
            f"skipped {len(result.rejected)} invalid rows, listed in {result.rejected_path}",
            err=True,
        )
    click.echo(f"wrote {result.rows} rows to {result.path}")


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
