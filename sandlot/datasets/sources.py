"""Read the records of a source dataset: a Hugging Face dataset id or a local file.

``--input`` is a local file when it exists, or when it looks like a path (it ends in ``.jsonl``,
``.json`` or ``.parquet``, or starts with ``/``, ``.`` or ``~``); anything else is a Hugging Face
dataset id (``owner/name``), loaded with ``datasets.load_dataset(id, split=split)``
(``sandlot[data]``; imported only then, and it needs the Hub or a local Hugging Face cache).

A directory holding ``tasks/`` is a swebench 5.x task repository: one record per
``tasks/<instance_id>/`` (:mod:`sandlot.datasets.swebench_tasks`). Local files hold the source's
own rows as the Hugging Face dataset exports them, in the shapes
:func:`sandlot.datasets.loaders.iter_records` reads (JSONL, a JSON list, parquet). ``split`` only
applies to Hugging Face ids. Each record comes with its position (``"line 3"``, ``"row 7"``,
``"<id>[<split>] row 7"``) for error messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandlot.datasets.loaders import SUFFIXES, DatasetError, iter_records
from sandlot.datasets.swebench_tasks import is_task_repo, iter_task_records

Record = tuple[str, Any]


def is_local_input(value: str) -> bool:
    """Whether ``value`` names a local file rather than a Hugging Face dataset id."""
    return (
        Path(value).expanduser().exists()
        or value.endswith(SUFFIXES)
        or value.startswith(("/", ".", "~"))
    )


def read_source(value: str, *, split: str) -> Iterator[Record]:
    """Yield ``(where, record)`` for every record of the input ``value``.

    Raises:
        FileNotFoundError: ``value`` looks like a local file that does not exist.
        DatasetError: the file has an unsupported type or unreadable content, or a task of a
            task repository cannot be read.
        ImportError: a Hugging Face id is given and ``datasets`` is missing (names the extra).
    """
    if not is_local_input(value):
        return _hugging_face(value, split)
    file = Path(value).expanduser()
    if is_task_repo(file):  # a swebench 5.x task repository: tasks/<instance_id>/ directories
        return iter_task_records(file)
    if not file.is_file():
        raise FileNotFoundError(f"input file not found: {file}")
    if file.suffix not in SUFFIXES:
        raise DatasetError(file, f"unsupported input type {file.suffix!r}; use one of {SUFFIXES}")
    return iter_records(file)


def _hugging_face(dataset_id: str, split: str) -> Iterator[Record]:
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading {dataset_id!r} from the Hugging Face Hub needs the datasets package "
            f"({exc}): pip install 'sandlot[data]', or pass a local file with --input"
        ) from exc
    for i, record in enumerate(datasets.load_dataset(dataset_id, split=split)):
        yield f"{dataset_id}[{split}] row {i}", record
