"""Which files of a model patch are test infrastructure, to be reverted before the tests run.

A model is graded by tests it must not be able to influence except through the code under
test. Its changes to these paths are undone (restored from ``base_commit``, or deleted when they
are new), each with the reason below:

* ``conftest.py`` anywhere: pytest hooks and fixtures run inside the test runner;
* test-runner configuration: ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``,
  ``tox.ini``, ``noxfile.py`` anywhere; ``setup.cfg`` and ``pyproject.toml`` when a test-runner
  section changed (``[tool:pytest]``, ``[pytest]``, ``[tox:tox]``, ``[testenv*]``;
  ``[tool.pytest*]``, ``[tool.tox]``) as pytest reads the file, or pytest could not read it:
  the whole file is reverted then, since the sections can also be written in forms a
  section-by-section merge would miss (dotted keys, inline tables);
* caches that pytest or Python read back: ``.pytest_cache/``, ``__pycache__/``, ``*.pyc``;
* modules that shadow the runner or the interpreter's start-up: ``*.pth`` anywhere; new
  ``pytest.py``, ``sitecustomize.py``, ``usercustomize.py``, ``pytest/``, ``_pytest/``,
  ``pluggy/`` anywhere (changed ones at the root: a repository's own, pytest's ``src/_pytest``,
  is code under test); at the repository root (first on ``sys.path`` under
  ``python -m pytest``), a new module or package named like a standard-library module
  (``sys.stdlib_module_names``: ``unittest.py``, ``argparse.py``, ``json/__init__.py``) or a
  module pytest imports (``py``, ``iniconfig``, ``packaging``, ``pygments``, ...);
* package metadata: ``*.egg-info/``, ``*.dist-info/``, ``*.egg-link`` (an ``entry_points.txt``
  with a ``pytest11`` entry next to the repository is a plugin pytest autoloads);
* test code and data: anything under a ``test``, ``tests``, ``testing`` or ``e2e`` directory and
  ``test_*.py``, ``*_test.py``, ``tests.py``, ``test.py`` modules. SWE-bench builds
  ``test_patch`` from exactly such paths, so a fix never needs them, and test helpers and
  expected-output files are as much the grader as the test functions;
* the files the instance's ``test_patch`` touches (reset, then ``test_patch`` applies).

An instance may allow paths its fix legitimately changes: its ``integrity_allow`` field (a
list of ``fnmatch`` patterns over repository-relative paths, e.g. ``["setup.cfg"]``) exempts
them from every rule but the ``test_patch`` one.
"""

from __future__ import annotations

import fnmatch
import io
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, field_validator

from sandlot._optional import require
from sandlot.datasets.instance import Instance
from sandlot.rewards.result import RevertedFile

INSTANCE_ALLOW_FIELD = "integrity_allow"

_CONFTEST = "pytest conftest.py (its hooks and fixtures run inside the test runner)"
_RUNNER_CONFIG = "test-runner configuration"
_CACHE = "cache the test runner or Python reads back"
_SHADOW = "module that shadows the test runner or Python's start-up"
_METADATA = "package metadata the import system reads (entry points load pytest plugins)"
_TOP_LEVEL = "new top-level module named like a standard-library module or a test-runner dependency"
_TEST_CODE = "test code or test data (the grader's side, which SWE-bench puts in test_patch)"
_TEST_PATCH = "file of the instance's test_patch"
_RUNNER_SECTIONS = "test-runner section of {name} changed ({sections}); whole file reverted"

_RUNNER_CONFIG_NAMES = {
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "tox.ini",
    "noxfile.py",
}
_SHADOW_NAMES = {"pytest.py", "sitecustomize.py", "usercustomize.py"}
_SHADOW_PACKAGES = {"pytest", "_pytest", "pluggy"}
_CACHE_DIRS = {".pytest_cache", "__pycache__"}
_TEST_DIRS = {"test", "tests", "testing", "e2e"}
# What pytest imports (at start-up or lazily) besides the standard library, by top-level name.
_RUNNER_DEPENDENCIES = {
    "py",
    "pytest",
    "_pytest",
    "pluggy",
    "iniconfig",
    "packaging",
    "exceptiongroup",
    "tomli",
    "colorama",
    "attr",
    "attrs",
    "more_itertools",
    "six",
    "atomicwrites",
    "importlib_metadata",
    "zipp",
    "wcwidth",
    "pygments",
    "typing_extensions",
}
_TOP_LEVEL_SHADOWS = frozenset(getattr(sys, "stdlib_module_names", ())) | _RUNNER_DEPENDENCIES
SECTIONED_FILES = ("setup.cfg", "pyproject.toml")


class RevertPolicy(BaseModel):
    """The per-instance exemptions from the rules (``fnmatch`` patterns)."""

    allow: list[str] = Field(default_factory=list)

    @field_validator("allow", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @classmethod
    def for_instance(cls, instance: Instance) -> RevertPolicy:
        """The policy of ``instance`` (its ``integrity_allow`` field, default: nothing).

        Raises:
            pydantic.ValidationError: ``integrity_allow`` is not a list of strings.
        """
        extra = instance.model_extra or {}
        return cls(allow=extra.get(INSTANCE_ALLOW_FIELD) or [])

    def allows(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.allow)


def path_reason(path: str, *, added: bool) -> str | None:
    """Why ``path`` (repository-relative, ``/``-separated) is test infrastructure, or ``None``.

    ``added``: the path does not exist at ``base_commit``. The shadowing rules apply to new
    modules anywhere but to changed ones only at the top level: a repository's own ``_pytest``
    (pytest's) or ``src/pytest.py`` is code under test. ``setup.cfg``/``pyproject.toml`` need
    their contents: see :func:`runner_sections_changed`.
    """
    parts = path.split("/")
    name, dirs = parts[-1], parts[:-1]
    top = parts[0].split(".")[0]
    if name == "conftest.py":
        return _CONFTEST
    if name in _RUNNER_CONFIG_NAMES:
        return _RUNNER_CONFIG
    if _CACHE_DIRS.intersection(dirs) or name.endswith((".pyc", ".pyo")):
        return _CACHE
    if name.endswith(".pth"):
        return _SHADOW
    if any(d.endswith((".egg-info", ".dist-info")) for d in dirs) or name.endswith(".egg-link"):
        return _METADATA
    if (added or len(parts) == 1) and name in _SHADOW_NAMES:
        return _SHADOW
    if (added or len(parts) == 2) and dirs and dirs[0] in _SHADOW_PACKAGES:
        return _SHADOW
    is_module = len(parts) == 1 and name.endswith((".py", ".so", ".pyd"))
    is_package = len(parts) == 2 and name == "__init__.py"
    if added and (is_module or is_package) and top in _TOP_LEVEL_SHADOWS:
        return _TOP_LEVEL
    if _TEST_DIRS.intersection(dirs) or _is_test_module(name):
        return _TEST_CODE
    return None


def _is_test_module(name: str) -> bool:
    return name.endswith(".py") and (
        name.startswith("test_") or name.endswith("_test.py") or name in ("tests.py", "test.py")
    )


def _is_runner_section(name: str) -> bool:
    return name in ("tool:pytest", "pytest", "tox:tox") or name.startswith("testenv")


def _as_pytest_reads(data: str | bytes) -> str | None:
    """``data`` as pytest's ``open(path, encoding="utf-8")`` gives it (universal newlines);
    ``None`` when it is not UTF-8 (pytest stops with a traceback)."""
    if isinstance(data, str):
        return data.replace("\r\n", "\n").replace("\r", "\n")
    try:
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()
    except UnicodeDecodeError:
        return None


def _ini_sections(text: str) -> dict[str, dict[str, str]] | None:
    """The test-runner sections of an ini file read as pytest reads ``setup.cfg``, ``tox.ini``
    and ``pytest.ini`` (``_pytest/config/findpaths.py``: ``iniconfig.IniConfig(path)``);
    ``None`` where pytest stops with a usage error (``iniconfig.ParseError``).

    Not ``configparser``: the two disagree on what a line is (``\\f``, ``\\r``, ``\\x85``,
    ``U+2028`` end one for pytest), on section headers (pytest cuts ``[tool:pytest] # ]`` at the
    comment; a ``[`` line without a closing ``]`` continues the previous value) and on
    duplicates (merged by ``configparser``, an error for pytest).
    """
    iniconfig = require("iniconfig", "eval")
    try:
        parsed = iniconfig.IniConfig("setup.cfg", data=text)
    except iniconfig.ParseError:
        return None
    return {
        name: dict(values) for name, values in parsed.sections.items() if _is_runner_section(name)
    }


def _toml_sections(text: str) -> dict[str, Any] | None:
    if sys.version_info >= (3, 11):
        import tomllib

        try:
            tool = tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return None
        if not isinstance(tool, dict):
            return None
        return {k: v for k, v in tool.items() if k in ("pytest", "tox")}
    return None  # no tomllib: any change counts (documented, conservative)


def _sections(name: str, data: str | bytes) -> dict[str, Any] | None:
    text = _as_pytest_reads(data)
    if text is None:
        return None
    return _ini_sections(text) if name == "setup.cfg" else _toml_sections(text)


def runner_sections_changed(
    path: str, before: str | bytes | None, after: str | bytes | None
) -> str | None:
    """The revert reason when ``path`` (a ``setup.cfg`` or ``pyproject.toml``) changed a
    test-runner section between ``before`` and ``after`` (the file's bytes, or text; ``None``:
    absent), else ``None``.

    Each file is read with the parser pytest reads it with: ``iniconfig`` for ``setup.cfg``,
    ``tomllib`` for ``pyproject.toml``, both after pytest's UTF-8 decoding. A file pytest
    cannot read (not UTF-8, a parse error; on Python 3.10, any changed ``pyproject.toml``)
    counts as changed: the runner would read it in ways this check cannot follow.
    """
    name = path.rsplit("/", 1)[-1]
    old = _sections(name, before) if before is not None else {}
    new = _sections(name, after) if after is not None else {}
    if old is None or new is None:
        return runner_sections_reason(path, "cannot be parsed")
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if not changed:
        return None
    return runner_sections_reason(path, ", ".join(changed))


def runner_sections_reason(path: str, sections: str) -> str:
    """The revert reason of the sectioned file ``path`` whose ``sections`` changed (or why it
    could not be judged)."""
    return _RUNNER_SECTIONS.format(name=path.rsplit("/", 1)[-1], sections=sections)


def is_sectioned(path: str) -> bool:
    return path.rsplit("/", 1)[-1] in SECTIONED_FILES


def select(
    changed: Sequence[tuple[str, bool]], policy: RevertPolicy, test_files: Sequence[str]
) -> list[RevertedFile]:
    """The files of ``changed`` (``(path, added)`` pairs) that the rules revert, except the
    sectioned files (decided by :func:`runner_sections_changed`)."""
    out = []
    tests = set(test_files)
    for path, added in changed:
        if path in tests:
            out.append(RevertedFile(path=path, reason=_TEST_PATCH))
            continue
        if policy.allows(path):
            continue
        reason = path_reason(path, added=added)
        if reason:
            out.append(RevertedFile(path=path, reason=reason))
    return out
