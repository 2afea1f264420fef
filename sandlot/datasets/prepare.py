"""The preprocessing pipeline shared by every source dataset: source rows → verl parquet rows.

Each source module (``swe_bench_verified``, ``swe_rebench``, ``r2e_gym_subset``) describes itself
with a :class:`Preprocessor`: its Hugging Face id and split, the output name, the source fields
it requires, and a ``convert`` function from one source record to the fields of an
:class:`~sandlot.datasets.instance.Instance`. :func:`prepare` then

0. checks that the output directory can be written (before a long download, not after);
1. reads the source (:func:`sandlot.datasets.sources.read_source`);
2. selects rows: with ``seed``, a reproducible shuffle; then the first ``max_instances``;
3. converts each selected record, checks the required fields and validates the instance;
4. renders the prompt (:class:`~sandlot.datasets.prompts.PromptTemplate`), builds the
   :class:`~sandlot.datasets.rows.TaskRow` and checks that it would run
   (:func:`sandlot.datasets.validate.row_problems`: tests to grade, a known log parser, a
   test command, an image the backend can pull, no solution in the prompt). Every problem
   is a :class:`~sandlot.datasets.loaders.DatasetError` naming the input, the record, the
   instance and the field; by default the first one stops the run, with ``skip_invalid`` the
   record is left out and listed in ``<stem>_<backend>.rejected.jsonl``;
5. writes the rows to a temporary file next to ``<local_save_dir>/<stem>_<backend>.parquet``
   (:func:`sandlot.datasets.parquet.write_rows`), re-reads it with
   :func:`sandlot.datasets.validate.validate_file` and renames it into place only if every
   row passes: a file it leaves behind is one ``sandlot data validate`` accepts, and a failed
   run never replaces the previous output.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from sandlot.datasets.errors import DatasetMessageError
from sandlot.datasets.images import ImageBackend
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import DatasetError, instance_from_record
from sandlot.datasets.local import LocalRowError, resolve_mirror
from sandlot.datasets.parquet import write_rows, write_text_atomic
from sandlot.datasets.prompts import PromptTemplate
from sandlot.datasets.rows import DEFAULT_AGENT_NAME, TaskRow, build_row
from sandlot.datasets.sources import Record, read_source
from sandlot.datasets.validate import ValidationReport, row_problems, validate_file
from sandlot.errors import SandlotError


class SourceError(DatasetMessageError):
    """A source record cannot be converted; ``field`` names the offending source field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.fields = (field,)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.field, self.problem)


@dataclass(frozen=True)
class ConvertContext:
    """What a conversion needs besides the record."""

    backend: ImageBackend
    image_overrides: Mapping[str, str] = field(default_factory=dict)
    repo_mirror: Path | None = None
    """Set for ``local``: the directory of git mirrors (``sandlot.datasets.local``)."""


Convert = Callable[[Mapping[str, Any], ConvertContext], dict[str, Any]]


@dataclass(frozen=True)
class Preprocessor:
    """One source dataset.

    Attributes:
        name: module and CLI name (``"swe_rebench"``).
        hf_id: the Hugging Face dataset read when no ``--input`` is given; also the rows'
            ``data_source``.
        default_split: the split read from ``hf_id``.
        output_stem: output file name before ``_<backend>.parquet``; ``{split}`` is replaced.
        reward_name: ``tools_kwargs.reward.name`` of the rows.
        required: source fields every record must have (non-null).
        convert: source record → ``Instance`` fields; raises :class:`SourceError`.
        backends: the backends the source supports.
    """

    name: str
    hf_id: str
    default_split: str
    output_stem: str
    reward_name: str
    required: tuple[str, ...]
    convert: Convert
    backends: tuple[ImageBackend, ...] = ("local", "docker", "modal", "vefaas")


@dataclass
class PrepareOptions:
    """The knobs of one run (the CLI options of ``sandlot data prepare``)."""

    local_save_dir: Path
    backend: ImageBackend
    input: str | None = None
    split: str | None = None
    max_instances: int | None = None
    seed: int | None = None
    template: PromptTemplate = field(default_factory=PromptTemplate)
    image_overrides: Mapping[str, str] = field(default_factory=dict)
    repo_mirror: str | None = None
    local_images: bool = False
    """``local`` rows run the container images ``docker`` rows name (the local backend pulls
    them, see ``docs/images.md``), not the host with a repository mirror: one file then gives
    the same verdicts on both backends."""
    agent_name: str = DEFAULT_AGENT_NAME
    skip_invalid: bool = False
    """Leave invalid records out (listed in ``<output>.rejected.jsonl``) instead of stopping."""


@dataclass
class PrepareResult:
    """The file written, its row count, its validation report (always ``ok``), and the records
    left out by ``skip_invalid`` with the file that lists them."""

    path: Path
    rows: int
    report: ValidationReport
    rejected: list[DatasetError] = field(default_factory=list)
    rejected_path: Path | None = None


class OutputDirError(SandlotError, OSError):
    """The output directory cannot be created or written."""


def output_path(pre: Preprocessor, options: PrepareOptions) -> Path:
    """``<local_save_dir>/<stem>_<backend>.parquet``."""
    stem = pre.output_stem.format(split=options.split or pre.default_split)
    return Path(options.local_save_dir).expanduser() / f"{stem}_{options.backend}.parquet"


def prepare(pre: Preprocessor, options: PrepareOptions) -> PrepareResult:
    """Run the pipeline of the module docstring.

    Raises:
        LocalRowError: ``local`` is not supported by ``pre`` or has no mirror directory.
        FileNotFoundError: the input file does not exist.
        DatasetError: a record is invalid (names input, record, instance and field), repeats an
            ``instance_id``, or would not run (:func:`~sandlot.datasets.validate.row_problems`);
            with ``options.skip_invalid`` such records are left out and listed in
            ``result.rejected`` instead. Also raised when no valid row is left, or when the
            written file fails validation; the previous output file is then left untouched.
        OutputDirError: the output directory cannot be created or written (checked first).
        ImportError: ``datasets`` (Hugging Face input) or ``pyarrow`` is missing.
    """
    # With local_images a local row is converted exactly as a docker row (its image, no
    # mirror, no host environment); only its sandbox.backend says local.
    convert_for: ImageBackend = (
        "docker" if options.backend == "local" and options.local_images else options.backend
    )
    if convert_for not in pre.backends:
        local = " (or --local-images, to run the docker images on local)" * (
            "docker" in pre.backends
        )
        raise LocalRowError(
            f"{pre.name} cannot be prepared for DEPLOYMENT={options.backend}; supported: "
            f"{', '.join(pre.backends)}{local if options.backend == 'local' else ''}"
        )
    if options.max_instances is not None and options.max_instances < 0:
        raise DatasetMessageError(f"max_instances must be >= 0, got {options.max_instances}")
    target = output_path(pre, options)
    _check_writable(target.parent)
    ctx = ConvertContext(
        backend=convert_for,
        image_overrides=options.image_overrides,
        repo_mirror=resolve_mirror(options.repo_mirror) if convert_for == "local" else None,
    )
    source = options.input or pre.hf_id
    records = _select(read_source(source, split=options.split or pre.default_split), options)
    rows: list[TaskRow] = []
    rejected: list[DatasetError] = []
    seen: dict[str, str] = {}
    for where, record in records:
        try:
            row = _build(pre, record, ctx, options, source, where, len(rows), seen)
        except DatasetError as exc:
            if not options.skip_invalid:
                raise
            rejected.append(exc)
            continue
        seen[row.extra_info.instance_id] = where
        rows.append(row)
    if rejected and not rows:
        raise DatasetError(source, f"all {len(rejected)} rows are invalid; first: {rejected[0]}")
    report, report_path = write_checked(rows, rejected, target)
    return PrepareResult(
        path=target, rows=len(rows), report=report, rejected=rejected, rejected_path=report_path
    )


def write_checked(
    rows: Sequence[TaskRow], rejected: Sequence[DatasetError], target: Path
) -> tuple[ValidationReport, Path | None]:
    """Write ``rows`` to ``target`` only if the written file validates, then the report of the
    ``rejected`` records next to it (a stale report of an earlier run is removed).

    Returns:
        The validation report and the path of the rejected-rows report (``None`` if none).

    Raises:
        DatasetError: the written file fails validation; ``target`` is left as it was.
    """
    checked: list[ValidationReport] = []

    def check(written: Path) -> None:
        report = validate_file(written)
        if not report.ok:
            raise DatasetError(target, f"the rows fail validation, not written: {report.errors[0]}")
        checked.append(report)

    write_rows(rows, target, check=check)
    report_path = rejected_path(target)
    if not rejected:
        report_path.unlink(missing_ok=True)
        return checked[0], None
    return checked[0], write_rejected(rejected, report_path)


def _build(
    pre: Preprocessor,
    record: Any,
    ctx: ConvertContext,
    options: PrepareOptions,
    source: str,
    where: str,
    index: int,
    seen: Mapping[str, str],
) -> TaskRow:
    """One source record → its checked row, or a :class:`DatasetError` naming the record."""
    instance = convert_record(pre, record, ctx, source=source, where=where)
    if instance.instance_id in seen:
        raise DatasetError(
            source,
            f"duplicate instance_id, first seen at {seen[instance.instance_id]}",
            where=where,
            instance_id=instance.instance_id,
            fields=("instance_id",),
        )
    try:
        prompt = options.template.render(instance)
    except ValueError as exc:
        raise DatasetError(
            source, str(exc), where=where, instance_id=instance.instance_id, fields=("prompt",)
        ) from None
    row = build_row(
        instance,
        index=index,
        prompt=prompt,
        data_source=pre.hf_id,
        reward_name=pre.reward_name,
        backend=options.backend,
        agent_name=options.agent_name,
    )
    problems = row_problems(row)
    if problems:
        raise DatasetError(
            source,
            "; ".join(f"{p.field}: {p.problem} (fix: {p.fix})" for p in problems),
            where=where,
            instance_id=instance.instance_id,
            fields=tuple(p.field for p in problems),
        )
    return row


def rejected_path(target: Path) -> Path:
    """``<output>.rejected.jsonl``: the report of the rows ``--skip-invalid`` left out."""
    return target.with_name(target.name.removesuffix(".parquet") + ".rejected.jsonl")


def write_rejected(rejected: Sequence[DatasetError], path: Path) -> Path:
    """Write one JSON object per rejected record: ``where``, ``instance_id``, ``fields``,
    ``problem`` (the input is the one of the run)."""
    lines = [
        json.dumps(
            {
                "where": e.where,
                "instance_id": e.instance_id,
                "fields": list(e.fields),
                "problem": e.problem,
            }
        )
        for e in rejected
    ]
    write_text_atomic(path, "".join(line + "\n" for line in lines))
    return path


def convert_record(
    pre: Preprocessor, record: Any, ctx: ConvertContext, *, source: str, where: str
) -> Instance:
    """One source record → a validated :class:`Instance` (errors name ``source`` and ``where``).

    Raises:
        DatasetError: the record is not an object, misses a required field, or fails
            conversion or :class:`Instance` validation.
    """
    if not isinstance(record, Mapping):
        raise DatasetError(
            source, f"record must be an object, got {type(record).__name__}", where=where
        )
    raw_id = record.get("instance_id")
    known_id = raw_id if isinstance(raw_id, str) and raw_id else None
    missing = [f for f in pre.required if record.get(f) is None]
    if missing:
        raise DatasetError(
            source,
            "; ".join(f"missing required field {f!r}" for f in missing)
            + f" ({pre.name} rows need {', '.join(pre.required)})",
            where=where,
            instance_id=known_id,
            fields=tuple(missing),
        )
    try:
        data = pre.convert(record, ctx)
    except SourceError as exc:
        raise DatasetError(
            source,
            f"field {exc.field!r}: {exc.problem}",
            where=where,
            instance_id=known_id,
            fields=(exc.field,),
        ) from None
    return instance_from_record(data, source=source, where=where)


def _check_writable(directory: Path) -> None:
    """Fail before reading the source, not after converting it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".sandlot-write-test-"):
            pass
    except OSError as exc:
        raise OutputDirError(
            f"output directory {directory} is not writable ({exc.strerror or exc}); "
            "choose another --local-save-dir"
        ) from None


def _select(records: Iterator[Record], options: PrepareOptions) -> Iterator[Record]:
    if options.seed is not None:
        pool = list(records)
        random.Random(options.seed).shuffle(pool)
        records = iter(pool)
    return islice(records, options.max_instances) if options.max_instances is not None else records
