"""``sandlot eval``: evaluate predictions on SWE-bench style instances (standalone reward)."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandlot.cli.backend_choice import chosen_backend
from sandlot.cli.env_cmd import build_recipes, distinct_recipes
from sandlot.cli.gc_cmd import leak_note
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.predictions import load_predictions
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.runner import RunOutcome, run_evaluations
from sandlot.sandboxes.labels import use_run_id
from sandlot.sandboxes.registry import get_backend


def split_ids(values: tuple[str, ...]) -> list[str]:
    """``--instance-ids`` values (repeated, or separated by commas/spaces) as one list."""
    return [v for value in values for v in value.replace(",", " ").split()]


def split_predictions(values: tuple[str, ...]) -> list[str]:
    """``--predictions`` values (repeated, or separated by commas) as one list; a value that
    is an existing file is kept whole (its name may hold a comma)."""
    found = []
    for value in values:
        parts = [value] if Path(value).is_file() else value.split(",")
        found += [part.strip() for part in parts if part.strip()]
    return found


def _select(instances: list[Instance], wanted: list[str]) -> list[Instance]:
    if not wanted:
        return instances
    known = {i.instance_id for i in instances}
    missing = [w for w in wanted if w not in known]
    if missing:
        raise click.BadParameter(
            f"not in the dataset: {', '.join(missing)}", param_hint="--instance-ids"
        )
    keep = set(wanted)
    return [i for i in instances if i.instance_id in keep]


@click.command("eval")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Instances: a .jsonl/.json/.parquet file or a directory of them.",
)
@click.option(
    "--predictions",
    required=True,
    multiple=True,
    help="Predictions .jsonl/.json (instance_id, model_name_or_path, model_patch), "
    "or the word `gold` for the reference patches. Several (repeat, or separate with commas) "
    "are evaluated in one run, each with its report, each instance set up once for all.",
)
@click.option(
    "--backend",
    default=None,
    help="Sandbox backend (default: $SANDLOT_BACKEND, then $DEPLOYMENT, then local).",
)
@click.option(
    "-j",
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Evaluations running at once.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds for each test command (default: each instance's eval_timeout).",
)
@click.option(
    "--instance-ids",
    multiple=True,
    help="Only these instances (repeat, or separate with commas/spaces).",
)
@click.option(
    "--image",
    default=None,
    help="Run every instance in this image instead of the one it names "
    "(e.g. a local test image for --backend docker).",
)
@click.option(
    "--run-id",
    default=None,
    help="Names the run; re-using it skips instances already evaluated. Remote sandboxes are "
    "labelled with it (sandlot gc --run-id ID).",
)
@click.option(
    "--output-dir",
    default=Path("logs/run_evaluation"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where logs and reports go.",
)
def eval_command(
    dataset: Path,
    predictions: tuple[str, ...],
    backend: str | None,
    workers: int,
    timeout: float | None,
    instance_ids: tuple[str, ...],
    image: str | None,
    run_id: str | None,
    output_dir: Path,
) -> None:
    """Evaluate model patches on SWE-bench style instances and write SWE-bench style reports."""
    console = Console(stderr=True)
    backend_name = chosen_backend(backend)
    try:
        instances = _select(load_instances(dataset), split_ids(instance_ids))
        if image:
            instances = [i.model_copy(update={"image": image}) for i in instances]
        sources = split_predictions(predictions)
        if len(set(sources)) < len(sources):
            raise ValueError(f"--predictions names a file twice: {', '.join(sources)}")
        pred_sets = [load_predictions(source, instances) for source in sources]
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    run_id = run_id or time.strftime("sandlot-%Y%m%d-%H%M%S")
    try:
        use_run_id(run_id)  # the sandboxes' sandlot.run_id label, for `sandlot gc --run-id`
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--run-id") from exc
    todo = sum(1 for preds in pred_sets for i in instances if i.instance_id in preds)
    files = f" from {len(pred_sets)} files" if len(pred_sets) > 1 else ""
    console.print(
        f"[bold]sandlot eval[/] run [cyan]{run_id}[/]: {todo} prediction(s){files} on "
        f"{len(instances)} instance(s), backend [cyan]{backend_name}[/], {workers} worker(s)"
    )
    started = time.monotonic()
    if get_backend(backend_name).on_host:
        # Built once up front, with a spinner, instead of silently inside the first sandbox.
        wanted = [i for i in instances if any(i.instance_id in preds for preds in pred_sets)]
        build_recipes(console, distinct_recipes(wanted, backend_name), backend_name)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("evaluating", total=todo)
        resolved = 0

        def on_result(result: EvalResult) -> None:
            nonlocal resolved
            resolved += result.resolved
            progress.update(task, advance=1, description=f"evaluating ({resolved} resolved)")

        try:
            outcomes = anyio.run(
                lambda: run_evaluations(
                    instances,
                    pred_sets,
                    run_id=run_id,
                    output_dir=output_dir,
                    backend=backend_name,
                    workers=workers,
                    timeout=timeout,
                    on_result=on_result,
                )
            )
        except KeyboardInterrupt:
            console.print(
                f"[yellow]interrupted[/]; finished instances are saved. Resume with "
                f"--run-id {run_id}"
            )
            raise SystemExit(130) from None
        except ValueError as exc:  # two files name the same model
            raise click.ClickException(str(exc)) from exc
    elapsed = time.monotonic() - started
    for outcome in outcomes:
        _print_summary(console, outcome, elapsed)
    set_ups = outcomes[0].set_ups
    if set_ups is not None:
        click.echo(f"{set_ups} sandbox set-up(s) for {todo} prediction(s)")
    note = leak_note(backend_name, run_id)
    if note:
        console.print(note, soft_wrap=True)


def _print_summary(console: Console, outcome: RunOutcome, elapsed: float) -> None:
    report = outcome.report
    table = Table(title="sandlot eval summary", show_header=False)
    for key in (
        "total",
        "submitted",
        "completed",
        "resolved",
        "unresolved",
        "empty_patch",
        "error",
    ):
        table.add_row(key.replace("_", " "), str(report[f"{key}_instances"]))
    for key, label in (
        ("triggered", "integrity defences triggered"),
        ("reverted_files", "  model test-infrastructure reverted"),
        ("channel_violated", "  pytest channel violated"),
        ("channel_unavailable", "  no pytest channel (log grading)"),
    ):
        table.add_row(label, str(report["integrity"][f"{key}_instances"]))
    table.add_row("resumed from earlier run", str(len(outcome.resumed)))
    table.add_row("wall time", f"{elapsed:.1f} s")
    console.print(table)
    problems = [r for r in outcome.results.values() if r.status not in (EvalStatus.RESOLVED,)]
    if problems:
        detail = Table(title="not resolved")
        for col in ("instance_id", "status", "detail"):
            detail.add_column(col)
        for r in sorted(problems, key=lambda r: r.instance_id):
            why = (r.error or "; ".join(r.log_warnings) or _failing(r)).splitlines()
            detail.add_row(r.instance_id, r.status.value, why[0][:120] if why else "")
        console.print(detail)
    # The headline goes to stdout so scripts can read it.
    click.echo(
        f"{report['resolved_instances']}/{report['total_instances']} resolved; "
        f"report: {outcome.report_path}"
    )


def _failing(r: EvalResult) -> str:
    failed = r.FAIL_TO_PASS.failure + r.PASS_TO_PASS.failure
    return f"failing: {', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''}" if failed else ""
