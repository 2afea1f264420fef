"""The audit of a rollout directory: every episode's flags, counted per rule and per instance,
written as ``audit.json``.

A directory is a ``sandlot rollout`` output (its ``trajectories.jsonl``: the latest trajectory
of each episode) or one where training keeps its trajectories (``trajectories.<host>.<pid>.jsonl``
files, :mod:`sandlot.rollout.dump`: every line is an episode, for training samples an instance
again and again).

The rules that read the instance (its base commit, graded artefacts, patches) need the run's
dataset: ``--dataset``, else the ``dataset`` that ``summary.json`` records (as given to
``sandlot rollout``: absolute, or relative to where it ran, else to the run directory's
parent). Without it those rules are listed as unchecked, never silently passed.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, Field

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import iter_instances
from sandlot.rollout.audit.check import EpisodeAudit, audit_episode
from sandlot.rollout.audit.rules import RULES, Rule
from sandlot.rollout.dump import DUMP_GLOB
from sandlot.rollout.store import TRAJECTORIES_FILE, atomic_write, iter_trajectories
from sandlot.rollout.trajectory import Trajectory

AUDIT_FILE = "audit.json"


class RuleCount(BaseModel):
    """How often one rule fired: episodes it flagged and flags in all."""

    episodes: int = 0
    flags: int = 0


class AuditReport(BaseModel):
    """The audit of one run.

    Attributes:
        trajectories: the files audited (comma-separated).
        dataset: where the instances came from (``None``: not found).
        episodes / flagged_episodes: how many were audited, and flagged by any rule.
        per_rule: every rule of the table, with its counts (zero included).
        per_instance: instance id -> rule -> episodes flagged (flagged instances only).
        unchecked: rules not applied to some episodes (their instance unknown) -> episodes.
        audits: each episode's flags, sorted by instance id and sample.
    """

    trajectories: str
    dataset: str | None = None
    episodes: int = 0
    flagged_episodes: int = 0
    per_rule: dict[str, RuleCount] = Field(default_factory=dict)
    per_instance: dict[str, dict[str, int]] = Field(default_factory=dict)
    unchecked: dict[str, int] = Field(default_factory=dict)
    audits: list[EpisodeAudit] = Field(default_factory=list)


def audit_trajectories(
    trajectories: Iterable[Trajectory],
    instances: Mapping[str, Instance],
    *,
    rules: Iterable[Rule] = RULES,
    source: str = "",
    dataset: str | None = None,
) -> AuditReport:
    """Audit ``trajectories`` (one per episode) against their ``instances`` (by id; a
    missing one leaves its episode's instance rules unchecked)."""
    table = list(rules)
    report = AuditReport(
        trajectories=source, dataset=dataset, per_rule={r.name: RuleCount() for r in table}
    )
    per_instance: dict[str, Counter[str]] = defaultdict(Counter)
    unchecked: Counter[str] = Counter()
    for traj in trajectories:
        audit = audit_episode(traj, instances.get(traj.instance_id), table)
        report.audits.append(audit)
        report.episodes += 1
        report.flagged_episodes += bool(audit.flags)
        unchecked.update(audit.unchecked)
        for flag in audit.flags:
            report.per_rule[flag.rule].flags += 1
        for name in audit.rules:
            report.per_rule[name].episodes += 1
            per_instance[audit.instance_id][name] += 1
    report.audits.sort(key=lambda a: (a.instance_id, a.sample))
    report.per_instance = {iid: dict(per_instance[iid]) for iid in sorted(per_instance)}
    report.unchecked = dict(unchecked)
    return report


def run_dataset(run_dir: str | os.PathLike[str]) -> Path | None:
    """The dataset ``summary.json`` of ``run_dir`` records, if that path exists (as given,
    then relative to the run directory's parent)."""
    directory = Path(run_dir)
    try:
        run = json.loads((directory / "summary.json").read_text(encoding="utf-8"))["run"]
        recorded = Path(run["dataset"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for candidate in (recorded, directory.parent / recorded):
        if candidate.exists():
            return candidate
    return None


def instances_by_id(dataset: str | os.PathLike[str] | None) -> dict[str, Instance]:
    """The instances of ``dataset`` by id (``{}`` for ``None``).

    Raises:
        FileNotFoundError / DatasetError: as :func:`sandlot.datasets.loaders.iter_instances`.
    """
    if dataset is None:
        return {}
    return {i.instance_id: i for i in iter_instances(dataset)}


def run_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The trajectory files of ``run_dir``: its ``trajectories.jsonl``, else its training
    dumps (``trajectories.<host>.<pid>.jsonl``, in name order).

    Raises:
        FileNotFoundError: it has neither.
    """
    directory = Path(run_dir)
    if (directory / TRAJECTORIES_FILE).is_file():
        return [directory / TRAJECTORIES_FILE]
    dumps = sorted(p for p in directory.glob(DUMP_GLOB) if p.is_file())
    if not dumps:
        raise FileNotFoundError(
            f"{directory} has no {TRAJECTORIES_FILE} (sandlot rollout) and no {DUMP_GLOB} "
            "(sandlot train --trajectory-dir)"
        )
    return dumps


def _episodes(files: list[Path]) -> Iterator[Trajectory]:
    if len(files) == 1 and files[0].name == TRAJECTORIES_FILE:
        yield from iter_trajectories(files[0])
        return
    for file in files:
        yield from iter_trajectories(file, latest=False)


def audit_run(
    run_dir: str | os.PathLike[str], *, dataset: str | os.PathLike[str] | None = None
) -> AuditReport:
    """Audit the trajectories of ``run_dir`` (:func:`run_files`).

    Args:
        run_dir: a ``sandlot rollout`` output directory, or a training trajectory directory.
        dataset: the instances (default: :func:`run_dataset`).

    Raises:
        FileNotFoundError: no trajectories, or no such dataset.
        TrajectoryFileError: a line other than the last of a file is not a trajectory.
        DatasetError: the dataset is invalid.
    """
    files = run_files(run_dir)
    found = Path(dataset) if dataset is not None else run_dataset(run_dir)
    return audit_trajectories(
        _episodes(files),
        instances_by_id(found),
        source=", ".join(str(f) for f in files),
        dataset=str(found) if found else None,
    )


def write_audit(report: AuditReport, dest: str | os.PathLike[str]) -> None:
    """Write ``report`` as JSON to ``dest``, atomically."""
    atomic_write(dest, report.model_dump_json(indent=2) + "\n")
