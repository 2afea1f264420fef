"""Evaluations on the local backend use the instance's own environment, and say when the test
runner is missing or the environment cannot be built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import EVAL, bwrap_missing, need_module, needs

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.result import EvalResult, EvalStatus
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.local import venv

need_module("swebench", EVAL)
pytestmark = needs(bwrap_missing)

EXAMPLES = REPO_EXAMPLES / "swe-mini"


@pytest.fixture(scope="module")
def minicalc(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    dest = tmp_path_factory.mktemp("repos")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    inst = next(
        i
        for i in load_instances(EXAMPLES / "instances.jsonl")
        if i.instance_id == "minicalc__minicalc-1"
    )
    return inst.model_copy(update={"repo_source": str(dest / "minicalc")})


def _evaluate(inst: Instance) -> EvalResult:
    return anyio.run(lambda: evaluate(inst, inst.patch, backend="local"))


@pytest.mark.e2e
def test_tests_run_on_the_instance_environment_not_the_callers_python(
    minicalc: Instance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(venv.CACHE_ENV, str(tmp_path / "envs"))
    assert minicalc.environment is not None and "pytest" in minicalc.environment.pip_packages
    probe = "python3 -c 'import sys, pytest; print(\"PREFIX\", sys.prefix)'\n"
    result = _evaluate(minicalc.model_copy(update={"test_cmd": probe + minicalc.test_cmd}))
    assert result.status is EvalStatus.RESOLVED, result.error
    [env] = venv.list_environments(tmp_path / "envs")
    assert f"PREFIX {env.path}\n" in result.log


def test_a_missing_test_runner_is_an_error_that_names_it(minicalc: Instance) -> None:
    inst = minicalc.model_copy(
        update={"environment": None, "test_cmd": "python3 -m sandlot_no_such_runner -rA"}
    )
    result = _evaluate(inst)
    assert result.status is EvalStatus.ERROR
    assert result.error is not None
    assert "test runner is missing" in result.error
    assert "No module named sandlot_no_such_runner" in result.error


def test_a_command_not_found_is_an_error_that_names_it(minicalc: Instance) -> None:
    inst = minicalc.model_copy(update={"test_cmd": "sandlot-no-such-test-tool -q"})
    result = _evaluate(inst)
    assert result.status is EvalStatus.ERROR
    assert result.error is not None and "sandlot-no-such-test-tool: command not found" in (
        result.error
    )


def test_an_environment_that_cannot_be_built_is_an_error_naming_the_package(
    minicalc: Instance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(venv.CACHE_ENV, str(tmp_path / "envs"))
    missing = "/nonexistent/sandlot_absent-1.0-py3-none-any.whl"
    recipe = EnvironmentRecipe(pip_packages=["pytest", missing])
    inst = minicalc.model_copy(update={"environment": recipe})
    result = _evaluate(inst)
    assert result.status is EvalStatus.ERROR
    assert result.error is not None
    assert result.error.startswith("environment build failed")
    assert "sandlot_absent" in result.error
    assert venv.list_environments(tmp_path / "envs") == []
