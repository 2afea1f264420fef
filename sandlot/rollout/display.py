"""The live view of a rollout in the terminal (or one line per episode where there is none)."""

from __future__ import annotations

import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from sandlot.rollout.stats import RolloutStats
from sandlot.rollout.trajectory import Trajectory


class LiveDisplay:
    """The live view of a rollout: progress, running / starting / queued, sandboxes alive,
    resolved rate, mean turns, errors. On a terminal a ``rich.live.Live`` panel; elsewhere
    (CI logs, pipes) one line per finished episode.

    Args:
        stats: the counters to show (updated by :func:`~sandlot.rollout.scheduler.run_rollout`).
        console: where to draw.
        title: the first line.
    """

    def __init__(self, stats: RolloutStats, console: Console, title: str = "rollout") -> None:
        self.stats = stats
        self.console = console
        self.title = title
        self._live: Live | None = None

    def __enter__(self) -> LiveDisplay:
        if self.console.is_terminal:
            self._live = Live(
                console=self.console,
                get_renderable=self.render,
                refresh_per_second=4,
                transient=False,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def finished(self, traj: Trajectory) -> None:
        """Report one finished episode (a line when not drawing a live panel)."""
        if self._live is not None:
            return
        s = self.stats
        verdict = "resolved" if traj.resolved else (traj.eval.status.value if traj.eval else "-")
        error = f" error: {traj.error.splitlines()[0][:160]}" if traj.error else ""
        self.console.print(
            f"[{s.done}/{s.total}] {traj.instance_id}#{traj.sample}: {traj.exit_reason.value}, "
            f"{verdict}, {traj.num_turns} turns, {traj.timings_s.get('total', 0.0):.1f} s"
            f"{error}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def render(self) -> RenderableType:
        s = self.stats
        elapsed = time.monotonic() - s.started_at
        rate = s.new / elapsed * 60 if elapsed > 0 else 0.0
        resolved = f"{s.resolved}/{s.done} ({s.resolved / s.done:.0%})" if s.done else "-"
        mean_turns = f"{s.turns / s.done:.1f}" if s.done else "-"
        grid = Table.grid(padding=(0, 2))
        grid.add_row(
            f"[bold]{self.title}[/]",
            ProgressBar(total=max(s.total, 1), completed=s.done, width=40),
            f"{s.done}/{s.total} done",
            f"{int(elapsed // 60)}:{int(elapsed % 60):02d}",
            f"{rate:.1f} ep/min",
        )
        line = Table.grid(padding=(0, 3))
        line.add_row(
            f"running [cyan]{s.running}[/]",
            f"starting [cyan]{s.starting}[/]",
            f"queued {s.queued}",
            f"sandboxes alive [cyan]{s.alive}[/]",
            f"resolved [green]{resolved}[/]",
            f"mean turns {mean_turns}",
            f"errors [red]{s.errors}[/]" if s.errors else "errors 0",
            f"retries {s.retries}",
        )
        return Group(grid, line)
