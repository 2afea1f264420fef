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
from sandlot.cli.eval_exit import eval_exit
from sandlot.cli.exit_codes import ExitCode, InputError, OutputError, write_failure
from sandlot.cli.gc_cmd import leak_note
from sandlot.cli.ray_option import ray_evaluator, ray_option
from sandlot.cli.repo_mirror import mirror_dir, repo_mirror_option, settle_sources
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.preflight import exit_on, no_preflight_option, run_problems
from sandlot.rewards.predictions import Prediction, load_predictions
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.runner import RunOutcome, run_evaluations
from sandlot.sandboxes.labels import use_run_id
from sandlot.sandboxes.registry import get_backend

_LOGS_SHOWN = 10


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


def _load(
    dataset: Path, sources: list[str], wanted: list[str], image: str | None
) -> tuple[list[Instance], list[dict[str, Prediction]]]:
    """The selected instances and each source's predictions for them.

    Predictions are checked against the whole dataset, then cut to ``--instance-ids`` (as the
    SWE-bench harness does: a file with more instances evaluates the subset).

    Raises:
        InputError: the dataset is empty, a predictions file is unreadable or names an instance
            the dataset lacks, or nothing is left to evaluate.
        click.BadParameter: an ``--instance-ids`` entry is not in the dataset.
    """
    try:
        every = load_instances(dataset)
        if not every:
            raise ValueError(f"{dataset}: the dataset holds no instances; pass a non-empty one")
        if len(set(sources)) < len(sources):
            raise ValueError(f"--predictions names a file twice: {', '.join(sources)}")
        full = [load_predictions(source, every) for source in sources]
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise InputError(str(exc)) from None
    instances = _select(every, wanted)
    if image:
        instances = [i.model_copy(update={"image": image}) for i in instances]
    keep = {i.instance_id for i in instances}
    pred_sets = [{k: p for k, p in preds.items() if k in keep} for preds in full]
    if not any(pred_sets):
        raise InputError(
            f"nothing to evaluate: {' and '.join(sources)} hold no prediction for the "
            f"{len(instances)} selected instance(s); check --predictions and --instance-ids"
        )
    return instances, pred_sets


def _needing_repo(instances: list[Instance], pred_sets: list[dict[str, Prediction]]) -> set[str]:
    """Ids of the instances some non-empty patch is evaluated on (an empty one opens no
    sandbox)."""
    return {
        i.instance_id
        for i in instances
        for preds in pred_sets
        if (p := preds.get(i.instance_id)) is not None and (p.model_patch or "").strip()
    }


@click.command("eval")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Instances: a .jsonl/.json/.parquet file or a directory of them.",
)
@repo_mirror_option
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
@ray_option
@no_preflight_option
def eval_command(
    dataset: Path,
    repo_mirror: Path | None,
    predictions: tuple[str, ...],
    backend: str | None,
    workers: int,
    timeout: float | None,
    instance_ids: tuple[str, ...],
    image: str | None,
    run_id: str | None,
    output_dir: Path,
    use_ray: bool,
    no_preflight: bool,
) -> None:
    """Evaluate model patches on SWE-bench style instances and write SWE-bench style reports.

    Exit status: 0 every prediction got a verdict, 1 some evaluations errored, 2 bad input
    (nothing ran), 3 nothing resolved for a reason other than the patches, 4 logs or reports
    could not be written, 130 interrupted (see the README).
    """
    console = Console(stderr=True)
    backend_name = chosen_backend(backend)
    sources = split_predictions(predictions)
    instances, pred_sets = _load(dataset, sources, split_ids(instance_ids), image)
    needed = _needing_repo(instances, pred_sets)
    settled = iter(
        settle_sources(
            [i for i in instances if i.instance_id in needed],
            backend=backend_name,
            mirror=mirror_dir(repo_mirror),
        )
    )
    instances = [next(settled) if i.instance_id in needed else i for i in instances]
    run_id = run_id or time.strftime("sandlot-%Y%m%d-%H%M%S")
    try:
        use_run_id(run_id)  # the sandboxes' sandlot.run_id label, for `sandlot gc --run-id`
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--run-id") from exc
    todo = sum(len(preds) for preds in pred_sets)
    if not no_preflight:  # problems every instance would hit, found once (sandlot.preflight)
        wanted = [i for i in instances if any(i.instance_id in preds for preds in pred_sets)]
        output = ("--output-dir", output_dir)
        exit_on(run_problems(instances=wanted, backend=backend_name, output=output))
    files = f" from {len(pred_sets)} files" if len(pred_sets) > 1 else ""
    console.print(
        f"[bold]sandlot eval[/] run [cyan]{run_id}[/]: {todo} prediction(s){files} on "
        f"{len(instances)} instance(s), backend [cyan]{backend_name}[/], {workers} worker(s)"
        f"{', on Ray' if use_ray else ''}"
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

        async def main() -> list[RunOutcome]:
            async with ray_evaluator(use_ray, backend_name, timeout, workers) as evaluator:
                return await run_evaluations(
                    instances,
                    pred_sets,
                    run_id=run_id,
                    output_dir=output_dir,
                    backend=backend_name,
                    workers=workers,
                    timeout=timeout,
                    on_result=on_result,
                    evaluator=evaluator,
                )

        try:
            outcomes = anyio.run(main)
        except KeyboardInterrupt:
            console.print(
                f"[yellow]interrupted[/]; finished instances are saved. Resume with "
                f"--run-id {run_id}"
            )
            raise SystemExit(130) from None
        except ValueError as exc:  # two files name the same model
            raise InputError(str(exc)) from None
        except Exception as exc:
            if (failed := write_failure(exc)) is None:
                raise
            raise OutputError(
                f"cannot write the run's logs or reports under {output_dir / run_id}: "
                f"{failed}; free disk space or choose another --output-dir, then re-run with "
                f"--run-id {run_id} (finished instances are kept)"
            ) from None
    elapsed = time.monotonic() - started
    for outcome in outcomes:
        _print_summary(console, outcome, elapsed)
    set_ups = outcomes[0].set_ups
    if set_ups is not None:
        click.echo(f"{set_ups} sandbox set-up(s) for {todo} prediction(s)")
    note = leak_note(backend_name, run_id)
    if note:
        console.print(note, soft_wrap=True)
    code, why = eval_exit(outcomes, run_id)
    if code is not ExitCode.OK:
        click.echo(f"Error: {why}", err=True)
        raise SystemExit(code)


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
        _print_logs(console, outcome, [r for r in problems if r.status.is_error])
    # The headline goes to stdout so scripts can read it.
    click.echo(
        f"{report['resolved_instances']}/{report['total_instances']} resolved; "
        f"report: {outcome.report_path}"
    )


def _print_logs(console: Console, outcome: RunOutcome, errored: list[EvalResult]) -> None:
    """Where each error's whole cause is (the table cuts it to a line), one unwrapped path a
    line so it can be copied."""
    if not errored:
        return
    console.print("the cause of each error is in its log:")
    for r in sorted(errored, key=lambda r: r.instance_id)[:_LOGS_SHOWN]:
        console.print(f"  {r.instance_id}: {outcome.log_path(r)}", soft_wrap=True)
    if len(errored) > _LOGS_SHOWN:
        more = len(errored) - _LOGS_SHOWN
        console.print(f"  ... and {more} more beside them", soft_wrap=True)


def _failing(r: EvalResult) -> str:
    failed = r.FAIL_TO_PASS.failure + r.PASS_TO_PASS.failure
    return f"failing: {', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''}" if failed else ""
