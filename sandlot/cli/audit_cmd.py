"""``sandlot audit RUN_DIR``: flag the episodes of a rollout that cheat (docs/audit.md)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sandlot.cli.exit_codes import InputError, OutputError
from sandlot.rollout.audit import AUDIT_FILE, RULES, AuditReport, audit_run
from sandlot.rollout.audit.run import write_audit
from sandlot.rollout.errors import RolloutError

_SHOWN_COMMAND_CHARS = 120


@click.command("audit")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--dataset",
    default=None,
    type=click.Path(exists=True, path_type=Path),
    help="The run's instances (default: the dataset its summary.json records).",
)
@click.option(
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Where to write the JSON report (default: RUN_DIR/{AUDIT_FILE}).",
)
def audit_command(run_dir: Path, dataset: Path | None, output: Path | None) -> None:
    """Flag the episodes of a `sandlot rollout` output directory (or of the trajectories
    `sandlot train --trajectory-dir` keeps) that look for git history,
    read graded files, try the network, edit test infrastructure, leave processes behind or
    trip the grader's integrity checks; each flag with its turn and command.

    Prints a table per rule and per instance and writes a JSON report. Exit status: 0 (flags
    are findings, not failures), 2 bad input, 4 the report could not be written.
    """
    try:
        report = audit_run(run_dir, dataset=dataset)
    except (
        RolloutError,
        ValueError,
        ImportError,
        FileNotFoundError,
    ) as exc:  # DatasetError is a ValueError
        raise InputError(str(exc)) from None
    dest = output or run_dir / AUDIT_FILE
    try:
        write_audit(report, dest)
    except OSError as exc:
        raise OutputError(f"cannot write {dest}: {exc}") from None
    console = Console(stderr=True)
    _print(console, report)
    click.echo(f"{report.flagged_episodes}/{report.episodes} episode(s) flagged; report: {dest}")


def _print(console: Console, report: AuditReport) -> None:
    if report.dataset is None:
        console.print(
            "[yellow]no dataset[/] (pass --dataset): the rules that read the instance were "
            f"not checked ({', '.join(report.unchecked) or 'none'})"
        )
    rules = Table(title=f"sandlot audit: {report.episodes} episode(s)")
    for column in ("rule", "episodes", "flags", "what it means"):
        rules.add_column(column, justify="right" if column in ("episodes", "flags") else "left")
    for rule in RULES:
        count = report.per_rule.get(rule.name)
        if count is None:
            continue
        style = "bold red" if count.episodes else ""
        rules.add_row(rule.name, str(count.episodes), str(count.flags), rule.summary, style=style)
    console.print(rules)
    if report.per_instance:
        names = [r.name for r in RULES if report.per_rule[r.name].episodes]
        table = Table(title="flagged episodes per instance")
        table.add_column("instance")
        for name in names:
            table.add_column(name, justify="right")
        for iid, counts in report.per_instance.items():
            table.add_row(escape(iid), *(str(counts.get(n, "")) for n in names))
        console.print(table)
    for audit in report.audits:
        if not audit.flags:
            continue
        console.print(f"[bold]{escape(audit.instance_id)}[/] #{audit.sample}")
        for flag in audit.flags:
            where = f"turn {flag.turn}" if flag.turn is not None else "grader"
            command = (flag.command or "").replace("\n", " ")
            if len(command) > _SHOWN_COMMAND_CHARS:
                command = command[: _SHOWN_COMMAND_CHARS - 3] + "..."
            shown = f": [dim]{escape(command)}[/]" if command else ""
            console.print(
                f"  [red]{flag.rule}[/] {where}{shown}\n    {escape(flag.detail)}",
                soft_wrap=True,
            )
