"""``sandlot data selftest``: run each row's gold patch (``repeats`` times) and its unpatched
repository through :func:`~sandlot.rewards.runner.run_evaluations`, every evaluation of a row
in a fork of one set-up, and judge the row (:mod:`sandlot.rewards.selftest_reasons`).

Layout, under ``<output_dir>/<run_id>/``: the evaluations as ``sandlot eval`` writes them, one
model directory per run (``before/``, ``gold/``, ``gold-repeat-2/``...), each with its run
report, and :data:`REPORT_NAME`, the verdict on every row. Re-using ``run_id`` resumes: the
evaluations finished are loaded, the others (infrastructure errors among them) run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.rewards.evaluators import Evaluator
from sandlot.rewards.predictions import GOLD, Prediction, gold_predictions
from sandlot.rewards.result import EvalResult
from sandlot.rewards.run_report import write_json_atomic
from sandlot.rewards.runner import RunOutcome, run_evaluations
from sandlot.rewards.selftest_reasons import Reason, RowVerdict, row_verdict

BEFORE = "before"
"""The model name of the run without the fix (the empty patch, its tests run)."""

REPORT_NAME = "selftest.json"

REPORT_SCHEMA_VERSION = 1


def gold_run_names(repeats: int) -> list[str]:
    """The model names of the gold runs: ``gold``, then ``gold-repeat-2`` ... ``-<repeats>``."""
    return [GOLD] + [f"{GOLD}-repeat-{k}" for k in range(2, repeats + 1)]


@dataclass
class SelftestOutcome:
    """A finished selftest: each row's verdict (dataset order), the report and where it is."""

    verdicts: list[RowVerdict]
    report: dict[str, Any]
    report_path: Path
    outcomes: list[RunOutcome]
    """The evaluation runs: before the fix, then each gold run."""

    @property
    def kept_ids(self) -> list[str]:
        """The ids of the rows kept, in dataset order."""
        return [v.instance_id for v in self.verdicts if v.kept]

    def log_path(self, verdict: RowVerdict) -> Path | None:
        """The ``run_instance.log`` of the evaluation behind ``verdict`` (the first gold run
        of a kept row; ``None`` for a row that was not evaluated)."""
        run = verdict.run or GOLD
        for outcome in self.outcomes:
            result = outcome.results.get(verdict.instance_id)
            if result is not None and result.model_name_or_path == run:
                return outcome.log_path(result)
        return None


async def run_selftest(
    instances: Sequence[Instance],
    *,
    run_id: str,
    output_dir: Path,
    repeats: int = 1,
    backend: str | None = None,
    workers: int = 4,
    timeout: float | None = None,
    sandbox_options: BaseModel | dict[str, Any] | None = None,
    evaluator: Evaluator | None = None,
    on_result: Callable[[EvalResult], None] | None = None,
    described: dict[str, Any] | None = None,
) -> SelftestOutcome:
    """Evaluate every row without the fix and with its gold patch ``repeats`` times, judge
    each row and write the report.

    Args:
        instances: the rows.
        run_id: names the run directory; re-using it resumes.
        output_dir: root of the run directories.
        repeats: gold runs per row (>= 1); rows whose runs disagree are flaky.
        backend, workers, timeout, sandbox_options, evaluator, on_result: as
            :func:`~sandlot.rewards.runner.run_evaluations`'s.
        described: more keys for the report (the dataset, the backend).

    Returns:
        The verdicts and the report (``REPORT_NAME`` in the run directory, written also when
        the run is interrupted, the rows not evaluated then counted as infrastructure errors).

    Raises:
        ValueError: ``repeats`` or ``workers`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    before = {
        i.instance_id: Prediction(
            instance_id=i.instance_id, model_name_or_path=BEFORE, model_patch=""
        )
        for i in instances
    }
    golds = [
        {
            k: p.model_copy(update={"model_name_or_path": name})
            for k, p in gold_predictions(instances).items()
        }
        for name in gold_run_names(repeats)
    ]
    outcomes: list[RunOutcome] = []
    try:
        outcomes = await run_evaluations(
            instances,
            [before, *golds],
            run_id=run_id,
            output_dir=output_dir,
            backend=backend,
            workers=workers,
            timeout=timeout,
            sandbox_options=sandbox_options,
            on_result=on_result,
            test_empty=True,
            evaluator=evaluator,
        )
    finally:
        outcome = _judge(instances, outcomes, output_dir / run_id / REPORT_NAME, described or {})
    return outcome


def _judge(
    instances: Sequence[Instance],
    outcomes: list[RunOutcome],
    path: Path,
    described: dict[str, Any],
) -> SelftestOutcome:
    results = [o.results for o in outcomes] or [{}]
    verdicts = []
    for inst in instances:
        first, *rest = (r.get(inst.instance_id) for r in results)
        verdicts.append(row_verdict(inst, first, rest if outcomes else [None]))
    outcome = SelftestOutcome(verdicts=verdicts, report={}, report_path=path, outcomes=outcomes)
    outcome.report = selftest_report(outcome, described)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, outcome.report)
    return outcome


def selftest_report(outcome: SelftestOutcome, described: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: counts, the kept ids, the bad rows by reason, the rows to re-run,
    and every row's verdict with its log."""
    verdicts = outcome.verdicts
    bad = [v for v in verdicts if v.reason is not None and v.reason.bad]
    rerun = [v for v in verdicts if v.reason is Reason.INFRASTRUCTURE]
    rows = []
    for v in verdicts:
        log = outcome.log_path(v)
        rows.append({**v.model_dump(mode="json"), "log": str(log) if log else None})
    return {
        **described,
        "total_rows": len(verdicts),
        "kept_rows": len(verdicts) - len(bad) - len(rerun),
        "bad_rows": len(bad),
        "infrastructure_errors": len(rerun),
        "reasons": dict(Counter(v.reason.value for v in verdicts if v.reason is not None)),
        "kept_ids": outcome.kept_ids,
        "bad_ids": sorted(v.instance_id for v in bad),
        "rerun_ids": sorted(v.instance_id for v in rerun),
        "rows": rows,
        "schema_version": REPORT_SCHEMA_VERSION,
    }
