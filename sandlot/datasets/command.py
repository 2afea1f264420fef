"""The command line of one preprocessor: ``python -m sandlot.datasets.<name>`` and
``sandlot data prepare <name>`` run the same click command, built here from its
:class:`~sandlot.datasets.prepare.Preprocessor`.

It lives in ``datasets/`` so the ``python -m`` entry points need nothing from ``sandlot.cli``.
The backend is chosen as every command's (:func:`~sandlot.sandboxes.registry.choose_backend`):
``--backend`` (alias ``--deployment``), else ``$SANDLOT_BACKEND``, else ``$DEPLOYMENT``, else
``docker`` (real SWE rows run in their per-instance images; there is no config file); the
command says which one it chose and where from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import click
from rich.console import Console
from rich.table import Table

from sandlot.datasets.images import DEFAULT_ROW_BACKEND, ImageBackend
from sandlot.datasets.local import REPO_MIRROR_ENV
from sandlot.datasets.prepare import PrepareOptions, Preprocessor, prepare
from sandlot.datasets.prompts import PromptTemplate, load_prompt_template
from sandlot.datasets.rows import DEFAULT_AGENT_NAME
from sandlot.datasets.validate import ValidationReport
from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes.images import load_image_overrides
from sandlot.sandboxes.registry import BackendChoice, choose_backend


class _EnvironmentBackendError(click.ClickException):
    """An unknown backend named by ``$SANDLOT_BACKEND`` or ``$DEPLOYMENT``: one ``Error:``
    line, and exit 2 (bad input) as for a bad ``--backend``."""

    exit_code = 2


def _backend_option(pre: Preprocessor) -> Any:
    """``--backend``/``--deployment``, else the environment (as every command), checked
    against the backends ``pre`` supports; its value is the :class:`BackendChoice`."""

    def resolve(ctx: click.Context, param: click.Parameter, value: str | None) -> BackendChoice:
        try:
            choice = choose_backend(value, given_by="--backend", default=DEFAULT_ROW_BACKEND)
        except BackendNotFoundError as exc:
            if not value:
                # Not the flag's value: "Invalid value for --backend" would hide the culprit.
                raise _EnvironmentBackendError(str(exc)) from None
            raise click.BadParameter(str(exc)) from None
        if choice.name not in pre.backends:
            raise click.BadParameter(
                f"{pre.name} cannot be prepared for {choice.name!r} (from {choice.source}); "
                f"supported: {', '.join(pre.backends)}"
            )
        return choice

    default = f"; default {DEFAULT_ROW_BACKEND}" if DEFAULT_ROW_BACKEND in pre.backends else ""
    return click.option(
        "--backend",
        "--deployment",
        "backend",
        default=None,
        callback=resolve,
        help=f"Where the rows run (image naming): {' | '.join(pre.backends)} "
        f"[env SANDLOT_BACKEND, then DEPLOYMENT{default}].",
    )


def prepare_command(pre: Preprocessor) -> click.Command:
    """The click command that prepares ``pre`` (its options are those of
    :class:`~sandlot.datasets.prepare.PrepareOptions`)."""

    @click.command(
        pre.name,
        context_settings={"help_option_names": ["-h", "--help"]},
        help=f"Convert {pre.hf_id} (or --input) into <local-save-dir>/"
        f"{pre.output_stem}_<backend>.parquet ({{split}} is --split). The source schema, "
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
        help=f"A local .jsonl/.json/.parquet file of source rows, a swebench 5.x task "
        f"repository (a directory with tasks/), or a Hugging Face dataset id "
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
    @_backend_option(pre)
    @click.option(
        "--repo-mirror",
        envvar=REPO_MIRROR_ENV,
        default=None,
        help="Directory of git mirrors for local rows, named <owner>__<name> or "
        f"<owner>__<name>.git (git clone --mirror) [env {REPO_MIRROR_ENV}].",
    )
    @click.option(
        "--local-images",
        is_flag=True,
        help="local rows run the images docker rows name (pulled by the local backend, no "
        "daemon; see docs/images.md) instead of the host with a repository mirror.",
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
    @click.option(
        "--skip-invalid",
        is_flag=True,
        help="Leave invalid rows out and list them in <output>.rejected.jsonl "
        "[default: stop at the first].",
    )
    def command(
        local_save_dir: Path,
        input_: str | None,
        split: str,
        max_instances: int | None,
        seed: int | None,
        backend: BackendChoice,
        repo_mirror: str | None,
        local_images: bool,
        prompt_template: Path | None,
        image_overrides: Path | None,
        agent_name: str,
        skip_invalid: bool,
    ) -> None:
        console = Console(stderr=True)
        try:
            options = PrepareOptions(
                local_save_dir=local_save_dir,
                backend=cast(ImageBackend, backend.name),  # one of pre.backends: _backend_option
                input=input_,
                split=split,
                max_instances=max_instances,
                seed=seed,
                template=load_prompt_template(prompt_template)
                if prompt_template
                else PromptTemplate(),
                image_overrides=load_image_overrides(image_overrides) if image_overrides else {},
                repo_mirror=repo_mirror,
                local_images=local_images,
                agent_name=agent_name,
                skip_invalid=skip_invalid,
            )
            console.print(
                f"[bold]sandlot data prepare[/] {pre.name}: {input_ or pre.hf_id} → "
                f"backend [cyan]{backend.name}[/]"
            )
            hint = f"; choose with --backend: {', '.join(pre.backends)}"
            click.echo(f"{backend}{hint if backend.defaulted else ''}", err=True)
            result = prepare(pre, options)
        except (OSError, ValueError, ImportError) as exc:
            raise click.ClickException(str(exc)) from None
        print_summary(console, result.report)
        if result.rejected_path is not None:
            click.echo(
                f"skipped {len(result.rejected)} invalid rows, listed in {result.rejected_path}; "
                f"first: {result.rejected[0]}",
                err=True,
            )
        click.echo(f"wrote {result.rows} rows to {result.path}")

    return command


def run_preprocessor(pre: Preprocessor) -> None:
    """Entry point of ``python -m sandlot.datasets.<name>``."""
    prepare_command(pre).main(prog_name=f"python -m sandlot.datasets.{pre.name}")


def print_summary(console: Console, report: ValidationReport) -> None:
    table = Table(title=f"{report.path.name}", show_header=False)

    def top(counter: Any, n: int = 3) -> str:
        shown = ", ".join(f"{k} ({v})" for k, v in counter.most_common(n))
        return f"{len(counter)}: {shown}" + (" ..." if len(counter) > n else "")

    table.add_row("rows", str(report.rows))
    table.add_row("repos", top(report.repos))
    table.add_row("images", top(report.images, 2))
    table.add_row("backends", top(report.backends))
    table.add_row("data sources", top(report.data_sources))
    table.add_row("agent names", top(report.agent_names))
    table.add_row("extra columns (kept)", ", ".join(report.extra_columns) or "none")
    console.print(table)
