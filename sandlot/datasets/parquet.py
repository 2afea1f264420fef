"""Write :class:`~sandlot.datasets.rows.TaskRow` files with pyarrow under one fixed schema.

Every file gets the same Arrow types (:func:`row_arrow_schema`), whatever its rows hold, so files
of different datasets and deployments concatenate (``datasets.concatenate_datasets`` in verl's
``RLHFDataset`` needs equal features). Files are written to a temporary name in the target
directory and renamed into place, so a crash never leaves a half-written dataset behind.
``pyarrow`` comes with ``sandlot[eval]`` and ``sandlot[data]``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandlot.datasets.rows import ROW_SCHEMA_VERSION, TaskRow

SCHEMA_METADATA_KEY = b"sandlot.row_schema_version"


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ImportError(
            f"writing parquet needs pyarrow ({exc}): pip install 'sandlot[data]'"
        ) from exc
    return pyarrow


def row_arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of a row file (field by field in ``rows.py``'s docstring)."""
    pa = _pyarrow()
    string = pa.string()
    env = pa.struct(
        [
            ("image", string),
            ("post_setup_cmd", string),
            ("workdir", string),
            ("repo_source", string),
            ("env_variables", string),
            ("sandbox", pa.struct([("backend", string), ("network", pa.bool_())])),
        ]
    )
    reward = pa.struct([("name", string), ("metadata", string)])
    return pa.schema(
        [
            ("prompt", pa.list_(pa.struct([("role", string), ("content", string)]))),
            ("data_source", string),
            ("agent_name", string),
            ("reward_model", pa.struct([("style", string), ("ground_truth", string)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("instance_id", string),
                        ("schema_version", pa.int64()),
                        ("tools_kwargs", pa.struct([("env", env), ("reward", reward)])),
                    ]
                ),
            ),
        ],
        metadata={SCHEMA_METADATA_KEY: str(ROW_SCHEMA_VERSION).encode()},
    )


def write_rows(rows: Sequence[TaskRow], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` to the parquet file ``path`` (parent directories are created).

    Returns:
        The path written.

    Raises:
        OSError: the directory cannot be created or written (the message names it).
        ImportError: ``pyarrow`` is missing (names ``sandlot[data]``).
    """
    pa = _pyarrow()
    import pyarrow.parquet as pq

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([row.to_record() for row in rows], schema=row_arrow_schema())
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
