"""Write the rows of a dataset that a set of ids selects, in the dataset's own format
(``sandlot data selftest --output``): the records as they were read, nothing re-encoded."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from sandlot.datasets.errors import DatasetError
from sandlot.datasets.loaders import walk_dataset
from sandlot.datasets.parquet import write_table, write_text_atomic


def write_subset(
    source: str | os.PathLike[str], keep: Collection[str], dest: str | os.PathLike[str]
) -> int:
    """Write the records of ``source`` whose ``instance_id`` is in ``keep`` to ``dest``, in
    ``source``'s order and format: JSONL lines as read, a JSON file in its own shape (a list,
    an object with an ``"instances"`` list and its other keys, or an object keyed by id),
    parquet rows with the file's own schema (verl rows stay verl rows, uni-agent rows stay
    uni-agent rows). A directory of files of one type is written as one file.

    Args:
        source: a dataset file or directory (:func:`~sandlot.datasets.loaders.walk_dataset`).
        keep: the ids to write.
        dest: the file to write (parent directories are created; replaced whole or not at
            all); its suffix must be ``source``'s.

    Returns:
        How many records were written.

    Raises:
        DatasetError: ``dest``'s suffix differs from the type of ``source``'s files, or a
            directory mixes file types; or as ``walk_dataset``.
    """
    out = Path(dest)
    chosen: dict[Path, list[tuple[str, Any]]] = {}
    for entry in walk_dataset(source):
        rows = chosen.setdefault(entry.file, [])
        if entry.instance.instance_id in keep:
            rows.append((entry.where, entry.record))
    suffixes = {file.suffix for file in chosen}
    if suffixes != {out.suffix}:
        raise DatasetError(
            out,
            f"must be a {' or '.join(sorted(suffixes))} file like {Path(source)} (rows are "
            "written in their input's own format)",
        )
    kept = [item for rows in chosen.values() for item in rows]
    if out.suffix == ".jsonl":
        write_text_atomic(out, "".join(json.dumps(record) + "\n" for _, record in kept))
    elif out.suffix == ".json":
        write_text_atomic(out, json.dumps(_json_shape(chosen), indent=2) + "\n")
    else:
        _write_parquet(chosen, out)
    return len(kept)


def _json_shape(chosen: dict[Path, list[tuple[str, Any]]]) -> Any:
    """The kept records of JSON files in the first file's top-level shape (``where`` is
    ``"index N"`` of a list, ``"key 'K'"`` of an object keyed by id)."""
    merged: Any = None
    for file, rows in chosen.items():
        data = json.loads(file.read_text(encoding="utf-8-sig"))
        wrapped = isinstance(data, dict) and isinstance(data.get("instances"), list)
        if isinstance(data, dict) and not wrapped:
            keys = {record["instance_id"] for _, record in rows}
            part: Any = {k: v for k, v in data.items() if k in keys}
        else:
            listed = data["instances"] if wrapped else data
            part = [listed[int(where.removeprefix("index "))] for where, _ in rows]
        if merged is None:
            merged = {**data, "instances": part} if wrapped else part
        elif isinstance(merged, dict) and "instances" in merged and isinstance(part, list):
            merged["instances"] += part
        elif isinstance(merged, dict) and isinstance(part, dict):
            merged.update(part)
        elif isinstance(merged, list) and isinstance(part, list):
            merged += part
        else:
            raise DatasetError(file, "its JSON shape differs from the directory's first file")
    return merged


def _write_parquet(chosen: dict[Path, list[tuple[str, Any]]], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for file, rows in chosen.items():
        positions = [int(where.removeprefix("row ")) for where, _ in rows]
        tables.append(pq.read_table(file).take(pa.array(positions, type=pa.int64())))
    write_table(pa.concat_tables(tables), out)
