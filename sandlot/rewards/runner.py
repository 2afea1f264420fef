"""Evaluate many predictions (of one or several files) concurrently, write SWE-bench style
logs and reports, resume runs.

Layout (the harness's ``logs/run_evaluation`` layout under ``output_dir``)::

    <output_dir>/<run_id>/<model>/<instance_id>/{patch.diff, eval.sh, test_output.txt,
                                                 report.json, result.json, run_instance.log}
    <output_dir>/<run_id>/<model>.<run_id>.json        # the run report

``report.json`` exists only for completed evaluations and is written last, atomically, so a
re-run with the same ``run_id`` skips those and retries errors. A finished instance counts only
while its ``patch.diff`` is the prediction's ``model_patch``: a changed patch under the same run
id and model is evaluated again, and a ``report.json`` or ``result.json`` that does not parse
(a truncated file of an older version) is not finished.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from sandlot.datasets.instance import Instance
from sandlot.datasets.swebench_specs import resolve_test_cmd
from sandlot.rewards.evaluators import Evaluator, InProcessEvaluator
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalResult
from sandlot.rewards.run_report import (
    instance_report,
    run_report,
    write_json_atomic,
    write_text_atomic,
)
from sandlot.rewards.scripts import END_TEST_OUTPUT, START_TEST_OUTPUT, eval_script, patch_files

REPORT_FILE = "report.json"
RESULT_FILE = "result.json"
PATCH_FILE = "patch.diff"
LOG_FILE = "run_instance.log"


def model_dir_name(model_name_or_path: str) -> str:
    """The harness's directory name for a model (``/`` → ``__``)."""
    return (model_name_or_path or "unknown").replace("/", "__")


@dataclass
class RunOutcome:
    """What a run produced: the run report, every result, and where the report was written."""

    report: dict[str, Any]
    results: dict[str, EvalResult]
    report_path: Path
    resumed: list[str] = field(default_factory=list)
    set_ups: int | None = None
    """Sandboxes set up by the call when prediction sets shared set-ups (``None``: each
    evaluation set up its own)."""

    def log_path(self, result: EvalResult) -> Path:
        """The ``run_instance.log`` of ``result`` (beside this run's report)."""
        model = model_dir_name(result.model_name_or_path)
        return self.report_path.parent / model / result.instance_id / LOG_FILE


def _instance_dir(output_dir: Path, run_id: str, pred: Prediction) -> Path:
    return output_dir / run_id / model_dir_name(pred.model_name_or_path) / pred.instance_id


def _load_previous(directory: Path, pred: Prediction) -> EvalResult | None:
    """The finished result of ``pred`` in ``directory``, or ``None`` (evaluate it again)."""
    try:
        json.loads((directory / REPORT_FILE).read_text(encoding="utf-8"))
        patch = (directory / PATCH_FILE).read_bytes().decode("utf-8")  # "\r\n" kept
        result = EvalResult.model_validate_json((directory / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None  # not finished, or a file cut short by a killed run or a full disk
    return result if patch == (pred.model_patch or "") else None


def _write_artifacts(
    directory: Path, instance: Instance, pred: Prediction, result: EvalResult
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # An earlier verdict (of another patch) stops counting before anything else changes.
    (directory / REPORT_FILE).unlink(missing_ok=True)
    (directory / PATCH_FILE).write_text(pred.model_patch or "", encoding="utf-8")
    try:
        script = eval_script(
            workdir=instance.workdir,
            base_commit=instance.base_commit,
            test_files=patch_files(instance.test_patch),
            test_cmd=resolve_test_cmd(instance),
        )
        (directory / "eval.sh").write_text(script)
    except ValueError:
        pass  # no test command can be derived; result.error already says so
    if result.log or result.status.completed:
        (directory / "test_output.txt").write_text(
            f"{START_TEST_OUTPUT}\n{result.log}\n{END_TEST_OUTPUT}\n"
            if not result.tests_timed_out
            else f"{START_TEST_OUTPUT}\n{result.log}\n>>>>> Tests Timed Out\n"
        )
    lines = [f"instance_id: {result.instance_id}", f"status: {result.status.value}"]
    if result.patch_apply_command:
        lines.append(f"patch applied with: {result.patch_apply_command}")
    lines.append(f"tests_exit_code: {result.tests_exit_code}")
    lines += [f"reverted: {f.path} ({f.reason})" for f in result.reverted_files]
    lines.append("integrity: " + result.integrity.model_dump_json())
    lines += [f"warning: {w}" for w in result.log_warnings]
    lines.append("timings_s: " + json.dumps({k: round(v, 3) for k, v in result.timings_s.items()}))
    if result.error:
        lines.append(f"error: {result.error}")
    (directory / LOG_FILE).write_text("\n".join(lines) + "\n")
    write_text_atomic(directory / RESULT_FILE, result.model_dump_json(indent=2, exclude={"log"}))
    if result.status.completed:
        # Written last: its presence marks the instance as done for resumed runs.
        write_json_atomic(directory / REPORT_FILE, instance_report(result, pred))


async def run_evaluation(
    instances: Sequence[Instance], predictions: dict[str, Prediction], **keywords: Any
) -> RunOutcome:
    """:func:`run_evaluations` of one prediction set (its keywords); its outcome."""
    (outcome,) = await run_evaluations(instances, [predictions], **keywords)
    return outcome


async def run_evaluations(
    instances: Sequence[Instance],
    prediction_sets: Sequence[dict[str, Prediction]],
    *,
    run_id: str,
    output_dir: Path,
    backend: str | None = None,
    workers: int = 4,
    timeout: float | None = None,
    sandbox_options: BaseModel | dict[str, Any] | None = None,
    on_result: Callable[[EvalResult], None] | None = None,
    test_empty: bool = False,
    evaluator: Evaluator | None = None,
) -> list[RunOutcome]:
    """Evaluate each prediction set (file) on ``instances``, ``workers`` evaluations at a time
    in all, writing as results come, each set with its own run report. An instance that
    several sets evaluate is set up once for all of them
    (:class:`~sandlot.sandboxes.setups.cache.SetupCache`: every evaluation runs in a fork of
    the clean set-up; a snapshot that fails falls back to one set-up per evaluation).

    Args:
        instances: the dataset (already filtered to the instances to run).
        prediction_sets: each ``instance_id`` → ``Prediction``; instances without one are
            "incomplete" in that set's report.
        run_id: names the run directory; re-using it skips instances with a ``report.json``.
        output_dir: root of the logs (``<output_dir>/<run_id>/...``).
        backend: sandbox backend name.
        workers: evaluations running at once (>= 1).
        timeout: seconds for each test command, overriding each instance's ``eval_timeout``.
        sandbox_options: backend-specific options.
        on_result: called after each instance finishes (progress display).
        test_empty: run the tests for empty patches too (``sandlot data selftest``'s run
            before the fix; see :func:`~sandlot.rewards.evaluation.evaluate`).
        evaluator: where the evaluations run, entered by the caller (e.g.
            :class:`~sandlot.rewards.ray_evaluator.RayEvaluator`); ``backend``, ``timeout``
            and ``sandbox_options`` are then its own. Default: this process.

    Returns:
        One :class:`RunOutcome` per set, in order (its run report with SWE-bench keys, every
        result, the report's path); ``set_ups`` counts the set-ups of the call when sets
        shared them.

    Raises:
        ValueError: ``workers`` < 1, or two sets name the same model (their logs and reports
            would overwrite each other).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    models = [{p.model_name_or_path for p in preds.values()} for preds in prediction_sets]
    for i, j in itertools.combinations(range(len(models)), 2):
        if common := models[i] & models[j]:
            raise ValueError(
                f"prediction sets {i + 1} and {j + 1} both name model {sorted(common)[0]!r}: "
                "their logs and reports would overwrite each other; give each file its own "
                "model_name_or_path"
            )
    plans = [_plan(instances, preds, output_dir, run_id, on_result) for preds in prediction_sets]
    # The evaluations that open a sandbox (an empty patch is graded without one).
    group_sizes = Counter(
        inst.instance_id
        for plan in plans
        for inst, pred in plan.todo
        if test_empty or (pred.model_patch and pred.model_patch.strip())
    )
    limiter = anyio.CapacityLimiter(workers)

    async def one(plan: _Plan, inst: Instance, pred: Prediction, runs: Evaluator) -> None:
        async with limiter:
            result = await runs.evaluate(
                inst, pred, group_size=group_sizes[inst.instance_id], test_empty=test_empty
            )
        directory = _instance_dir(output_dir, run_id, pred)
        await anyio.to_thread.run_sync(_write_artifacts, directory, inst, pred, result)
        plan.results[inst.instance_id] = result
        if on_result:
            on_result(result)

    jobs = _scheduled(
        [(plan, inst, pred) for plan in plans for inst, pred in plan.todo], instances, workers
    )
    set_ups: int | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            runs: Evaluator
            if evaluator is not None:
                runs = evaluator
            else:
                runs = await stack.enter_async_context(
                    InProcessEvaluator(
                        backend=backend,
                        timeout=timeout,
                        sandbox_options=sandbox_options,
                        share_setups=any(n > 1 for n in group_sizes.values()),
                    )
                )
            async with anyio.create_task_group() as tg:
                for plan, inst, pred in jobs:
                    tg.start_soon(one, plan, inst, pred, runs)
            set_ups = await runs.set_ups()
    finally:
        # Also on Ctrl-C: the reports then cover what finished, and a re-run resumes the rest.
        outcomes = [
            plan.write(instances, preds, output_dir, run_id, set_ups)
            for plan, preds in zip(plans, prediction_sets, strict=True)
        ]
    return outcomes


def _scheduled(
    jobs: list[tuple[_Plan, Instance, Prediction]], instances: Sequence[Instance], workers: int
) -> list[tuple[_Plan, Instance, Prediction]]:
    """The order to start ``jobs`` in: instance by instance, so the evaluations of one instance
    run near in time (its snapshot is deleted once the last of them opened), but an instance's
    ``k``-th evaluation ``k * workers`` places after its first, so that it does not hold a
    worker idle while the set-up it forks from is still running (the first evaluations of the
    next instances set up meanwhile)."""
    order = {inst.instance_id: k for k, inst in enumerate(instances)}
    seen: Counter[str] = Counter()
    keyed = []
    for job in jobs:
        iid = job[1].instance_id
        k = seen[iid]
        seen[iid] += 1
        keyed.append(((order[iid] + k * workers, k), job))
    keyed.sort(key=lambda item: item[0])  # stable: the sets' order within a key
    return [job for _, job in keyed]


@dataclass
class _Plan:
    """One prediction set's run: results so far (resumed ones included) and what is left."""

    results: dict[str, EvalResult] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)
    todo: list[tuple[Instance, Prediction]] = field(default_factory=list)

    def write(
        self,
        instances: Sequence[Instance],
        predictions: dict[str, Prediction],
        output_dir: Path,
        run_id: str,
        set_ups: int | None,
    ) -> RunOutcome:
        """Write the run report; the outcome."""
        first = next(iter(predictions.values())).model_name_or_path if predictions else "none"
        report_path = output_dir / run_id / f"{model_dir_name(first)}.{run_id}.json"
        report = run_report([i.instance_id for i in instances], predictions, self.results)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(report_path, report)
        return RunOutcome(
            report=report,
            results=self.results,
            report_path=report_path,
            resumed=self.resumed,
            set_ups=set_ups,
        )


def _plan(
    instances: Sequence[Instance],
    predictions: dict[str, Prediction],
    output_dir: Path,
    run_id: str,
    on_result: Callable[[EvalResult], None] | None,
) -> _Plan:
    """The instances with a prediction: finished in an earlier run with ``run_id`` (loaded)
    or still to evaluate."""
    plan = _Plan()
    for inst in instances:
        pred = predictions.get(inst.instance_id)
        if pred is None:
            continue
        previous = _load_previous(_instance_dir(output_dir, run_id, pred), pred)
        if previous is not None:
            plan.results[inst.instance_id] = previous
            plan.resumed.append(inst.instance_id)
            if on_result:
                on_result(previous)
        else:
            plan.todo.append((inst, pred))
    return plan
