"""SWE-bench 5.x: task repositories, and rows that carry their own eval script.

swebench 5.0 (changelog of 5.0.0, Aug. 2026) took the per-repository specifications out of the
package: ``swebench.harness.constants`` no longer has ``MAP_REPO_VERSION_TO_SPECS`` or
``MAP_REPO_TO_EXT``, ``swebench.harness.log_parsers`` no longer has ``MAP_REPO_TO_PARSER``,
and ``swebench.harness.test_spec`` is gone. Each task now carries what the harness needs, in a
*task repository* (``swebench.task.repo`` in 5.0.2; SWE-bench's own is
``github.com/SWE-bench/swe-bench-tasks``, cloned with git)::

    sweb.yaml                  the datasets the repository publishes, and their splits
    tasks/<instance_id>/
        task.yaml              instance_id, repo, version, base_commit, split, image,
                               log_parser (a PARSER_REGISTRY key), eval_type, datasets, ...
        tests.json             {"FAIL_TO_PASS": [...], "PASS_TO_PASS": [...]}
        problem_statement.md   hints.md (optional)   gold.patch   test.patch
        eval.sh                the script the harness runs in the image
        Dockerfile             how the image (``task.yaml``'s ``image``) is built

and the datasets 5.x publishes (``swebench dataset build``) are those files as columns:
``patch``, ``test_patch``, ``eval_script``, ``problem_statement``, ``hints_text``, plus
``task.yaml``'s keys and ``tests.json``'s lists. 5.x's ``make_test_spec`` needs
``instance_id``, ``image``, ``repo``, ``version``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``,
``log_parser``, ``eval_type`` and ``eval_script``.

What sandlot takes from such a row (with either harness installed):

- the test command: the lines of ``eval_script`` between its ``>>>>> Start Test Output`` and
  ``>>>>> End Test Output`` markers (:func:`command_of_eval_script`), the same command 4.1
  composed from a specification;
- the log parser: the row's ``log_parser`` name;
- the grading rule: the row's ``eval_type`` (:func:`eval_type_of`);
- the image: ``task.yaml``'s ``image`` (the published ``swebench/sweb.eval.x86_64.*`` name).

The environment *recipe* a ``local`` backend builds on the host from 4.1's specifications has no
5.x source: 5.x keeps it only as the ``RUN`` lines of each task's Dockerfile. Under 5.x such rows
run in their image (container backends, or ``local`` with the image).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from sandlot.datasets.errors import DatasetError, DatasetMessageError

TASKS_DIR = "tasks"
TASK_FILE = "task.yaml"
TESTS_FILE = "tests.json"
# swebench.task.repo.AS_FILE and OPTIONAL_FILE (5.0.2): dataset columns kept as their own files.
_AS_FILE = {
    "patch": "gold.patch",
    "test_patch": "test.patch",
    "eval_script": "eval.sh",
    "problem_statement": "problem_statement.md",
}
_OPTIONAL_FILE = {"hints_text": "hints.md"}

# swebench.harness.constants.START_TEST_OUTPUT / END_TEST_OUTPUT (4.1 and 5.x alike).
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"

EVAL_TYPES = ("pass_and_fail", "fail_only")
"""Values of ``swebench.harness.constants.EvalType`` (4.1 and 5.x)."""


class TaskRepoError(DatasetMessageError):
    """A task repository or one of its tasks cannot be read."""


def repo_version_specs() -> dict[str, dict[Any, dict[str, Any]]]:
    """swebench 4.1's ``MAP_REPO_VERSION_TO_SPECS`` (repo → version → spec), or ``{}`` when the
    installed swebench has none (5.x) or swebench is not installed."""
    try:
        constants = importlib.import_module("swebench.harness.constants")
    except ImportError:
        return {}
    specs: dict[str, dict[Any, dict[str, Any]]] = getattr(
        constants, "MAP_REPO_VERSION_TO_SPECS", {}
    )
    return specs


def specs_missing_reason() -> str | None:
    """Why swebench's per-repository specifications cannot be used, or ``None`` when they can.

    The reason names the fix: rows with their ``eval_script`` (5.x datasets and task
    repositories carry it), a ``test_cmd``, or swebench 4.1.
    """
    try:
        swebench = importlib.import_module("swebench")
    except ImportError:
        return None  # the caller's own import reports the missing extra
    if repo_version_specs():
        return None
    version = getattr(swebench, "__version__", "?")
    return (
        f"the installed swebench {version} has no per-repository specifications (5.x moved "
        "them into task repositories); use rows that carry their eval_script (swebench 5.x "
        "datasets, or a task repository through `sandlot data prepare swe_bench_verified "
        "--input DIR`), or "
        "install swebench 4.1 (pip install 'sandlot[eval]')"
    )


def command_of_eval_script(eval_script: str) -> str | None:
    """The test command of a swebench eval script: the lines between its last
    ``: '>>>>> Start Test Output'`` marker and the ``End`` marker after it.

    Args:
        eval_script: the script text (``eval.sh`` of a task repository, the ``eval_script``
            column of a 5.x dataset), as swebench 4.1's ``make_eval_script_list`` writes it.

    Returns:
        The command lines joined with newlines (one line for Python repositories, e.g.
        ``"pytest -rA tests/test_x.py"``), or ``None`` when the markers are missing or enclose
        nothing. The last start marker is taken: the test patch, applied from a heredoc earlier
        in the script, could quote a marker.
    """
    lines = eval_script.splitlines()
    starts = [i for i, line in enumerate(lines) if START_TEST_OUTPUT in line]
    if not starts:
        return None
    start = starts[-1]
    ends = [i for i in range(start + 1, len(lines)) if END_TEST_OUTPUT in lines[i]]
    if not ends:
        return None
    body = [line for line in lines[start + 1 : ends[0]] if line.strip()]
    return "\n".join(body) or None


def row_test_cmd(extra: Mapping[str, Any] | None) -> str | None:
    """The test command of a row's ``eval_script`` (an extra field of an ``Instance``), or
    ``None`` when the row has none (see :func:`command_of_eval_script`)."""
    script = (extra or {}).get("eval_script")
    return command_of_eval_script(script) if isinstance(script, str) and script else None


def eval_type_of(extra: Mapping[str, Any] | None, instance_id: str) -> str | None:
    """A row's ``eval_type`` (``"pass_and_fail"`` or ``"fail_only"``), or ``None`` if unset.

    Raises:
        TaskRepoError: the value is not one of :data:`EVAL_TYPES` (names the row and the values).
    """
    value = (extra or {}).get("eval_type")
    if value in (None, ""):
        return None
    if value not in EVAL_TYPES:
        raise TaskRepoError(
            f"instance {instance_id!r}: eval_type {value!r} is not one of "
            f"{', '.join(EVAL_TYPES)}; fix the row (a task repository's task.yaml)"
        )
    return str(value)


def is_task_repo(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding ``tasks/`` (a swebench 5.x task repository)."""
    return (Path(path) / TASKS_DIR).is_dir()


def task_dirs(repo: str | Path) -> list[Path]:
    """The task directories of ``repo`` (those under ``tasks/`` with a ``task.yaml``), sorted.

    Raises:
        TaskRepoError: ``repo`` has no ``tasks/`` directory, or no task in it.
    """
    root = Path(repo) / TASKS_DIR
    if not root.is_dir():
        raise TaskRepoError(f"{repo} is not a swebench task repository: it has no {TASKS_DIR}/")
    dirs = sorted(d for d in root.iterdir() if (d / TASK_FILE).is_file())
    if not dirs:
        raise TaskRepoError(f"{root} holds no task (no {TASKS_DIR}/<instance_id>/{TASK_FILE})")
    return dirs


def _read(path: Path) -> str:
    # newline="" keeps a patch's CRLF line ends, which it needs to apply (as swebench reads it).
    with open(path, newline="") as fh:
        return fh.read()


def load_task(task_dir: str | Path) -> dict[str, Any]:
    """One task directory as the row swebench 5.x publishes for it
    (``swebench.task.repo.load_task``, 5.0.2): ``task.yaml``'s keys, the file columns, and the
    lists of ``tests.json``.

    Raises:
        DatasetError: a required file is missing, or ``task.yaml``/``tests.json`` does not
            parse or is not a mapping (names the file).
    """
    task_dir = Path(task_dir)
    meta_file = task_dir / TASK_FILE
    try:
        row = yaml.safe_load(meta_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DatasetError(meta_file, f"cannot read the task's metadata: {exc}") from exc
    if not isinstance(row, dict):
        raise DatasetError(meta_file, "is not a mapping of task fields")
    for column, name in _AS_FILE.items():
        path = task_dir / name
        if not path.is_file():
            raise DatasetError(path, f"missing: every task needs its {name} ({column})")
        row[column] = _read(path)
    for column, name in _OPTIONAL_FILE.items():
        path = task_dir / name
        row[column] = _read(path) if path.is_file() else ""
    tests_file = task_dir / TESTS_FILE
    try:
        tests = json.loads(tests_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(tests_file, f"cannot read the task's tests: {exc}") from exc
    if not isinstance(tests, dict):
        raise DatasetError(tests_file, "is not an object with FAIL_TO_PASS and PASS_TO_PASS")
    row.update(tests)
    return row


def iter_task_records(repo: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for every task of a task repository, in instance-id order.

    ``where`` is ``"tasks/<dir>"``. Every split is read (a task's ``split`` and ``datasets``
    stay in the row): the rows to evaluate are chosen with the CLI's ``--instance-ids``.

    Raises:
        TaskRepoError: ``repo`` is not a task repository or holds no task.
        DatasetError: a task cannot be read (see :func:`load_task`).
    """
    for task_dir in task_dirs(repo):
        yield f"{TASKS_DIR}/{task_dir.name}", load_task(task_dir)
