"""``run_evaluations`` with an evaluator of the caller's: what it is asked, in which order,
and what the outcome says (no sandbox: the evaluator answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from sandlot.datasets.instance import Instance
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.rewards.runner import run_evaluations


class Recorder:
    """An evaluator that resolves every patch and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, bool]] = []

    async def __aenter__(self) -> Recorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def evaluate(
        self, instance: Instance, prediction: Prediction, *, group_size: int, test_empty: bool
    ) -> EvalResult:
        self.calls.append(
            (instance.instance_id, prediction.model_name_or_path, group_size, test_empty)
        )
        await anyio.lowlevel.checkpoint()
        return EvalResult(
            instance_id=instance.instance_id,
            model_name_or_path=prediction.model_name_or_path,
            status=EvalStatus.RESOLVED,
            resolved=True,
        )

    async def set_ups(self) -> int | None:
        return 3


def _instance(name: str) -> Instance:
    return Instance(
        instance_id=name, base_commit="abc", test_patch="", FAIL_TO_PASS=["t"], test_cmd="pytest"
    )


def _run(tmp_path: Path, sets: list[dict[str, Prediction]], **kw: Any) -> Recorder:
    recorder = Recorder()
    instances = [_instance(n) for n in ("a", "b", "c")]
    outcomes = anyio.run(
        lambda: run_evaluations(
            instances, sets, run_id="r", output_dir=tmp_path, workers=1, evaluator=recorder, **kw
        )
    )
    assert all(o.set_ups == 3 for o in outcomes)
    return recorder


def _set(model: str, patch: str) -> dict[str, Prediction]:
    return {
        n: Prediction(instance_id=n, model_name_or_path=model, model_patch=patch)
        for n in ("a", "b", "c")
    }


def test_an_instances_later_evaluation_waits_for_the_next_instances_first(
    tmp_path: Path,
) -> None:
    calls = _run(tmp_path, [_set("m1", "diff"), _set("m2", "diff")]).calls
    assert [(iid, model) for iid, model, _, _ in calls] == [
        ("a", "m1"), ("b", "m1"), ("a", "m2"), ("c", "m1"), ("b", "m2"), ("c", "m2"),
    ]  # fmt: skip
    assert {size for _, _, size, _ in calls} == {2}


def test_empty_patches_open_a_sandbox_only_with_test_empty(tmp_path: Path) -> None:
    sets = [_set("gold", "diff"), _set("before", "")]
    without = _run(tmp_path / "without", sets).calls
    assert {(model, size) for _, model, size, _ in without} == {("gold", 1), ("before", 1)}
    tested = _run(tmp_path / "tested", sets, test_empty=True).calls
    assert {(model, size, flag) for _, model, size, flag in tested} == {
        ("gold", 2, True),
        ("before", 2, True),
    }
