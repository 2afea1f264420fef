"""``sandlot gc``: find and kill sandboxes that runs left behind (remote backends and local)."""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

import anyio
import click
from rich.console import Console
from rich.table import Table

from sandlot.cli.backend_choice import chosen_backend
from sandlot.errors import SandboxError
from sandlot.sandboxes import leaks
from sandlot.sandboxes.labels import owner as this_owner
from sandlot.sandboxes.reaper import (
    GcReport,
    get_reaper,
    kill_selected,
    reap,
    reap_leaked,
    select,
)
from sandlot.sandboxes.transport import RemoteSandbox

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """``"90"``/``"90s"``, ``"30m"``, ``"2h"``, ``"1d"`` → seconds.

    Raises:
        click.BadParameter: not a duration.
    """
    match = _DURATION.match(text.lower())
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 30m, 2h, 1d")
    return float(match[1]) * _UNITS[match[2] or "s"]


def _age(sb: RemoteSandbox, now: float) -> str:
    created = sb.created_at
    if created is None:
        return "?"
    minutes = max(0, int(now - created)) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _can_ask() -> bool:
    return sys.stdin.isatty()


def _groups(selected: list[RemoteSandbox]) -> Table:
    """What is about to be killed, one row per run and owner."""
    now = time.time()
    groups: dict[tuple[str, str], list[RemoteSandbox]] = defaultdict(list)
    for sb in selected:
        groups[(sb.run_id, sb.owner or "?")].append(sb)
    table = Table(title="to kill, by run and owner")
    for column in ("run id", "owner", "sandboxes", "oldest", "states"):
        table.add_column(column)
    for (run, who), boxes in sorted(groups.items()):
        oldest = min(boxes, key=lambda sb: sb.created_at or now)
        states = ", ".join(sorted({sb.state or "?" for sb in boxes}))
        table.add_row(run, who, str(len(boxes)), _age(oldest, now), states)
    return table


def _table(report: GcReport, dry_run: bool) -> Table:
    now = time.time()
    table = Table(title="sandboxes selected" + (" (dry run: nothing killed)" if dry_run else ""))
    for column in ("backend", "id", "run id", "owner", "age", "state", "result"):
        table.add_column(column)
    failed = {sb.id: error for sb, error in report.failed}
    killed = {sb.id for sb in report.killed}
    for sb in report.selected:
        result = "listed" if dry_run else ("killed" if sb.id in killed else failed.get(sb.id, "?"))
        table.add_row(sb.backend, sb.id, sb.run_id, sb.owner, _age(sb, now), sb.state, result)
    return table


@click.command("gc")
@click.option(
    "--backend",
    default=None,
    help="A registered backend (default: $SANDLOT_BACKEND, then $DEPLOYMENT, then local).",
)
@click.option("--run-id", default=None, help="Only sandboxes of this run (its sandlot.run_id).")
@click.option(
    "--older-than",
    default=None,
    help="Only sandboxes created at least this long ago (90s, 30m, 2h, 1d).",
)
@click.option("--all", "all_runs", is_flag=True, help="Every sandlot sandbox, of any run and age.")
@click.option(
    "--leaked",
    is_flag=True,
    help="Exactly the sandboxes whose close failed, from the leak lists (of --run-id, else of "
    "every run) in $SANDLOT_STATE_DIR/leaks; entries of gone sandboxes are removed.",
)
@click.option(
    "--any-owner",
    is_flag=True,
    help="Also other owners' sandboxes (sandlot.owner, user@host); by default only yours.",
)
@click.option("--dry-run", is_flag=True, help="List what would be killed; kill nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before killing (--older-than, --all).")
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Reaper setting, e.g. app_name=sandlot (modal), function_id=... (vefaas) or "
    "root_dir=... (local).",
)
def gc_command(
    backend: str | None,
    run_id: str | None,
    older_than: str | None,
    all_runs: bool,
    leaked: bool,
    any_owner: bool,
    dry_run: bool,
    yes: bool,
    options: tuple[str, ...],
) -> None:
    """Kill sandboxes that carry sandlot labels, e.g. those a crashed run left behind.

    Every run logs its id and appends it to ~/.local/state/sandlot/runs.jsonl
    ($SANDLOT_STATE_DIR), so `sandlot gc --run-id ID` cleans up after a crash or kill -9.
    Only your own sandboxes (label sandlot.owner = user@host) are touched unless --any-owner;
    --older-than and --all list what they select, by run and owner, and ask before killing
    (--yes skips the question; without a terminal they need it).

    A close that could not destroy its sandbox logs the command to run and adds the sandbox to
    the run's leak list, <state dir>/leaks/RUN_ID.jsonl: --leaked kills exactly those.
    """
    if not (run_id or older_than or all_runs or leaked):
        raise click.UsageError(
            "say what to collect: --run-id ID, --older-than AGE, --leaked, or --all (which "
            "also kills the sandboxes of runs still going)"
        )
    age = parse_duration(older_than) if older_than else None
    settings = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        settings[key.strip()] = value
    if leaked:
        if older_than or all_runs:
            raise click.UsageError(
                "--leaked kills exactly the listed sandboxes: drop --older-than/--all"
            )
        _collect_leaked(backend, run_id, settings, dry_run)
        return
    name = chosen_backend(backend)
    me = None if any_owner else this_owner()
    console = Console()
    try:
        reaper = get_reaper(name, **settings)
        listed = anyio.run(lambda: reap(reaper, run_id=run_id, older_than_s=age, dry_run=True))
    except (SandboxError, TypeError) as exc:
        raise click.ClickException(str(exc)) from exc
    selected = select(listed.selected, owner=me)
    others = sorted({sb.owner or "?" for sb in listed.selected} - {me}) if me else []
    if others:
        console.print(
            f"{len(listed.selected) - len(selected)} matching sandboxes of other owners left "
            f"alone ({', '.join(others)}); --any-owner includes them",
            soft_wrap=True,
        )
    if selected and not dry_run and (older_than or all_runs):
        console.print(_groups(selected))
        if not yes:
            if not _can_ask():
                raise click.UsageError(
                    f"{len(selected)} sandboxes selected: confirm with --yes (no terminal to ask)"
                )
            click.confirm(f"Kill these {len(selected)} sandboxes?", abort=True)
    report = GcReport(selected=selected)
    if not dry_run:
        report = anyio.run(lambda: kill_selected(reaper, selected))
    if report.selected:
        console.print(_table(report, dry_run))
    verb = "would kill" if dry_run else "killed"
    count = len(report.selected) if dry_run else len(report.killed)
    console.print(
        f"{name}: {len(report.selected)} selected, {verb} {count}, failed {len(report.failed)}"
    )
    for sb, error in report.failed:
        console.print(f"could not kill {sb.id}: {error}", soft_wrap=True)
    if report.failed:
        raise SystemExit(1)


def leak_note(backend: str, run_id: str) -> str | None:
    """For a run's summary: how many of its ``backend`` sandboxes could not be destroyed (the
    entries of its leak list, written by every process of the run), and the command that
    removes them; ``None`` when there are none."""
    count = sum(1 for e in leaks.read(run_id) if e.backend == backend)
    if not count:
        return None
    return (
        f"[red]{count} sandbox(es) could not be destroyed[/] and may still run (listed in "
        f"{leaks.leak_file(run_id)}); remove them with "
        f"sandlot gc --backend {backend} --leaked --run-id {run_id}"
    )


def _collect_leaked(
    backend: str | None, run_id: str | None, settings: dict[str, str], dry_run: bool
) -> None:
    """``--leaked``: per backend of the leak lists (only ``backend`` when given), kill exactly
    the listed sandboxes and forget the entries of those gone."""
    console = Console()
    entries = [e for e in leaks.read(run_id) if backend is None or e.backend == backend]
    if not entries:
        console.print("no leaked sandboxes listed" + (f" for run {run_id}" if run_id else ""))
        return
    failed = 0
    for name in sorted({e.backend for e in entries}):
        mine = [e for e in entries if e.backend == name]
        try:
            reaper = get_reaper(name, **{**mine[-1].options, **settings})
            if dry_run:
                for e in mine:
                    console.print(f"{name}: leaked {e.sandbox_id} ({e.backend_id}): {e.error}")
                continue
            report, gone = anyio.run(reap_leaked, reaper, mine)
        except (SandboxError, TypeError) as exc:
            raise click.ClickException(str(exc)) from exc
        for run in sorted({e.run_id for e in gone}):
            leaks.forget(run, {e.sandbox_id for e in gone if e.run_id == run})
        console.print(
            f"{name}: {len(mine)} leaked, killed {len(report.killed)}, already gone "
            f"{len(gone) - len(report.killed)}, failed {len(report.failed)}"
        )
        for sb, error in report.failed:
            console.print(f"could not kill {sb.id}: {error}", soft_wrap=True)
        failed += len(report.failed)
    if failed:
        raise SystemExit(1)
