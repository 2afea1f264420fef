"""Load :class:`~sandlot.datasets.instance.Instance` records from dataset files.

Accepted inputs (records use the SWE-bench dataset field names, see ``instance.py``):

- ``.jsonl``: one JSON object per line; blank lines are skipped. Read line by line.
- ``.json``: one of
    - a list of objects: ``[{"instance_id": ...}, ...]``;
    - an object with an ``"instances"`` list: ``{"instances": [...], ...}`` (other top-level keys
      are metadata and are ignored);
    - an object mapping ids to objects: ``{"id-1": {...}, "id-2": {...}}``; a record without
      ``instance_id`` takes its key, a record whose ``instance_id`` differs from its key is an
      error.
- ``.parquet``: one row per record (the Hugging Face exports of SWE-bench), read batch by batch
  with ``pyarrow`` (``sandlot[eval]``); the verl task rows that ``sandlot data prepare`` writes
  (``sandlot.datasets.rows``) are recognised and give the instance in their metadata.
- a directory: every ``.jsonl``, ``.json`` and ``.parquet`` file directly in it, in name order.

A ``null`` value of a declared field means the field is absent (parquet files hold ``null`` where a
row lacks a column). Relative ``repo_source`` paths are resolved against the directory of the
file that holds the record (``~`` is expanded); URLs (``https://``, ``file://``, ...) and git's
scp-like remotes (``git@host:owner/repo.git``: a colon before the first slash) are kept as given.
Every problem raises :class:`DatasetError` naming the file, the record and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandlot.datasets.errors import DatasetError
from sandlot.datasets.instance import Instance, is_remote_source
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.swebench_tasks import is_task_repo
from sandlot.datasets.validate import consistency_problems

SUFFIXES = (".jsonl", ".json", ".parquet")
"""File name endings :func:`load_instances` reads."""

_PARQUET_BATCH_ROWS = 1024


def load_instances(path: str | os.PathLike[str]) -> list[Instance]:
    """Load every instance of a dataset file or directory.

    Args:
        path: a ``.jsonl``, ``.json`` or ``.parquet`` file, or a directory of such files (the
            accepted shapes are listed in the module docstring).

    Returns:
        The instances in file order (directory files in name order).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: unsupported file type, empty directory, unreadable JSON, a record that is
            not an object or fails :class:`Instance` validation, or a repeated ``instance_id``.
        ImportError: a parquet file is given and ``pyarrow`` is missing (names ``sandlot[eval]``).
    """
    return list(iter_instances(path))


def iter_instances(path: str | os.PathLike[str]) -> Iterator[Instance]:
    """Yield the instances of a dataset file or directory one at a time.

    Same inputs, order and errors as :func:`load_instances`; a file is read lazily, so an error
    in a record is raised once iteration reaches it.
    """
    for entry in walk_dataset(path):
        yield entry.instance


@dataclass(frozen=True)
class DatasetEntry:
    """One record of a dataset walk.

    Attributes:
        file: the file it came from.
        where: its place in the file (``"line 3"``, ``"row 0"``, ...).
        record: the record as read (a verl row keeps its prompt and ``extra_info`` here).
        instance: the record validated into an :class:`Instance`.
    """

    file: Path
    where: str
    record: Any
    instance: Instance


def walk_dataset(path: str | os.PathLike[str]) -> Iterator[DatasetEntry]:
    """Walk a dataset: a ``.jsonl``/``.json``/``.parquet`` file, or a directory of them (its
    files in name order, not recursive). The one walk every dataset reader shares.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetError: unsupported file type, a directory without dataset files, an invalid
            record, or a repeated ``instance_id`` (naming where it was first seen).
    """
    root = Path(path)
    if is_task_repo(root):
        raise DatasetError(
            root,
            "is a swebench task repository, not a dataset file; make its rows with: sandlot "
            f"data prepare swe_bench_verified --input {root} (add --backend and its options)",
        )
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise DatasetError(root, f"directory holds no dataset file ({', '.join(SUFFIXES)})")
    elif root.exists():
        if root.suffix not in SUFFIXES:
            raise DatasetError(
                root, f"unsupported file type {root.suffix!r}; expected one of {SUFFIXES}"
            )
        files = [root]
    else:
        raise FileNotFoundError(f"dataset not found: {root}")

    first_seen: dict[str, str] = {}
    for file in files:
        for where, record in iter_records(file):
            instance = instance_from_record(record, source=file, where=where)
            if instance.instance_id in first_seen:
                raise DatasetError(
                    file,
                    f"duplicate instance_id, first seen at {first_seen[instance.instance_id]}",
                    where=where,
                    instance_id=instance.instance_id,
                    fields=("instance_id",),
                )
            first_seen[instance.instance_id] = f"{file}, {where}"
            yield DatasetEntry(file, where, record, instance)


def instance_from_record(record: Any, *, source: str | os.PathLike[str], where: str) -> Instance:
    """Validate one record into an :class:`Instance`.

    Every loader converts records here, so every row format is recognised in this one place.

    Args:
        record: either a mapping with the SWE-bench dataset fields (``instance_id``,
            ``base_commit``, ``test_patch``, ``FAIL_TO_PASS`` as a list or JSON string, ...)
            plus sandlot's fields (``None`` values of declared fields count as absent; unknown
            keys are kept), or a verl task row (``sandlot.datasets.rows.TaskRow``: no top-level
            ``instance_id``, an ``extra_info.tools_kwargs``), whose instance is
            ``extra_info.tools_kwargs.reward.metadata`` and whose ids and environment fields
            must agree with it.
        source: the dataset file holding the record; a relative ``repo_source`` path is
            resolved against its directory.
        where: the record's position in ``source`` for error messages (``"line 3"``).

    Raises:
        DatasetError: ``record`` is not a mapping or fails validation; the message names the
            file, position, ``instance_id`` when known, and each offending field (dotted paths
            such as ``extra_info.tools_kwargs.reward.metadata.FAIL_TO_PASS`` for task rows).
    """
    if not isinstance(record, Mapping):
        raise DatasetError(
            source, f"record must be a JSON object, got {type(record).__name__}", where=where
        )
    if _is_task_row(record):
        instance = _instance_from_row(record, source=source, where=where)
    else:
        instance_id = record.get("instance_id")
        known_id = instance_id if isinstance(instance_id, str) and instance_id else None
        declared = Instance.model_fields
        data = {k: v for k, v in record.items() if not (v is None and k in declared)}
        try:
            instance = Instance.model_validate(data)
        except ValidationError as exc:
            raise _validation_error(exc, source, where, known_id) from None
    if instance.repo_source and not is_remote_source(instance.repo_source):
        base = Path(source).absolute().parent
        instance.repo_source = os.path.normpath(base / Path(instance.repo_source).expanduser())
    return instance


def _is_task_row(record: Mapping[str, Any]) -> bool:
    info = record.get("extra_info")
    return (
        "instance_id" not in record
        and isinstance(info, Mapping)
        and isinstance(info.get("tools_kwargs"), Mapping)
    )


def _instance_from_row(
    record: Mapping[str, Any], *, source: str | os.PathLike[str], where: str
) -> Instance:
    """The instance of a verl row (``sandlot.datasets.rows``), checked for consistency."""
    info = record["extra_info"]
    raw_id = info.get("instance_id")
    known_id = raw_id if isinstance(raw_id, str) and raw_id else None
    try:
        row = TaskRow.from_record(record)
    except ValidationError as exc:
        raise _validation_error(exc, source, where, known_id) from None
    problems = consistency_problems(row)
    if problems:
        raise DatasetError(
            source,
            "; ".join(f"field {p.field!r}: {p.problem}" for p in problems),
            where=where,
            instance_id=known_id,
            fields=tuple(p.field for p in problems),
        )
    return row.instance


def _validation_error(
    exc: ValidationError,
    source: str | os.PathLike[str],
    where: str,
    instance_id: str | None,
) -> DatasetError:
    problems: list[str] = []
    fields: list[str] = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "<record>"
        fields.append(field)
        if error["type"] == "missing":
            problems.append(f"missing required field {field!r}")
        else:
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"field {field!r}: {message}")
    return DatasetError(
        source, "; ".join(problems), where=where, instance_id=instance_id, fields=tuple(fields)
    )


def iter_records(file: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, record)`` for each raw record of one ``.jsonl``/``.json``/``.parquet``
    file (shapes in the module docstring), before any validation.

    Raises:
        DatasetError: unreadable JSON or parquet.
        ImportError: a parquet file and no ``pyarrow``.
    """
    if file.suffix == ".jsonl":
        return _jsonl_records(file)
    if file.suffix == ".json":
        return _json_records(file)
    return _parquet_records(file)


def _jsonl_records(file: Path) -> Iterator[tuple[str, Any]]:
    with file.open(encoding="utf-8-sig") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    file, f"invalid JSON ({exc.msg} at column {exc.colno})", where=where
                ) from None


def _json_records(file: Path) -> Iterator[tuple[str, Any]]:
    try:
        with file.open(encoding="utf-8-sig") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            file, f"invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("instances"), list):
        data = data["instances"]
    if isinstance(data, list):
        return ((f"index {i}", record) for i, record in enumerate(data))
    if isinstance(data, dict):
        return _keyed_records(file, data.items())
    raise DatasetError(
        file,
        f"top-level JSON must be a list of records, an object with an 'instances' list, or an "
        f"object mapping instance ids to records; got {type(data).__name__}",
    )


def _keyed_records(file: Path, items: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for key, record in items:
        where = f"key {key!r}"
        if isinstance(record, dict):
            record_id = record.setdefault("instance_id", key)
            if record_id != key:
                raise DatasetError(
                    file,
                    f"instance_id {record_id!r} differs from its key",
                    where=where,
                    instance_id=key,
                    fields=("instance_id",),
                )
        yield where, record


def _parquet_records(file: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading {file} needs pyarrow ({exc}): pip install 'sandlot[eval]'"
        ) from exc
    try:
        parquet = pq.ParquetFile(file)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError subclasses
        raise DatasetError(file, f"unreadable parquet file ({exc})") from exc
    row = 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        for record in batch.to_pylist():
            yield f"row {row}", record
            row += 1
