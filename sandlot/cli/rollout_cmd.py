"""``sandlot rollout``: run a model over a dataset (agent episodes + rewards); ``sandlot report``.

``rollout`` writes into ``--output DIR``:

* ``trajectories.jsonl``: one trajectory per finished episode, appended as each finishes
  (re-running the same command resumes: episodes already there are skipped);
* ``predictions.jsonl``: SWE-bench predictions (``instance_id``, ``model_name_or_path``,
  ``model_patch``), one per instance: its first sample's patch; an instance whose first sample
  ended in ``infra_error`` is left out (the harness would count it as submitted). ``sandlot
  eval`` and the SWE-bench harness read it as it is;
* ``summary.json``: the run (model, dataset, backend, run id, ...) and its statistics;
* ``report.html``: every episode, browsable offline (``sandlot report DIR`` rebuilds it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import click
from rich.console import Console
from rich.table import Table

from sandlot.cli.backend_choice import chosen_backend
from sandlot.cli.env_cmd import build_recipes, distinct_recipes
from sandlot.cli.eval_cmd import split_ids
from sandlot.cli.exit_codes import ExitCode, InputError, OutputError, write_failure
from sandlot.cli.gc_cmd import leak_note
from sandlot.cli.repo_mirror import mirror_dir, repo_mirror_option, settle_sources
from sandlot.datasets.instance import Instance
from sandlot.datasets.rows import TaskRow
from sandlot.errors import SandboxError
from sandlot.preflight import Endpoint, exit_on, no_preflight_option, run_problems
from sandlot.rollout.audit.run import instances_by_id, run_dataset
from sandlot.rollout.config import AgentConfig, ConfigError, load_agent_config, with_flags
from sandlot.rollout.display import LiveDisplay
from sandlot.rollout.episodes import InProcessEpisodes
from sandlot.rollout.errors import RolloutError
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.ray_episodes import RayEpisodes
from sandlot.rollout.report import REPORT_FILE, report_meta, write_report
from sandlot.rollout.rows import load_rows
from sandlot.rollout.scheduler import run_rollout, run_until_signalled
from sandlot.rollout.stats import RolloutStats
from sandlot.rollout.store import TRAJECTORIES_FILE, TrajectoryLog, atomic_write, write_predictions
from sandlot.rollout.summary import RolloutSummary, summarize
from sandlot.sandboxes.labels import pin_run_id, use_run_id
from sandlot.sandboxes.registry import get_backend
from sandlot.sandboxes.setups.cache import SetupCache

PREDICTIONS_FILE = "predictions.jsonl"
SUMMARY_FILE = "summary.json"
_RESUME = "free disk space or choose a writable place, then run the same command to resume"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[-60:] or "model"


def _public_url(url: str) -> str:
    """``url`` without user:password (never written to disk)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


@click.command("rollout")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="Rows (a parquet file from `sandlot data prepare`) or instances "
    "(.jsonl/.json/.parquet of SWE-bench records), or a directory of them.",
)
@repo_mirror_option
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="agent_config.yaml (see examples/agent_config/).",
)
@click.option("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. http://host/v1.")
@click.option("--model", required=True, help="Model name sent to the endpoint (and recorded).")
@click.option(
    "--backend",
    default=None,
    help="Sandbox backend (default: $SANDLOT_BACKEND, $DEPLOYMENT, then the config's).",
)
@click.option(
    "-n",
    "--samples",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Episodes per instance (pass@n, avg@n); with reward.mode fresh they share one set-up "
    "per instance (docs/groups.md).",
)
@click.option(
    "--concurrency",
    default=None,
    type=click.IntRange(min=1),
    help="Episodes at once (default: the config's `concurrency`).",
)
@click.option(
    "--output",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory (default: rollouts/<model>-<time>). Re-using one resumes it.",
)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Run episodes on a Ray cluster ($RAY_ADDRESS, else `auto`); needs sandlot[train].",
)
@click.option(
    "--native-tools",
    is_flag=True,
    help="Pass tools through the API's `tools` field instead of parsing text tool calls.",
)
@click.option(
    "--max-retries",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Re-runs of an episode that failed on infrastructure (sandbox start, a model server "
    "down for longer than the client's retry budget).",
)
@click.option(
    "--retry-backoff",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds before the first re-run; doubled for each further one.",
)
@click.option(
    "--retry-errors",
    is_flag=True,
    help="When resuming, also re-run episodes recorded as retryable infrastructure errors.",
)
@click.option(
    "--temperature", default=None, type=float, help="generation.temperature (sampling temperature)."
)
@click.option("--top-p", default=None, type=float, help="generation.top_p (nucleus sampling mass).")
@click.option(
    "--max-tokens",
    default=None,
    type=click.IntRange(min=1),
    help="generation.max_tokens: the most tokens one request may generate.",
)
@click.option(
    "--response-length",
    default=None,
    type=click.IntRange(min=1),
    help="generation.response_length: tokens an episode may add after its first prompt, as "
    "verl's rollout.response_length (each request asks for what is left).",
)
@click.option(
    "--stop", "stop", multiple=True, help="generation.stop: a stop string (repeat for more)."
)
@click.option(
    "--chat-template-kwargs",
    default=None,
    callback=lambda ctx, param, value: _json_object(value, param),
    help="generation.chat_template_kwargs as a JSON object, e.g. '{\"enable_thinking\": false}'.",
)
@click.option(
    "--extra-body",
    default=None,
    callback=lambda ctx, param, value: _json_object(value, param),
    help="generation.extra_body as a JSON object: further request fields (top_k, min_p, ...).",
)
@click.option(
    "--request-timeout",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds one model request may take (default: the config's client.request_timeout_s).",
)
@click.option(
    "--retry-budget",
    default=None,
    type=click.FloatRange(min=0),
    help="Seconds a turn's failed model requests are retried while its episode waits "
    "(default: the config's client.retry_budget_s).",
)
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the endpoint's API key (never written anywhere).",
)
@click.option(
    "--image",
    default=None,
    help="Run every instance in this image instead of the one it names.",
)
@click.option(
    "--instance-ids",
    multiple=True,
    help="Only these instances (repeat, or separate with commas/spaces).",
)
@click.option(
    "--run-id",
    default=None,
    help="Label the run's sandboxes with this id (sandlot gc --run-id ID); default: "
    "$SANDLOT_RUN_ID or a new one.",
)
@no_preflight_option
def rollout_command(
    dataset: Path,
    repo_mirror: Path | None,
    config_path: Path,
    base_url: str,
    model: str,
    backend: str | None,
    samples: int,
    concurrency: int | None,
    output: Path | None,
    use_ray: bool,
    native_tools: bool,
    max_retries: int,
    retry_backoff: float,
    retry_errors: bool,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    response_length: int | None,
    stop: tuple[str, ...],
    chat_template_kwargs: dict[str, Any] | None,
    extra_body: dict[str, Any] | None,
    request_timeout: float | None,
    retry_budget: float | None,
    api_key_env: str,
    image: str | None,
    instance_ids: tuple[str, ...],
    run_id: str | None,
    no_preflight: bool,
) -> None:
    """Run a model over a dataset: agent episodes in sandboxes, each graded by its tests.

    Exit status: 0 every episode ran, 1 some episodes ended in infra_error, 2 bad input
    (nothing ran), 4 the outputs could not be written, 128 + N stopped by signal N (see the
    README).
    """
    console = Console(stderr=True)
    try:
        config = load_agent_config(config_path)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    try:
        config = config.model_copy(
            update={
                "client": with_flags(
                    config.client,
                    "client",
                    request_timeout_s=request_timeout,
                    retry_budget_s=retry_budget,
                ),
                "generation": with_flags(
                    config.generation,
                    "generation",
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=max_tokens,
                    response_length=response_length,
                    stop=list(stop) or None,
                    chat_template_kwargs=chat_template_kwargs,
                    extra_body=extra_body,
                ),
            }
        )
    except ConfigError as exc:
        raise InputError(f"{config_path}: {exc}") from None
    backend_name = chosen_backend(
        backend, config.sandbox.file_backend(), f"{config_path}'s sandbox.backend"
    )
    try:
        backend_cls = get_backend(backend_name)
        options = config.sandbox.options_for(backend_name)
    except ConfigError as exc:
        raise InputError(f"{config_path}: {exc}") from None
    rows = _load(dataset, backend_name, image, split_ids(instance_ids))
    sampling = config.generation.request_fields()
    client = config.client.model_dump()
    try:
        policy = OpenAIChatPolicy(
            base_url,
            model,
            api_key_env=api_key_env,
            native_tools=native_tools,
            sampling=sampling,
            **client,
        )
    except (ValueError, SandboxError) as exc:
        raise InputError(str(exc)) from None
    concurrency = concurrency or config.concurrency
    out = output or Path("rollouts") / f"{_slug(model)}-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = _with_sources(rows, backend_name, mirror_dir(repo_mirror))
    if not no_preflight:  # problems every episode would hit, found once (sandlot.preflight)
        found = run_problems(
            instances=[r.instance for r in rows],
            backend=backend_name,
            options=options,
            output=("--output", out),
            endpoint=Endpoint(base_url, os.environ.get(api_key_env), api_key_env),
        )
        exit_on(found)
    try:
        log_file = TrajectoryLog(out / TRAJECTORIES_FILE)
    except (RolloutError, OSError) as exc:
        raise InputError(str(exc)) from None
    with log_file:
        others = {r.model_name_or_path for r in log_file.records.values()} - {model, ""}
        if others:
            raise InputError(
                f"{out} holds trajectories of another model ({', '.join(sorted(others))}); "
                "choose another --output"
            )
        try:
            run_id = use_run_id(run_id) if run_id else pin_run_id()
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--run-id") from exc
        total = len(rows) * samples
        ids = {r.instance.instance_id for r in rows}
        already = sum(1 for iid, s in log_file.records if iid in ids and s < samples)
        console.print(
            f"[bold]sandlot rollout[/] [cyan]{model}[/] on {len(rows)} instance(s) x {samples} "
            f"sample(s) = {total} episode(s), backend [cyan]{backend_name}[/], concurrency "
            f"{concurrency}{', on Ray' if use_ray else ''}; output [cyan]{out}[/]; run id "
            f"[cyan]{run_id}[/]"
        )
        if already:
            console.print(f"resuming: {already} episode(s) already in {TRAJECTORIES_FILE}")
        if log_file.repaired:
            console.print(f"[yellow]repaired {TRAJECTORIES_FILE}[/]: {log_file.repaired}")
        if not backend_cls.on_host:
            console.print(
                f"after a crash: [bold]sandlot gc --backend {backend_name} --run-id {run_id}[/]"
            )
        elif not use_ray:
            # Built once up front, with a spinner, instead of inside the first episodes.
            recipes = distinct_recipes([r.instance for r in rows], backend_name)
            try:
                build_recipes(console, recipes, backend_name)
            except KeyboardInterrupt:
                console.print("[yellow]interrupted[/] while building environments")
                raise SystemExit(130) from None
        stats = RolloutStats()
        display = LiveDisplay(stats, console, title=f"rollout {model}")
        left_open = 0

        async def run() -> None:
            nonlocal left_open
            common: dict[str, Any] = dict(
                samples=samples,
                concurrency=concurrency,
                max_retries=max_retries,
                retry_backoff_s=retry_backoff,
                redo_retryable=retry_errors,
                stats=stats,
                on_finished=display.finished,
            )
            async with policy:
                if use_ray:
                    factory = functools.partial(
                        OpenAIChatPolicy,
                        base_url,
                        model,
                        api_key=os.environ.get(api_key_env),
                        native_tools=native_tools,
                        sampling=sampling,
                        **client,
                    )
                    ray_eps = RayEpisodes(
                        factory,
                        config,
                        backend=backend_name,
                        model_name_or_path=model,
                        concurrency=concurrency,
                        group_size=samples,
                    )
                    try:
                        async with ray_eps:
                            await run_rollout(rows, ray_eps, log_file, **common)
                    finally:
                        left_open = ray_eps.left_open
                    return
                async with aclosing(SetupCache()) as setups:
                    with InProcessEpisodes(
                        policy,
                        config,
                        backend=backend_name,
                        model_name_or_path=model,
                        sandbox_options=options,
                        setups=setups if samples > 1 else None,
                        group_size=samples,
                    ) as episodes:
                        try:
                            await run_rollout(rows, episodes, log_file, **common)
                        finally:
                            left_open = episodes.alive

        def on_signal(signum: int, count: int) -> None:
            name = signal.Signals(signum).name
            if count == 1:
                console.print(
                    f"[yellow]{name}[/]: cancelling running episodes and closing their "
                    "sandboxes; finished trajectories are saved"
                )
            else:
                console.print(f"[yellow]{name}[/]: still closing sandboxes (at most a minute)")

        started = time.monotonic()
        try:
            with display:
                _, signum = anyio.run(lambda: run_until_signalled(run, on_signal=on_signal))
        except Exception as exc:
            root = _root_cause(exc)
            if (failed := write_failure(exc)) is not None:
                raise OutputError(f"cannot write under {out}: {failed}; {_RESUME}") from None
            if isinstance(root, RolloutError | SandboxError | ValueError | OSError):
                raise click.ClickException(str(root)) from None
            raise
        elapsed = time.monotonic() - started
        if left_open:
            cleanup = (
                "their directories remain under the sandbox root ($SANDLOT_LOCAL_ROOT)"
                if backend_cls.on_host
                else f"remove them with sandlot gc --backend {backend_name} --run-id {run_id}"
            )
            console.print(f"[red]{left_open} sandbox(es) were still open at the end[/]; {cleanup}")
        note = leak_note(backend_name, run_id)
        if note:
            console.print(note, soft_wrap=True)
        try:
            summary = _write_outputs(
                out,
                log_file,
                rows,
                samples=samples,
                run={
                    "model": model,
                    "base_url": _public_url(base_url),
                    "dataset": str(dataset),
                    "config": str(config_path),
                    "backend": backend_name,
                    "samples": samples,
                    "concurrency": concurrency,
                    "ray": use_ray,
                    "run_id": run_id,
                    "interrupted": signal.Signals(signum).name if signum else None,
                    "wall_s": round(elapsed, 3),
                    "episodes_this_run": stats.new,
                    "retries_this_run": stats.retries,
                    "predictions": "the first sample of each instance",
                },
            )
        except OSError as exc:
            raise OutputError(f"cannot write the outputs in {out}: {exc}; {_RESUME}") from None
    _print_summary(console, summary, stats, elapsed, config)
    if samples > 1:
        console.print(
            f"{PREDICTIONS_FILE} holds each instance's first sample (sample 0); every sample "
            f"is in {TRAJECTORIES_FILE}"
        )
    if signum is not None:
        console.print(
            f"[yellow]interrupted[/]: {stats.done}/{stats.total} episodes are saved; run the same "
            f"command with --output {out} to finish the rest"
        )
        raise SystemExit(128 + signum)
    # The headline goes to stdout so scripts can read it (as `sandlot eval` prints its own).
    click.echo(f"{summary.resolved_first}/{len(rows)} resolved; output: {out}")
    if summary.infra_errors:
        click.echo(
            f"Error: {summary.infra_errors} episode(s) ended in infra_error (not the model's "
            f"doing; their instances' first samples are left out of {PREDICTIONS_FILE}); see "
            f"report.html for the causes, then run the same command with --retry-errors to "
            "re-run the retryable ones",
            err=True,
        )
        raise SystemExit(ExitCode.ERRORS)


def _json_object(value: str | None, param: click.Parameter) -> dict[str, Any] | None:
    """A flag's JSON object (``None`` when not given).

    Raises:
        click.BadParameter: not JSON, or not an object (names the flag).
    """
    if value is None:
        return None
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param=param) from None
    if not isinstance(decoded, dict):
        raise click.BadParameter(f"must be a JSON object, got {value!r}", param=param)
    return decoded


def _root_cause(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one exception each."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not (isinstance(inner, tuple) and len(inner) == 1):
            return exc
        exc = inner[0]


def _load(dataset: Path, backend: str, image: str | None, ids: list[str]) -> list[TaskRow]:
    """The rows to run.

    Raises:
        InputError: the dataset is empty or invalid, or an ``--instance-ids`` entry is unknown.
    """
    try:
        rows = load_rows(dataset, backend=backend, image=image, instance_ids=ids or None)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise InputError(str(exc)) from None
    if not rows:
        raise InputError(f"{dataset}: the dataset holds no rows; pass a non-empty one")
    return rows


def _with_sources(rows: list[TaskRow], backend: str, mirror: Path | None) -> list[TaskRow]:
    """``rows`` with their repository sources settled (``--repo-mirror``).

    Raises:
        InputError: a row has no repository source.
    """
    instances = settle_sources([r.instance for r in rows], backend=backend, mirror=mirror)
    return [_with_source(row, inst) for row, inst in zip(rows, instances, strict=True)]


def _with_source(row: TaskRow, instance: Instance) -> TaskRow:
    """``row`` whose instance and sandbox fields take ``instance``'s ``repo_source``."""
    if instance.repo_source == row.instance.repo_source:
        return row
    tools = row.extra_info.tools_kwargs
    tools = tools.model_copy(
        update={
            "env": tools.env.model_copy(update={"repo_source": instance.repo_source}),
            "reward": tools.reward.model_copy(update={"metadata": instance}),
        }
    )
    extra = row.extra_info.model_copy(update={"tools_kwargs": tools})
    return row.model_copy(update={"extra_info": extra})


def _write_outputs(
    out: Path,
    log_file: TrajectoryLog,
    rows: list[TaskRow],
    *,
    samples: int,
    run: dict[str, Any],
) -> RolloutSummary:
    """predictions.jsonl, summary.json and report.html from what ``log_file`` holds."""
    ids = [r.instance.instance_id for r in rows]
    wanted = set(ids)
    records = {k: r for k, r in log_file.records.items() if k[0] in wanted and k[1] < samples}
    write_predictions(
        records,
        log_file.path,
        out / PREDICTIONS_FILE,
        order=ids,
        model_name_or_path=run["model"],
    )
    summary = summarize(records.values())
    atomic_write(
        out / SUMMARY_FILE,
        json.dumps({"run": run, "summary": summary.model_dump()}, indent=2) + "\n",
    )
    meta = {k: run[k] for k in ("model", "dataset", "backend", "samples", "run_id")}
    title = f"sandlot rollout: {run['model']}"
    instances = {r.instance.instance_id: r.instance for r in rows}
    write_report(log_file.path, out / REPORT_FILE, title=title, meta=meta, instances=instances)
    return summary


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _print_summary(
    console: Console,
    summary: RolloutSummary,
    stats: RolloutStats,
    elapsed: float,
    config: AgentConfig,
) -> None:
    table = Table(title="sandlot rollout summary", show_header=False)
    table.add_row("instances", str(summary.instances))
    table.add_row("episodes", f"{summary.episodes} ({stats.new} this run, {stats.resumed} resumed)")
    first = f"{_pct(summary.pass_at_1)} (first sample: what {PREDICTIONS_FILE} holds)"
    table.add_row("pass@1", first)
    if summary.samples > 1:
        table.add_row(f"avg@{summary.samples}", _pct(summary.avg_at_n))
        for key, value in summary.pass_at_k.items():
            if key != "pass@1":
                table.add_row(key, f"{_pct(value)} (unbiased estimator)")
    table.add_row("mean turns", f"{summary.mean_turns:.1f} (max {config.interaction.max_turns})")
    table.add_row("format errors", str(summary.format_errors))
    table.add_row("infra errors", f"{summary.infra_errors} (retries this run: {stats.retries})")
    tokens = f"{summary.prompt_tokens} prompt, {summary.completion_tokens} completion"
    table.add_row("tokens", tokens)
    for purpose, counts in (("agent", summary.setups.agent), ("grading", summary.setups.grading)):
        if counts.set_up or counts.forked:
            table.add_row(f"{purpose} sandboxes", f"{counts.set_up} set up, {counts.forked} forked")
    rate = stats.new / elapsed * 60 if elapsed > 0 else 0.0
    table.add_row("wall time", f"{elapsed:.1f} s ({rate:.1f} episodes/min)")
    console.print(table)
    if summary.exit_reasons:
        reasons = Table(title="exit reasons")
        for column in ("exit reason", "episodes", "share"):
            reasons.add_column(column, justify="left" if column == "exit reason" else "right")
        for reason, count in summary.exit_reasons.items():
            reasons.add_row(reason, str(count), _pct(count / summary.episodes))
        console.print(reasons)
    if summary.mean_timings_s:
        split = Table(title="mean time per episode")
        for column in ("phase", "seconds", "share of total"):
            split.add_column(column, justify="left" if column == "phase" else "right")
        whole = summary.mean_timings_s.get("total") or 0.0
        for phase, seconds in summary.mean_timings_s.items():
            inside = whole and phase not in ("queue", "total")
            share = _pct(seconds / whole) if inside else ""
            label = {
                "queue": "queue (before the episode)",
                "model": "  model (in agent)",
                "tools": "  tools (in agent)",
            }.get(phase, phase)
            split.add_row(label, f"{seconds:.2f}", share)
        console.print(split)


@click.command("report")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the page (default: DIRECTORY/report.html).",
)
def report_command(directory: Path, output: Path | None) -> None:
    """Rebuild report.html of a `sandlot rollout` output directory from its trajectories (with
    the audit flags of `sandlot audit`; those that read the instances when the dataset that
    summary.json names is found)."""
    source = directory / TRAJECTORIES_FILE
    if not source.is_file():
        raise click.ClickException(f"{directory} has no {TRAJECTORIES_FILE}")
    dest = output or directory / REPORT_FILE
    meta = report_meta(directory)
    title = f"sandlot rollout: {meta['model']}" if "model" in meta else "sandlot rollout"
    dataset = run_dataset(directory)
    try:
        instances = instances_by_id(dataset)
    except (ValueError, OSError, ImportError) as exc:
        click.echo(f"the audit flags that read the instances are left out: {exc}", err=True)
        instances = {}
    try:
        count = write_report(source, dest, title=title, meta=meta, instances=instances)
    except (RolloutError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{count} episode(s); report: {dest}")
