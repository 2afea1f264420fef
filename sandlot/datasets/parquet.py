"""Write :class:`~sandlot.datasets.rows.TaskRow` files with pyarrow under one fixed schema.

Every file gets the same Arrow types (:func:`row_arrow_schema`), whatever its rows hold, so files
of different datasets and backends concatenate (``datasets.concatenate_datasets`` in verl's
``RLHFDataset`` needs equal features). Files are written to a temporary name in the target
directory, checked, and renamed into place, so a crash or a rejected file never leaves a
half-written dataset behind nor replaces a good one. New files get the usual permissions
(``0o666`` minus the umask).
``pyarrow`` comes with ``sandlot[eval]`` and ``sandlot[data]``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
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


def write_rows(
    rows: Sequence[TaskRow],
    path: str | os.PathLike[str],
    *,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``rows`` to the parquet file ``path`` (parent directories are created).

    The rows go to a temporary file in the same directory, created with the permissions of a
    new file (``0o666`` minus the umask), which ``check`` may inspect; only when it returns is
    the file renamed over ``path``. Whatever fails, ``path`` keeps its previous content.

    Args:
        rows: the rows, in file order.
        path: the target file.
        check: called with the temporary file; raising stops the write.

    Returns:
        The path written.

    Raises:
        OSError: the directory cannot be created or written (the message names it).
        ImportError: ``pyarrow`` is missing (names ``sandlot[data]``).
        Exception: whatever ``check`` raises.
    """
    pa = _pyarrow()
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row.to_record() for row in rows], schema=row_arrow_schema())
    with _replacing(Path(path)) as tmp:
        pq.write_table(table, tmp)
        if check is not None:
            check(tmp)
    return Path(path)


def write_table(table: Any, path: str | os.PathLike[str]) -> Path:
    """Write the ``pyarrow.Table`` ``table`` to the parquet file ``path`` through a temporary
    file and a rename (mode as for :func:`write_rows`), its schema as it is.

    Raises:
        OSError: the directory cannot be created or written.
    """
    import pyarrow.parquet as pq

    with _replacing(Path(path)) as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename (mode as for
    :func:`write_rows`).

    Raises:
        OSError: the directory cannot be created or written.
    """
    with _replacing(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


@contextlib.contextmanager
def _replacing(target: Path) -> Iterator[Path]:
    """A new empty file next to ``target``, renamed over it when the block succeeds, removed
    when it fails. ``os.open`` with mode ``0o666`` applies the umask, as ``open()`` does;
    ``mkstemp`` would leave the file ``0o600``, unreadable to workers running as another user.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        break
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
