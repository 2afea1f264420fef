"""The preflight of ``sandlot eval`` and ``sandlot rollout`` (and of any command that runs
many sandboxes): what is known before the first sandbox starts, reported before it.

A problem that would fail every instance (credentials, an unreachable control plane, engine,
registry or model server, ``image: host`` on a container backend, an output directory that
cannot be written) is otherwise found once per instance, after minutes of
retries, or after the first result. The preflight looks once: each check is cheap (seconds;
one request per distinct image, one to the model server), each problem is reported once as
one ``Error:`` line with its fix, and the command exits with :data:`EXIT_CODE` (2, click's code
for bad input) after printing them all. ``--no-preflight`` skips it.

An empty dataset is refused by the commands as they load it, with or without the preflight.

One check per module: ``output``, ``credentials`` (the backend), ``images``,
``endpoint``; ``checks.run_problems`` runs them in order; ``sandlot train --preflight``
(:mod:`sandlot.trainer.preflight`) is the training run's counterpart, which also starts one
sandbox.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from sandlot.preflight.checks import Endpoint, run_problems
from sandlot.preflight.problem import Problem

EXIT_CODE = 2
"""The exit status of a run the preflight stopped (click's status for a usage error)."""

F = TypeVar("F", bound=Callable[..., Any])


def no_preflight_option(command: F) -> F:
    """The ``--no-preflight`` flag of a command (its parameter is ``no_preflight``)."""
    return click.option(
        "--no-preflight",
        is_flag=True,
        help="Skip the checks made before the run (backend credentials, images, output "
        "directory, model server); each problem found is one Error: line, exit 2.",
    )(command)


def exit_on(problems: Sequence[Problem]) -> None:
    """Print each problem as one ``Error:`` line on stderr and exit with :data:`EXIT_CODE`;
    return when there is none.

    Raises:
        SystemExit: there were problems.
    """
    if not problems:
        return
    for problem in problems:
        click.echo(f"Error: {problem.line()}", err=True)
    raise SystemExit(EXIT_CODE)


__all__ = ["EXIT_CODE", "Endpoint", "Problem", "exit_on", "no_preflight_option", "run_problems"]
