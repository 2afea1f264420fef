"""``sandlot data convert --from uni-agent``: rewrite a uni-agent row file into sandlot's layout.

Each row is rewritten by :func:`sandlot.datasets.uni_agent.to_sandlot_record`, validated as a
:class:`~sandlot.datasets.rows.TaskRow` and checked as ``sandlot data prepare`` checks its rows
(:func:`~sandlot.datasets.validate.row_problems`); the file is written as ``prepare`` writes
(validated before it replaces anything, see :func:`sandlot.datasets.parquet.write_rows`). The
first bad row stops the run unless ``skip_invalid``, which leaves bad rows out and lists them
in ``<output>.rejected.jsonl``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sandlot.datasets.loaders import DatasetError, iter_records
from sandlot.datasets.prepare import write_checked
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.uni_agent import UniAgentRowError, is_uni_agent_row, to_sandlot_record
from sandlot.datasets.validate import ValidationReport, row_problems

SOURCES = ("uni-agent",)
"""The layouts ``--from`` accepts."""


@dataclass
class ConvertResult:
    """The file written, its validation report, and the rows left out by ``skip_invalid``."""

    path: Path
    rows: int
    report: ValidationReport
    rejected: list[DatasetError] = field(default_factory=list)
    rejected_path: Path | None = None


def convert_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    backend: str | None = None,
    skip_invalid: bool = False,
) -> ConvertResult:
    """Rewrite the uni-agent parquet (or JSONL) file ``source`` into sandlot rows at ``output``.

    Args:
        source: a file written by uni-agent's preprocessing scripts.
        output: the parquet file to write (replaced only when every written row is valid).
        backend: ``sandbox.backend`` of the rows (default: from each row's image).
        skip_invalid: leave bad rows out instead of stopping at the first.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        DatasetError: a row is not in uni-agent's layout or cannot be rewritten (names the
            row, its instance and the field), no valid row is left, or the written file
            fails validation.
        ImportError: ``pyarrow`` is missing.
    """
    src = Path(source)
    if not src.is_file():
        raise FileNotFoundError(f"input file not found: {src}")
    rows: list[TaskRow] = []
    rejected: list[DatasetError] = []
    for where, record in iter_records(src):
        try:
            rows.append(_row(src, where, record, len(rows), backend))
        except DatasetError as exc:
            if not skip_invalid:
                raise
            rejected.append(exc)
    if not rows:
        detail = f"; first: {rejected[0]}" if rejected else ""
        raise DatasetError(src, f"no row to write ({len(rejected)} invalid){detail}")
    target = Path(output)
    report, report_path = write_checked(rows, rejected, target)
    return ConvertResult(target, len(rows), report, rejected, report_path)


def _row(src: Path, where: str, record: object, index: int, backend: str | None) -> TaskRow:
    if not isinstance(record, dict) or not is_uni_agent_row(record):
        raise DatasetError(
            src,
            "not a uni-agent row (no extra_info.tools_kwargs.env.deployment or .task)",
            where=where,
        )
    raw_id = _metadata_id(record)
    try:
        row = TaskRow.from_record(to_sandlot_record(record, index=index, backend=backend))
    except UniAgentRowError as exc:
        raise DatasetError(src, str(exc), where=where, instance_id=raw_id) from None
    except ValidationError as exc:
        fields = tuple(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise DatasetError(src, message, where=where, instance_id=raw_id, fields=fields) from None
    # Rewritten rows are numbered in the output file, whatever index uni-agent gave them.
    row.extra_info.index = index
    problems = row_problems(row)
    if problems:
        raise DatasetError(
            src,
            "; ".join(f"{p.field}: {p.problem} (fix: {p.fix})" for p in problems),
            where=where,
            instance_id=row.extra_info.instance_id,
            fields=tuple(p.field for p in problems),
        )
    return row


def _metadata_id(record: dict[str, object]) -> str | None:
    tools = record["extra_info"]["tools_kwargs"]  # type: ignore[index]
    holder = tools.get("task") or tools.get("reward") or {}
    metadata = holder.get("metadata") if isinstance(holder, dict) else None
    value = metadata.get("instance_id") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None
