"""Loading model predictions in the SWE-bench harness format.

Format (SWE-bench ``run_evaluation --predictions_path``): JSONL with one object per line, or a
JSON list of objects, or a JSON object mapping ``instance_id`` to an object; each object has
``instance_id``, ``model_name_or_path`` and ``model_patch``. The word ``gold`` stands for the
instances' reference ``patch``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from sandlot.datasets.instance import Instance
from sandlot.errors import SandlotError

GOLD = "gold"


class PredictionsError(SandlotError, ValueError):
    """A predictions file is malformed; the message names the file, the line and the fix."""


class Prediction(BaseModel):
    """One model's patch for one instance."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    model_name_or_path: str = "unknown"
    model_patch: str | None = None


def gold_predictions(instances: Iterable[Instance]) -> dict[str, Prediction]:
    """Predictions whose ``model_patch`` is each instance's reference ``patch``."""
    return {
        i.instance_id: Prediction(
            instance_id=i.instance_id, model_name_or_path=GOLD, model_patch=i.patch
        )
        for i in instances
    }


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, record)``; ``where`` is ``"line N"`` or ``"item N"`` for messages."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise PredictionsError(f"{path}: line {lineno} is not valid JSON: {exc}") from exc
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PredictionsError(
            f"{path}: not valid JSON ({exc}); expected a list of "
            "predictions or JSONL with one prediction per line"
        ) from exc
    if isinstance(data, dict):
        for key, value in data.items():
            yield (
                f"key {key!r}",
                {"instance_id": key, **value} if isinstance(value, dict) else value,
            )
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield f"item {index}", value
    else:
        raise PredictionsError(f"{path}: expected a JSON list or object, got {type(data).__name__}")


def load_predictions(source: str | Path, instances: Iterable[Instance]) -> dict[str, Prediction]:
    """Load predictions for ``instances`` from a file, or the reference patches for ``"gold"``.

    Args:
        source: path to a ``.jsonl`` / ``.json`` predictions file, or the word ``gold``.
        instances: the dataset the predictions refer to.

    Returns:
        ``instance_id`` → ``Prediction``.

    Raises:
        FileNotFoundError: the file does not exist.
        PredictionsError: a record is malformed, repeats an ``instance_id``, or names an
            ``instance_id`` that is not in the dataset (the message gives the line).
    """
    instances = list(instances)
    if str(source) == GOLD:
        return gold_predictions(instances)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"predictions file {path} does not exist (or pass `gold`)")
    known = {i.instance_id for i in instances}
    out: dict[str, Prediction] = {}
    for where, record in _records(path):
        if not isinstance(record, dict):
            raise PredictionsError(f"{path}: {where} is not a JSON object")
        try:
            pred = Prediction.model_validate(record)
        except ValidationError as exc:
            raise PredictionsError(
                f"{path}: {where}: invalid prediction ({exc.errors()[0]['loc']}: "
                f"{exc.errors()[0]['msg']}); each needs instance_id, model_name_or_path, "
                "model_patch"
            ) from exc
        if pred.instance_id not in known:
            raise PredictionsError(
                f"{path}: {where}: instance_id {pred.instance_id!r} is not in the dataset; "
                "fix the id, or pass the dataset that contains it"
            )
        if pred.instance_id in out:
            raise PredictionsError(f"{path}: {where}: duplicate instance_id {pred.instance_id!r}")
        out[pred.instance_id] = pred
    return out
