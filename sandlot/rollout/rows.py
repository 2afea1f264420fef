"""Reading a dataset into :class:`~sandlot.datasets.rows.TaskRow` s for a rollout: whatever
``sandlot eval`` accepts, each instance's image resolved for the run's one backend."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import DatasetError, walk_dataset
from sandlot.datasets.prompts import PromptTemplate
from sandlot.datasets.rows import TaskRow, build_row


def load_rows(
    path: str | os.PathLike[str],
    *,
    backend: str,
    image: str | None = None,
    instance_ids: Sequence[str] | None = None,
) -> list[TaskRow]:
    """The rows of a dataset, whichever form it takes.

    Accepts what ``sandlot eval`` accepts (:mod:`sandlot.datasets.loaders`): a verl parquet
    file from ``sandlot data prepare`` (its rows, prompts included, are used as they are) or an
    instances file (``.jsonl``/``.json``/``.parquet`` of SWE-bench records), or a directory of
    them. Instances get a row with the default prompt
    (:class:`~sandlot.datasets.prompts.PromptTemplate`); the config's ``prompt`` templates can
    replace it per episode.

    Args:
        path: the dataset file or directory.
        backend: the backend the episodes run on (the image an instance's map gives it).
        image: run every instance in this image instead of its own (as ``sandlot eval
            --image``).
        instance_ids: keep only these, in the dataset's order.

    Raises:
        FileNotFoundError: no such file.
        DatasetError: a record is invalid, repeated, or an ``instance_ids`` entry is unknown.
        ValueError: an instance has no image for ``backend``, or its prompt would leak the
            solution.
    """
    template = PromptTemplate()
    rows: list[TaskRow] = []
    for entry in walk_dataset(path):
        # One backend per run: its image, so a row's env and metadata agree.
        instance = entry.instance
        instance = instance.model_copy(update={"image": image or instance.image_for(backend)})
        rows.append(_row(entry.record, instance, template, len(rows), entry.file.stem, backend))
    if instance_ids:
        missing = sorted(set(instance_ids) - {r.instance.instance_id for r in rows})
        if missing:
            raise DatasetError(path, f"not in the dataset: {', '.join(missing)}")
        wanted = set(instance_ids)
        rows = [r for r in rows if r.instance.instance_id in wanted]
    return rows


def _row(
    record: Any,
    instance: Instance,
    template: PromptTemplate,
    index: int,
    data_source: str,
    backend: Any,
) -> TaskRow:
    if isinstance(record, Mapping) and "instance_id" not in record and "extra_info" in record:
        row = TaskRow.from_record(record)
        tools = row.extra_info.tools_kwargs
        # The loader resolved repo_source against the file (and --image replaced the image).
        tools.reward.metadata = instance
        if isinstance(instance.image, str):
            tools.env.image = instance.image
        return row
    return build_row(
        instance,
        index=index,
        prompt=template.render(instance),
        data_source=data_source,
        reward_name="swe_bench",
        backend=backend,
    )
