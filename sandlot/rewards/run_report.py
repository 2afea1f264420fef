"""Reports in the SWE-bench harness formats.

Per instance: ``report.json`` = ``{instance_id: {patch_is_None, patch_exists,
patch_successfully_applied, resolved, tests_status}}`` as
``swebench.harness.grading.get_eval_report`` writes it, plus sandlot's own keys
(``status``, ``tests_exit_code``, ``reverted_files``, ``integrity``, ...). Per run: the keys of
``swebench.harness.reporting.make_run_report`` (schema_version 2), plus ``integrity``: how
many completed instances each defence against forged results triggered on (see
:func:`integrity_counts`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import ChannelState, EvalResult

RUN_REPORT_SCHEMA_VERSION = 2


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file in the same directory,
    flushed to disk, then renamed over ``path``. A full disk or a crash leaves the previous
    content (or no file), never a truncated one, so a report that exists is a finished one.

    Raises:
        OSError: the directory is not writable, or the disk is full (the temporary file is
            removed).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide reports from the user's group
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """:func:`write_text_atomic` of ``data`` as indented JSON with a final newline."""
    write_text_atomic(path, json.dumps(data, indent=4) + "\n")


def instance_report(result: EvalResult, prediction: Prediction) -> dict[str, Any]:
    """The per-instance ``report.json`` content for a completed evaluation."""
    return {
        result.instance_id: {
            "patch_is_None": prediction.model_patch is None,
            "patch_exists": bool(prediction.model_patch),
            "patch_successfully_applied": result.patch_applied,
            "resolved": result.resolved,
            "tests_status": {
                "FAIL_TO_PASS": result.FAIL_TO_PASS.model_dump(),
                "PASS_TO_PASS": result.PASS_TO_PASS.model_dump(),
                "FAIL_TO_FAIL": {"success": [], "failure": []},
                "PASS_TO_FAIL": {"success": [], "failure": []},
            },
            "status": result.status.value,
            "tests_exit_code": result.tests_exit_code,
            "tests_timed_out": result.tests_timed_out,
            "log_warnings": result.log_warnings,
            "reverted_files": [f.model_dump() for f in result.reverted_files],
            "integrity": result.integrity.model_dump(mode="json"),
            "timings_s": result.timings_s,
        }
    }


def run_report(
    instance_ids: Iterable[str],
    predictions: Mapping[str, Prediction],
    results: Mapping[str, EvalResult],
) -> dict[str, Any]:
    """The run report, with the SWE-bench harness's keys and counting rules.

    Args:
        instance_ids: every instance of the (filtered) dataset.
        predictions: the submitted predictions, by ``instance_id``.
        results: the results obtained so far, by ``instance_id``.
    """
    ids = list(instance_ids)
    incomplete, empty, completed, resolved, unresolved, error = (set[str]() for _ in range(6))
    for iid in ids:
        pred = predictions.get(iid)
        result = results.get(iid)
        if pred is None:
            incomplete.add(iid)
        elif not (pred.model_patch or "").strip():
            empty.add(iid)
        elif result is None or not result.status.completed:
            error.add(iid)
        else:
            completed.add(iid)
            (resolved if result.resolved else unresolved).add(iid)
    return {
        "total_instances": len(ids),
        "submitted_instances": len(predictions),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved),
        "empty_patch_instances": len(empty),
        "error_instances": len(error),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(incomplete),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(predictions),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(error),
        "schema_version": RUN_REPORT_SCHEMA_VERSION,
        "integrity": integrity_counts(results[i] for i in sorted(completed)),
    }


def integrity_counts(results: Iterable[EvalResult]) -> dict[str, Any]:
    """How often the defences triggered among ``results``.

    Keys: ``triggered_instances``/``triggered_ids`` (any defence changed or rejected
    something), ``reverted_files_instances`` (model files reverted),
    ``channel_violated_instances`` (pytest channel records missing, forged or contradicting),
    ``log_inconsistent_instances`` (the log disagreed with the channel),
    ``channel_unavailable_instances`` (test command without pytest: log grading only).
    """
    triggered, reverted, violated, inconsistent, unavailable = ([] for _ in range(5))
    for r in results:
        state = r.integrity
        if state.triggered:
            triggered.append(r.instance_id)
        if state.reverted_files:
            reverted.append(r.instance_id)
        if state.channel is ChannelState.VIOLATED:
            violated.append(r.instance_id)
        if state.log_consistent is False:
            inconsistent.append(r.instance_id)
        if state.channel is ChannelState.UNAVAILABLE:
            unavailable.append(r.instance_id)
    return {
        "triggered_instances": len(triggered),
        "reverted_files_instances": len(reverted),
        "channel_violated_instances": len(violated),
        "log_inconsistent_instances": len(inconsistent),
        "channel_unavailable_instances": len(unavailable),
        "triggered_ids": triggered,
    }
