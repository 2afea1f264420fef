"""sandlot.datasets.swebench_specs against the installed swebench (4.1) harness."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from requirements import EVAL, need_module

from sandlot.datasets import swebench_specs
from sandlot.datasets.instance import Instance
from sandlot.datasets.swebench_specs import (
    SpecError,
    available_log_parsers,
    resolve_log_parser,
    resolve_test_cmd,
)

constants = need_module("swebench.harness.constants", EVAL)
log_parsers = need_module("swebench.harness.log_parsers", EVAL)
python_parsers = need_module("swebench.harness.log_parsers.python", EVAL)
create_scripts = need_module("swebench.harness.test_spec.create_scripts", EVAL)


def patch_touching(*paths: str) -> str:
    return "".join(
        f"diff --git a/{p} b/{p}\n--- a/{p}\n+++ b/{p}\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
        for p in paths
    )


def instance(**fields: Any) -> Instance:
    data: dict[str, Any] = {
        "instance_id": "acme__widget-1",
        "base_commit": "0123abcd",
        "test_patch": patch_touching("tests/test_w.py"),
        "FAIL_TO_PASS": ["tests/test_w.py::test_a"],
    }
    data.update(fields)
    return Instance(**data)


def harness_test_commands(inst: Instance) -> str:
    """The lines swebench's own eval script runs between its test-output markers."""
    record = inst.model_dump()
    specs = constants.MAP_REPO_VERSION_TO_SPECS[inst.repo][inst.version]
    lines = create_scripts.make_eval_script_list(
        record, specs, "testbed", "/testbed", inst.base_commit, inst.test_patch
    )
    start = lines.index(f": '{constants.START_TEST_OUTPUT}'")
    end = lines.index(f": '{constants.END_TEST_OUTPUT}'")
    return "\n".join(lines[start + 1 : end])


@pytest.fixture
def no_swebench(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make every swebench import fail, as when the ``eval`` extra is not installed."""
    swebench_specs._log_parsers.cache_clear()
    for name in [m for m in sys.modules if m == "swebench" or m.startswith("swebench.")]:
        monkeypatch.setitem(sys.modules, name, None)
    yield
    swebench_specs._log_parsers.cache_clear()


# ------------------------------------------------------------------------------ test commands


def test_explicit_test_cmd_wins_without_importing_swebench(no_swebench: None) -> None:
    inst = instance(repo="astropy/astropy", version="5.0", test_cmd="make check")
    assert resolve_test_cmd(inst) == "make check"


def test_astropy_command_from_specs_and_directives() -> None:
    test_patch = patch_touching(
        "astropy/io/fits/tests/test_checksum.py",
        "astropy/io/fits/tests/data/checksum.fits.json",  # a non-test extension: dropped
        "astropy/units/tests/test_quantity.py",
    )
    inst = instance(repo="astropy/astropy", version="5.0", test_patch=test_patch)
    command = resolve_test_cmd(inst)
    assert command == (
        "pytest -rA astropy/io/fits/tests/test_checksum.py astropy/units/tests/test_quantity.py"
    )
    assert command == harness_test_commands(inst)


def test_django_directives_are_dotted_modules() -> None:
    test_patch = patch_touching(
        "tests/migrations/test_operations.py", "tests/auth_tests/test_models.py"
    )
    inst = instance(repo="django/django", version=3.0, test_patch=test_patch)  # float version
    command = resolve_test_cmd(inst)
    assert command == (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
        "migrations.test_operations auth_tests.test_models"
    )
    assert command == harness_test_commands(inst)


def test_non_python_repo_runs_every_spec_command() -> None:
    repo, version = "micropython/micropython", "15898"
    specs_cmd = constants.MAP_REPO_VERSION_TO_SPECS[repo][version]["test_cmd"]
    assert isinstance(specs_cmd, list) and len(specs_cmd) == 2
    inst = instance(repo=repo, version=version, test_patch=patch_touching("tests/basics/x.py"))
    command = resolve_test_cmd(inst)
    assert command == "\n".join(specs_cmd)
    assert command == harness_test_commands(inst)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, "both repo and version are needed"),
        ({"repo": "django/django"}, "both repo and version are needed"),
        ({"repo": "acme/widget", "version": "1.0"}, "the repo has no specs"),
        ({"repo": "django/django", "version": "9.9"}, "no version '9.9' (known: '1.7'"),
        ({"repo": "dbt-labs/dbt-core", "version": "1.7"}, "the spec has no test_cmd"),
    ],
)
def test_underivable_test_cmd(fields: dict[str, Any], reason: str) -> None:
    inst = instance(**fields)
    with pytest.raises(SpecError) as caught:
        resolve_test_cmd(inst)
    message = str(caught.value)
    assert message.startswith(
        f"instance 'acme__widget-1' (repo {fields.get('repo', '<unset>')!r}, "
        f"version {fields.get('version')!r}) has no test_cmd"
    )
    assert reason in message
    assert message.endswith("set test_cmd on the instance")


def test_missing_swebench_names_the_extra(no_swebench: None) -> None:
    inst = instance(repo="astropy/astropy", version="5.0")
    with pytest.raises(ImportError, match=r"pip install 'sandlot\[eval\]'"):
        resolve_test_cmd(inst)
    with pytest.raises(ImportError, match=r"pip install 'sandlot\[eval\]'"):
        resolve_log_parser(inst)


# ------------------------------------------------------------------------------ log parsers


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("parse_log_pytest", "parse_log_pytest"),
        ("parse_log_django", "parse_log_django"),
        ("django", "parse_log_django"),
        ("sympy", "parse_log_sympy"),
        ("pytest_v2", "parse_log_pytest_v2"),
        ("gotest", "parse_log_gotest"),  # other languages' modules too
    ],
)
def test_parser_by_name(name: str, expected: str) -> None:
    parser = resolve_log_parser(instance(log_parser=name))
    assert parser.__name__ == expected
    assert parser is getattr(sys.modules[parser.__module__], expected)


@pytest.mark.parametrize("repo", ["sympy/sympy", "django/django", "astropy/astropy", "redis/redis"])
def test_parser_by_repo(repo: str) -> None:
    assert resolve_log_parser(instance(repo=repo)) is log_parsers.MAP_REPO_TO_PARSER[repo]


def test_parser_name_overrides_repo() -> None:
    inst = instance(repo="django/django", log_parser="pytest")
    assert resolve_log_parser(inst) is python_parsers.parse_log_pytest


@pytest.mark.parametrize("repo", ["", "acme/widget"])
def test_default_parser_is_pytest(repo: str) -> None:
    parser = resolve_log_parser(instance(repo=repo))
    assert parser is python_parsers.parse_log_pytest
    log = "PASSED tests/test_w.py::test_b\nFAILED tests/test_w.py::test_a - assert 1 == 2\n"
    assert parser(log, None) == {
        "tests/test_w.py::test_b": "PASSED",
        "tests/test_w.py::test_a": "FAILED",
    }


def test_unknown_parser_lists_valid_names() -> None:
    with pytest.raises(SpecError) as caught:
        resolve_log_parser(instance(log_parser="nosetests"))
    message = str(caught.value)
    assert message.startswith("instance 'acme__widget-1': unknown log_parser 'nosetests'; valid")
    for name in ("parse_log_pytest", "parse_log_django", "parse_log_sympy"):
        assert name in message


def test_available_log_parsers() -> None:
    names = available_log_parsers()
    assert names == sorted(names)
    assert {"parse_log_pytest", "parse_log_django", "parse_log_sympy", "parse_log_cargo"} <= set(
        names
    )
    assert all(name.startswith("parse_log_") for name in names)
