"""The dataset check: a run with nothing to do is a mistake (a wrong file, a filter that
matches nothing), not a success."""

from __future__ import annotations

from pathlib import Path

from sandlot.preflight.problem import Problem


def dataset_problems(dataset: Path, count: int, what: str = "instances") -> list[Problem]:
    """A problem when ``dataset`` gave no work.

    Args:
        dataset: the ``--dataset`` path, for the message.
        count: how many instances (or rows, or predictions) the run would process.
        what: what ``count`` counts, for the message.
    """
    if count > 0:
        return []
    return [
        Problem(
            "--dataset",
            f"{dataset} gives no {what} to run",
            "check the file (and --instance-ids, --predictions: they select from it)",
        )
    ]
