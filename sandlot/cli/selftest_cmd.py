"""``sandlot data selftest``: keep only the rows whose reward can be earned (the gold patch
resolves, the empty patch does not, every time), naming each other row's reason."""

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
from sandlot.cli.exit_codes import ExitCode, InputError, OutputError, write_failure
from sandlot.cli.gc_cmd import leak_note
from sandlot.cli.ray_option import ray_evaluator, ray_option
from sandlot.cli.repo_mirror import mirror_dir, repo_mirror_option, settle_sources
from sandlot.datasets.errors import DatasetError
from sandlot.datasets.loaders import SUFFIXES, load_instances
from sandlot.datasets.subset import write_subset
from sandlot.preflight import exit_on, no_preflight_option, run_problems
from sandlot.rewards.result import EvalResult
from sandlot.rewards.selftest import SelftestOutcome, run_selftest
from sandlot.sandboxes.labels import use_run_id
from sandlot.sandboxes.registry import get_backend

_LOGS_SHOWN = 20


@click.command("selftest")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Rows: SWE-bench .jsonl/.json, verl or uni-agent .parquet, or a directory of them.",
)
@repo_mirror_option
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
    "--repeats",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Gold runs per row; a row whose runs disagree is flaky.",
)
@click.option(
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the rows kept here, in the dataset's own format (same suffix).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds for each test command (default: each row's eval_timeout).",
)
@click.option(
    "--image",
    default=None,
    help="Run every row in this image instead of the one it names (e.g. a local test image "
    "for --backend docker); --output still writes the rows as they were.",
)
@click.option(
    "--run-id",
    default=None,
    help="Names the run; re-using it resumes (finished evaluations are kept, infrastructure "
    "errors run again).",
)
@click.option(
    "--output-dir",
    default=Path("logs/selftest"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where logs and the report go.",
)
@ray_option
@no_preflight_option
def selftest_command(
    dataset: Path,
    repo_mirror: Path | None,
    backend: str | None,
    workers: int,
    repeats: int,
    output: Path | None,
    timeout: float | None,
    image: str | None,
    run_id: str | None,
    output_dir: Path,
    use_ray: bool,
    no_preflight: bool,
) -> None:
    """Run every row's gold patch and its unpatched repository, and keep the rows whose
    reward can be earned: gold resolves (each of --repeats runs alike), FAIL_TO_PASS fails
    before and passes after, PASS_TO_PASS passes both times. Each row is set up once and its
    evaluations run in forks. Every other row gets one reason (docs/datasets.md#selftest).

    Exit status: 0 every row judged, 1 some rows hit infrastructure errors (re-run with
    --run-id to judge them), 2 bad input, 4 the report or --output could not be written,
    130 interrupted.
    """
    console = Console(stderr=True)
    backend_name = chosen_backend(backend)
    try:
        instances = load_instances(dataset)
    except (DatasetError, FileNotFoundError, ImportError) as exc:
        raise InputError(str(exc)) from None
    if not instances:
        raise InputError(f"{dataset}: the dataset holds no rows; pass a non-empty one")
    if output is not None and {output.suffix} != (types := _file_types(dataset)):
        raise click.BadParameter(
            f"{output} must end in {' or '.join(sorted(types))}, as the dataset's files do "
            "(rows are written in their own format; a directory must hold one file type)",
            param_hint="--output",
        )
    if image:
        instances = [i.model_copy(update={"image": image}) for i in instances]
    instances = settle_sources(instances, backend=backend_name, mirror=mirror_dir(repo_mirror))
    run_id = run_id or time.strftime("selftest-%Y%m%d-%H%M%S")
    try:
        use_run_id(run_id)  # the sandboxes' sandlot.run_id label, for `sandlot gc --run-id`
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--run-id") from exc
    if not no_preflight:
        output_arg = ("--output-dir", output_dir)
        exit_on(run_problems(instances=instances, backend=backend_name, output=output_arg))
    todo = len(instances) * (repeats + 1)
    console.print(
        f"[bold]sandlot data selftest[/] run [cyan]{run_id}[/]: {len(instances)} row(s) x "
        f"{repeats + 1} evaluation(s) (before the fix, gold x{repeats}), backend "
        f"[cyan]{backend_name}[/], {workers} worker(s){', on Ray' if use_ray else ''}"
    )
    started = time.monotonic()
    if get_backend(backend_name).on_host:
        # A recipe that fails here fails its rows' evaluations: environment_build_failed.
        build_recipes(console, distinct_recipes(instances, backend_name), backend_name)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("evaluating", total=todo)

        def on_result(result: EvalResult) -> None:
            progress.update(task, advance=1)

        async def main() -> SelftestOutcome:
            async with ray_evaluator(use_ray, backend_name, timeout, workers) as evaluator:
                return await run_selftest(
                    instances,
                    run_id=run_id,
                    output_dir=output_dir,
                    repeats=repeats,
                    backend=backend_name,
                    workers=workers,
                    timeout=timeout,
                    evaluator=evaluator,
                    on_result=on_result,
                    described={
                        "run_id": run_id,
                        "dataset": str(dataset),
                        "backend": backend_name,
                        "repeats": repeats,
                    },
                )

        try:
            outcome = anyio.run(main)
        except KeyboardInterrupt:
            console.print(
                f"[yellow]interrupted[/]; finished evaluations are saved. Resume with "
                f"--run-id {run_id}"
            )
            raise SystemExit(130) from None
        except Exception as exc:
            if (failed := write_failure(exc)) is None:
                raise
            raise OutputError(
                f"cannot write the run's logs or report under {output_dir / run_id}: {failed}; "
                f"free disk space or choose another --output-dir, then re-run with --run-id "
                f"{run_id}"
            ) from None
    _print_outcome(console, outcome, time.monotonic() - started)
    if output is not None:
        try:
            written = write_subset(dataset, set(outcome.kept_ids), output)
        except (OSError, DatasetError) as exc:
            raise OutputError(f"cannot write --output {output}: {exc}") from None
        console.print(f"{written} kept row(s) written to {output}", soft_wrap=True)
    note = leak_note(backend_name, run_id)
    if note:
        console.print(note, soft_wrap=True)
    rerun = outcome.report["infrastructure_errors"]
    if rerun:
        click.echo(
            f"Error: {rerun} row(s) hit infrastructure errors and were not judged (not counted "
            f"as bad); re-run with --run-id {run_id} to judge them",
            err=True,
        )
        raise SystemExit(ExitCode.ERRORS)


def _file_types(dataset: Path) -> set[str]:
    """The suffixes of the dataset's files (a directory's dataset files')."""
    files = dataset.iterdir() if dataset.is_dir() else [dataset]
    return {f.suffix for f in files if f.suffix in SUFFIXES}


def _print_outcome(console: Console, outcome: SelftestOutcome, elapsed: float) -> None:
    report = outcome.report
    resumed = sum(len(o.resumed) for o in outcome.outcomes)
    if resumed:
        console.print(f"resumed {resumed} finished evaluation(s) of run {report['run_id']}")
    summary = Table(title="sandlot data selftest", show_header=False)
    for key in ("total_rows", "kept_rows", "bad_rows", "infrastructure_errors"):
        summary.add_row(key.replace("_", " "), str(report[key]))
    for reason, count in sorted(report["reasons"].items()):
        summary.add_row(f"  {reason}", str(count))
    summary.add_row("wall time", f"{elapsed:.1f} s")
    console.print(summary)
    rejected = [v for v in outcome.verdicts if not v.kept]
    if rejected:
        table = Table(title="rows not kept")
        for column in ("instance_id", "reason", "detail"):
            table.add_column(column)
        for v in rejected:
            assert v.reason is not None
            table.add_row(v.instance_id, v.reason.value, v.detail[:160])
        console.print(table)
        console.print("each row's log:")
        for v in rejected[:_LOGS_SHOWN]:
            console.print(f"  {v.instance_id}: {outcome.log_path(v)}", soft_wrap=True)
        if len(rejected) > _LOGS_SHOWN:
            console.print(f"  ... and {len(rejected) - _LOGS_SHOWN} more in the report")
    # The headline goes to stdout so scripts can read it.
    click.echo(
        f"{report['kept_rows']}/{report['total_rows']} rows kept; report: {outcome.report_path}"
    )
