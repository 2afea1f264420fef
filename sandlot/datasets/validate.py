"""Check a row file before training: every row, every field, with the fix for each problem.

:func:`validate_file` reads a parquet file of :class:`~sandlot.datasets.rows.TaskRow` rows and
returns a :class:`ValidationReport`. It checks, in order:

1. the file: readable parquet; the columns ``prompt``, ``data_source``, ``agent_name``,
   ``reward_model`` and ``extra_info`` exist with the Arrow types of
   :func:`sandlot.datasets.parquet.row_arrow_schema` (a wider integer or ``large_string`` is
   fine, and ``env_variables``/``metadata`` may be structs instead of JSON text). A wrong type
   is reported once, naming the column path, its type and the expected one; rows are then not
   checked. Columns and struct fields the schema does not know are kept and listed;
2. every row (:func:`row_problems`): it validates as a ``TaskRow`` (its ``metadata`` as an
   ``Instance``); the ids in ``reward_model.ground_truth``, ``extra_info.instance_id`` and the
   metadata agree; ``tools_kwargs.env`` repeats the instance's environment fields; the prompt
   has a system and a user message and contains neither the gold patch nor the test patch;
   ``FAIL_TO_PASS`` is not empty; the image fits the backend (:func:`image_misfit`); a local
   ``repo_source`` path exists on this machine; the ``log_parser`` is known and there is a
   test command (:func:`test_problems`, needs ``swebench``);
3. the file again: ``extra_info.index`` and ``instance_id`` are unique.

A file written by uni-agent's preprocessing scripts is recognised by its schema
(:func:`is_uni_agent_schema`); its rows are checked as sandlot reads them, rewritten by
:mod:`sandlot.datasets.uni_agent`, and ``report.layout`` says ``"uni-agent"``.

Extra columns and extra ``extra_info`` fields are kept (verl passes them to the agent loop);
inside ``tools_kwargs`` unknown fields are errors, so a misspelt key is never silently ignored.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandlot.datasets.images import LOCAL_IMAGE
from sandlot.datasets.instance import is_remote_source
from sandlot.datasets.prompts import find_leak
from sandlot.datasets.r2e_gym import R2E_GYM_LOG_PARSER
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.swebench_specs import SpecError, resolve_log_parser, resolve_test_cmd
from sandlot.datasets.uni_agent import LAYOUT as UNI_AGENT
from sandlot.datasets.uni_agent import UniAgentRowError, to_sandlot_record
from sandlot.images.reference import parse as parse_reference
from sandlot.sandboxes.images import backend_image

VEFAAS_REGISTRY_SUFFIX = ".cr.volces.com"
"""Host suffix of the Volcengine container registry that veFaaS sandboxes pull from."""

REQUIRED_COLUMNS = ("prompt", "data_source", "agent_name", "reward_model", "extra_info")
_ENV = "extra_info.tools_kwargs.env"
_METADATA = "extra_info.tools_kwargs.reward.metadata"
_JSON_FIELDS = {f"{_ENV}.env_variables", _METADATA}
_OPTIONAL_FIELDS = {
    f"{_ENV}.post_setup_cmd",
    f"{_ENV}.repo_source",
    f"{_ENV}.env_variables",
    "extra_info.schema_version",
}
_REMAKE = "re-create the file with `sandlot data prepare`"
_CONVERT = "fix the row, or leave it out: `sandlot data convert --from uni-agent --skip-invalid`"


@dataclass(frozen=True)
class Problem:
    """One problem: where (``row`` is ``None`` for the whole file), which field, how to fix."""

    row: int | None
    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = "file" if self.row is None else f"row {self.row}"
        return f"{where}: {self.field}: {self.problem} (fix: {self.fix})"


@dataclass
class ValidationReport:
    """What :func:`validate_file` found; ``ok`` when ``errors`` is empty."""

    path: Path
    rows: int = 0
    errors: list[Problem] = field(default_factory=list)
    extra_columns: list[str] = field(default_factory=list)
    repos: Counter[str] = field(default_factory=Counter)
    images: Counter[str] = field(default_factory=Counter)
    backends: Counter[str] = field(default_factory=Counter)
    data_sources: Counter[str] = field(default_factory=Counter)
    agent_names: Counter[str] = field(default_factory=Counter)
    layout: str = "sandlot"
    """``"sandlot"``, or ``"uni-agent"`` for a file written by uni-agent's scripts (read
    through :mod:`sandlot.datasets.uni_agent`)."""

    @property
    def ok(self) -> bool:
        return not self.errors


def validate_file(path: str | os.PathLike[str]) -> ValidationReport:
    """Check every row of the parquet file ``path`` (see the module docstring).

    Never raises for bad content: every problem is in ``report.errors``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImportError: ``pyarrow`` is missing.
    """
    import pyarrow.parquet as pq

    from sandlot.datasets.parquet import row_arrow_schema

    report = ValidationReport(path=Path(path))
    if not report.path.is_file():
        raise FileNotFoundError(f"no such file: {report.path}")
    try:
        parquet = pq.ParquetFile(report.path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError subclasses
        problem = f"not a parquet file ({exc})"
        report.errors.append(Problem(None, report.path.name, problem, _REMAKE))
        return report
    actual = parquet.schema_arrow
    expected = row_arrow_schema()
    if is_uni_agent_schema(actual):
        report.layout = UNI_AGENT
        _check_rows(report, parquet)
        return report
    for name in REQUIRED_COLUMNS:
        if actual.get_field_index(name) < 0:
            report.errors.append(Problem(None, name, "required column is missing", _REMAKE))
        else:
            report.errors += _type_problems(
                name, actual.field(name).type, expected.field(name).type
            )
    report.extra_columns = _extra_columns(actual, expected)
    if not report.errors:
        _check_rows(report, parquet)
    return report


def is_uni_agent_schema(schema: Any) -> bool:
    """``True`` for the Arrow schema of a file written by uni-agent's preprocessing scripts
    (``extra_info.tools_kwargs`` holds ``env.deployment`` or ``task``;
    :mod:`sandlot.datasets.uni_agent`)."""
    import pyarrow as pa

    try:
        tools = schema.field("extra_info").type.field("tools_kwargs").type
    except (KeyError, AttributeError):
        return False
    if not pa.types.is_struct(tools):
        return False
    if tools.get_field_index("task") >= 0:
        return True
    if tools.get_field_index("env") < 0 or not pa.types.is_struct(tools.field("env").type):
        return False
    return bool(tools.field("env").type.get_field_index("deployment") >= 0)


def _check_rows(report: ValidationReport, parquet: Any) -> None:
    """Check every row (2.) and the file's unique keys (3.); rows in uni-agent's layout are
    rewritten first, numbered by their position."""
    first_row: dict[tuple[str, object], int] = {}
    for i, record in enumerate(_records(parquet)):
        report.rows += 1
        try:
            if report.layout == UNI_AGENT:
                record = to_sandlot_record(record, index=i)
            row = TaskRow.from_record(record)
        except UniAgentRowError as exc:
            report.errors.append(Problem(i, "extra_info.tools_kwargs", str(exc), _CONVERT))
            continue
        except ValidationError as exc:
            report.errors += _pydantic_problems(i, exc)
            continue
        report.errors += row_problems(row, i)
        _count(report, row)
        for label, key in (
            ("extra_info.instance_id", row.extra_info.instance_id),
            ("extra_info.index", row.extra_info.index),
        ):
            first = first_row.setdefault((label, key), i)
            if first != i:
                report.errors.append(
                    Problem(i, label, f"{key!r} repeats row {first}", "make it unique")
                )


def consistency_problems(row: TaskRow, index: int | None = None) -> list[Problem]:
    """Problems that make a row's instance ambiguous: ids or environment fields that disagree."""
    inst = row.instance
    env = row.extra_info.tools_kwargs.env
    problems = []
    for label, value in (
        ("reward_model.ground_truth", row.reward_model.ground_truth),
        ("extra_info.instance_id", row.extra_info.instance_id),
    ):
        if value != inst.instance_id:
            problems.append(
                Problem(
                    index,
                    label,
                    f"{value!r} differs from the metadata's instance_id {inst.instance_id!r}",
                    "set it to the instance_id",
                )
            )
    pairs = (
        ("image", env.image, inst.image),
        ("post_setup_cmd", env.post_setup_cmd, inst.post_setup_cmd),
        ("workdir", env.workdir, inst.workdir),
        ("repo_source", env.repo_source, inst.repo_source),
        ("env_variables", env.env_variables, inst.env),
    )
    for name, in_env, in_instance in pairs:
        if in_env != in_instance:
            problems.append(
                Problem(
                    index,
                    f"{_ENV}.{name}",
                    f"{in_env!r} differs from the metadata's value {in_instance!r}",
                    "make tools_kwargs.env and the metadata agree (" + _REMAKE + ")",
                )
            )
    return problems


def row_problems(row: TaskRow, index: int | None = None) -> list[Problem]:
    """Every per-row check of the module docstring (2.) on a row that parsed."""
    problems = consistency_problems(row, index)
    inst = row.instance
    env = row.extra_info.tools_kwargs.env
    roles = [m.role for m in row.prompt]
    if "system" not in roles or "user" not in roles:
        problems.append(
            Problem(index, "prompt", f"roles are {roles}", "give a system and a user message")
        )
    leak = find_leak([m.model_dump() for m in row.prompt], inst)
    if leak:
        problems.append(
            Problem(
                index,
                "prompt",
                f"contains the {leak}",
                "remove it from the prompt template or the problem statement",
            )
        )
    if row.extra_info.tools_kwargs.reward.name == "r2e_gym" and (
        inst.log_parser != R2E_GYM_LOG_PARSER
    ):
        problems.append(
            Problem(
                index,
                f"{_METADATA}.log_parser",
                f"an R2E-Gym row graded by {inst.log_parser!r}: its test keys never match "
                f"(R2E-Gym rows are graded by {R2E_GYM_LOG_PARSER!r})",
                "re-run `sandlot data prepare r2e_gym_subset`",
            )
        )
    if inst.log_parser == R2E_GYM_LOG_PARSER and not inst.graded_paths:
        problems.append(
            Problem(
                index,
                f"{_METADATA}.graded_paths",
                "an R2E-Gym row that names no graded_paths: the agent's sandbox would keep the "
                "hidden tests and run_tests.sh of the image, where the agent can read them",
                "re-run `sandlot data prepare r2e_gym_subset` (or `sandlot data convert`)",
            )
        )
    if not inst.FAIL_TO_PASS:
        problems.append(
            Problem(
                index,
                f"{_METADATA}.FAIL_TO_PASS",
                "is empty, so any patch would be graded as resolved",
                "list the tests the fix makes pass, or drop the instance",
            )
        )
    backend = env.sandbox.backend
    if backend == "local":
        if env.image == LOCAL_IMAGE and not env.repo_source:
            problems.append(
                Problem(
                    index,
                    f"{_ENV}.repo_source",
                    "a local row on the host image needs a repo_source",
                    "set SANDLOT_REPO_MIRROR and re-run `sandlot data prepare`",
                )
            )
        source = env.repo_source
        if source and not is_remote_source(source) and not Path(source).exists():
            problems.append(
                Problem(
                    index,
                    f"{_ENV}.repo_source",
                    f"{source} does not exist on this machine",
                    f"create it (git clone --mirror <url of {inst.repo}> {source})",
                )
            )
    misfit = image_misfit(env.image, backend)
    if misfit:
        problems.append(
            Problem(
                index,
                f"{_ENV}.image",
                misfit,
                f"re-run `sandlot data prepare` with the DEPLOYMENT the image is for, or fix "
                f"--image-overrides (sandbox.backend is {backend})",
            )
        )
    return problems + test_problems(row, index)


def image_misfit(image: str, backend: str) -> str | None:
    """Why ``backend`` cannot run ``image``, or ``None``.

    ``local`` runs the host (:data:`~sandlot.datasets.images.LOCAL_IMAGE`), a root
    filesystem path or a container image reference (``sandlot.images``, pulled without a
    daemon; also from the veFaaS registry, given its credentials); ``docker`` and ``modal``
    cannot pull from the
    veFaaS registry (``*.cr.volces.com``); ``vefaas`` pulls only from it, after mapping the
    canonical names of the image families (:func:`sandlot.sandboxes.images.backend_image`).
    """
    if backend == "local":
        try:
            parse_reference(image)
        except ValueError as exc:
            return f"{image!r} is neither {LOCAL_IMAGE!r}, a root filesystem nor an image: {exc}"
        return None
    if image == LOCAL_IMAGE:
        return f"{LOCAL_IMAGE!r} only exists on the local backend, not on {backend}"
    if backend == "vefaas":
        if _is_vefaas_registry(backend_image(image, "vefaas", overrides={})):
            return None
        return f"{image!r} is neither in the veFaaS registry nor an image family veFaaS mirrors"
    if _is_vefaas_registry(image):
        return f"{image!r} is in the veFaaS registry, which {backend} cannot pull from"
    return None


def _is_vefaas_registry(image: str) -> bool:
    return image.split("/", 1)[0].endswith(VEFAAS_REGISTRY_SUFFIX)


def test_problems(row: TaskRow, index: int | None = None) -> list[Problem]:
    """The row's tests cannot be run or read: an unknown ``log_parser``, or no ``test_cmd``
    and none in swebench's specifications for its ``repo``/``version``.

    Both need ``swebench`` unless the row names its own test command and R2E-Gym's parser;
    without ``swebench`` installed (``sandlot[eval]``) those checks are skipped.
    """
    inst = row.instance
    problems = []
    try:
        resolve_log_parser(inst)
    except SpecError as exc:
        problems.append(
            Problem(
                index,
                f"{_METADATA}.log_parser",
                str(exc),
                "name one of the listed parsers, or drop the field to use the repo's default",
            )
        )
    except ImportError:
        pass
    try:
        resolve_test_cmd(inst)
    except SpecError as exc:
        problems.append(
            Problem(
                index,
                f"{_METADATA}.test_cmd",
                str(exc),
                "set test_cmd, or a repo and version swebench knows",
            )
        )
    except ImportError:
        pass
    return problems


def _records(parquet: Any) -> Iterator[dict[str, Any]]:
    for batch in parquet.iter_batches(batch_size=256):
        yield from batch.to_pylist()


def _count(report: ValidationReport, row: TaskRow) -> None:
    report.repos[row.instance.repo or "<none>"] += 1
    report.images[row.extra_info.tools_kwargs.env.image] += 1
    report.backends[row.extra_info.tools_kwargs.env.sandbox.backend] += 1
    report.data_sources[row.data_source] += 1
    report.agent_names[row.agent_name] += 1


def _pydantic_problems(index: int, exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"]) or "<row>"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            problems.append(Problem(index, path, "missing", f"add {path} ({_REMAKE})"))
        else:
            problems.append(
                Problem(
                    index, path, f"{message} (got {error.get('input')!r:.80})", f"correct {path}"
                )
            )
    return problems


def _type_problems(path: str, actual: Any, expected: Any) -> list[Problem]:
    import pyarrow as pa

    if path in _JSON_FIELDS and (pa.types.is_struct(actual) or _is_string(actual)):
        return []
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(actual):
            return [_type_problem(path, actual, expected)]
        problems = []
        for child in expected:
            sub = f"{path}.{child.name}"
            index = actual.get_field_index(child.name)
            if index < 0:
                if sub not in _OPTIONAL_FIELDS:
                    problems.append(Problem(None, sub, "required field is missing", _REMAKE))
                continue
            problems += _type_problems(sub, actual.field(index).type, child.type)
        return problems
    if pa.types.is_list(expected):
        if not (pa.types.is_list(actual) or pa.types.is_large_list(actual)):
            return [_type_problem(path, actual, expected)]
        return _type_problems(f"{path}[]", actual.value_type, expected.value_type)
    same_kind = (
        (_is_string(expected) and _is_string(actual))
        or (pa.types.is_integer(expected) and pa.types.is_integer(actual))
        or (pa.types.is_boolean(expected) and pa.types.is_boolean(actual))
    )
    # An all-null column (written without a schema) has type null and fits any type.
    return [] if same_kind or pa.types.is_null(actual) else [_type_problem(path, actual, expected)]


def _type_problem(path: str, actual: Any, expected: Any) -> Problem:
    return Problem(
        None, path, f"has type {actual}, expected {expected}", f"write {path} as {expected}"
    )


def _extra_columns(actual: Any, expected: Any) -> list[str]:
    """Columns, and ``extra_info`` fields, that the row schema does not define (both are kept)."""
    import pyarrow as pa

    extra = [name for name in actual.names if expected.get_field_index(name) < 0]
    info = actual.field("extra_info").type if "extra_info" in actual.names else None
    if info is not None and pa.types.is_struct(info):
        known = expected.field("extra_info").type
        extra += [f"extra_info.{c.name}" for c in info if known.get_field_index(c.name) < 0]
    return extra


def _is_string(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))
