"""Predictions loading and the SWE-bench run report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandlot.datasets.instance import Instance
from sandlot.rewards.predictions import Prediction, PredictionsError, load_predictions
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.run_report import run_report


def _inst(iid: str) -> Instance:
    return Instance(
        instance_id=iid, base_commit="abc", test_patch="", FAIL_TO_PASS=["t"], patch=f"gold-{iid}"
    )


INSTANCES = [_inst("a"), _inst("b"), _inst("c")]


def test_gold_uses_reference_patches() -> None:
    preds = load_predictions("gold", INSTANCES)
    assert {k: p.model_patch for k, p in preds.items()} == {
        "a": "gold-a",
        "b": "gold-b",
        "c": "gold-c",
    }
    assert all(p.model_name_or_path == "gold" for p in preds.values())


def test_jsonl_and_json_shapes(tmp_path: Path) -> None:
    rows = [{"instance_id": "a", "model_name_or_path": "m/x", "model_patch": "diff"}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    as_list = tmp_path / "p.json"
    as_list.write_text(json.dumps(rows))
    as_map = tmp_path / "m.json"
    as_map.write_text(json.dumps({"a": {"model_name_or_path": "m/x", "model_patch": "diff"}}))
    for f in (jsonl, as_list, as_map):
        assert load_predictions(f, INSTANCES)["a"].model_patch == "diff"


def test_unknown_instance_id_names_it_and_the_line(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"instance_id": "a", "model_patch": ""})
        + "\n"
        + json.dumps({"instance_id": "zzz", "model_patch": "x"})
        + "\n"
    )
    with pytest.raises(PredictionsError, match=r"line 2.*'zzz'"):
        load_predictions(f, INSTANCES)


def test_bad_json_line_and_duplicates(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"instance_id": "a"}\n{not json\n')
    with pytest.raises(PredictionsError, match="line 2"):
        load_predictions(f, INSTANCES)
    f.write_text('{"instance_id": "a"}\n{"instance_id": "a"}\n')
    with pytest.raises(PredictionsError, match="duplicate"):
        load_predictions(f, INSTANCES)
    with pytest.raises(FileNotFoundError):
        load_predictions(tmp_path / "missing.jsonl", INSTANCES)


def test_run_report_counts_like_the_harness() -> None:
    preds = {
        "a": Prediction(instance_id="a", model_patch="p"),
        "b": Prediction(instance_id="b", model_patch=""),
        "c": Prediction(instance_id="c", model_patch="p"),
        "d": Prediction(instance_id="d", model_patch="p"),
    }
    results = {
        "a": EvalResult(instance_id="a", status=EvalStatus.RESOLVED, resolved=True),
        "b": EvalResult(instance_id="b", status=EvalStatus.EMPTY_PATCH),
        "c": EvalResult(instance_id="c", status=EvalStatus.PATCH_FAILED),
        "d": EvalResult(instance_id="d", status=EvalStatus.TIMED_OUT),
    }
    report = run_report(["a", "b", "c", "d", "e"], preds, results)
    assert report["resolved_ids"] == ["a"]
    assert report["empty_patch_ids"] == ["b"]
    assert report["error_ids"] == ["c"]
    assert report["unresolved_ids"] == ["d"]
    assert report["completed_ids"] == ["a", "d"]
    assert report["incomplete_ids"] == ["e"]
    assert report["total_instances"] == 5
    assert report["submitted_instances"] == 4
    assert report["schema_version"] == 2
