"""Prepared rows run on the local backend: gold patches resolve, no future history is visible."""

from __future__ import annotations

import shlex
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner
from dataprep_support import EXAMPLES, MINICALC_BASE, MINICALC_LATER, run_prepare
from requirements import EVAL, bwrap_missing, need_module, needs

from sandlot.cli.main import cli
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sandbox_setup import fetch_repo_script, instance_spec, prepare_repo
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.predictions import Prediction
from sandlot.rewards.result import EvalStatus
from sandlot.rewards.runner import run_evaluation
from sandlot.rollout.rows import load_rows
from sandlot.sandboxes.open import open as open_sandbox

need_module("swebench", EVAL)
pytestmark = needs(bwrap_missing)


def _gold(instances: list[Instance]) -> dict[str, Prediction]:
    return {
        i.instance_id: Prediction(
            instance_id=i.instance_id, model_name_or_path="gold", model_patch=i.patch
        )
        for i in instances
    }


def _evaluate_gold(parquet: Path, out: Path) -> dict[str, EvalStatus]:
    instances = load_instances(parquet)
    outcome = anyio.run(
        lambda: run_evaluation(
            instances, _gold(instances), run_id="gold", output_dir=out, backend="local", workers=4
        )
    )
    return {k: r.status for k, r in outcome.results.items()}


@pytest.mark.slow
def test_swe_mini_through_the_swe_bench_verified_path_resolves_gold(
    tmp_path: Path, mirror: Path
) -> None:
    result = run_prepare(
        "swe_bench_verified",
        tmp_path,
        "local",
        input=EXAMPLES / "instances.jsonl",
        repo_mirror=str(mirror),
    )
    statuses = _evaluate_gold(result.path, tmp_path / "logs")
    assert len(statuses) == 8
    assert set(statuses.values()) == {EvalStatus.RESOLVED}, statuses


@pytest.mark.e2e
def test_sandlot_eval_grades_swe_rebench_local_rows(tmp_path: Path, mirror: Path) -> None:
    """`sandlot eval --dataset X.parquet`: setup (history cleanup + pip install), gold resolves."""
    result = run_prepare("swe_rebench", tmp_path, "local", repo_mirror=str(mirror))
    args = ["eval", "--dataset", str(result.path), "--predictions", "gold", "--backend", "local"]
    out = CliRunner().invoke(cli, [*args, "--output-dir", str(tmp_path / "logs"), "--run-id", "r"])
    assert out.exit_code == 0, out.output
    assert "2/2 resolved" in out.output


async def _git_view(instance: Instance, *, prepared: bool = True) -> dict[str, str]:
    async with open_sandbox("local", instance_spec(instance, "local")) as sb:
        if prepared:
            await prepare_repo(sb, instance)
        else:  # the clone alone, as prepare_repo makes it before anything is removed
            await sb.upload(str(instance.repo_source), "/tmp/repo")
            script = fetch_repo_script(
                "/tmp/repo", instance.workdir, instance.base_commit, uploaded=True
            )
            assert (await sb.exec(script, timeout=120)).ok
        out = {}
        for name, cmd in {
            "log": "git log --all --format=%H",
            "refs": "git for-each-ref --format='%(refname)'",
            "later": f"git cat-file -t {MINICALC_LATER} 2>&1 || true",
            "reflog": "git reflog --all",
        }.items():
            r = await sb.exec(cmd, timeout=60, cwd=instance.workdir)
            assert r.exit_code == 0, r.stderr
            out[name] = r.stdout.strip()
        return out


@pytest.mark.e2e
def test_git_log_all_shows_nothing_after_base_commit(tmp_path: Path, mirror: Path) -> None:
    result = run_prepare("swe_rebench", tmp_path, "local", repo_mirror=str(mirror))
    [instance] = [i for i in load_instances(result.path) if i.instance_id == "minicalc__minicalc-1"]
    # The clone alone still shows the fix: the check can fail.
    exposed = anyio.run(lambda: _git_view(instance, prepared=False))
    assert MINICALC_LATER in exposed["log"] and "refs/tags/v0.2" in exposed["refs"]
    view = anyio.run(_git_view, instance)
    assert view["log"].split() == [MINICALC_BASE]
    assert view["refs"].split() == ["refs/tags/v0.1"]
    assert "commit" not in view["later"] and view["reflog"] == ""


def test_rows_without_a_test_patch_are_graded_with_the_environment_tests(
    tmp_path: Path, swe_mini_repos: Path
) -> None:
    """R2E-Gym style: the graded tests are put in place by the setup, not by a test patch."""
    [base] = [
        i.model_copy(update={"repo_source": str(swe_mini_repos / "minicalc")})
        for i in load_instances(EXAMPLES / "instances.jsonl")
        if i.instance_id == "minicalc__minicalc-3"
    ]
    hidden = "def test_power_is_right_associative():\n" + (
        "    from minicalc import evaluate\n    assert evaluate('2 ^ 3 ^ 2') == 512\n"
    )
    instance = base.model_copy(
        update={
            "test_patch": "",
            "post_setup_cmd": f"mkdir -p $HOME/r2e_tests && printf %s {shlex.quote(hidden)} "
            "> $HOME/r2e_tests/test_1.py",
            "test_cmd": "rm -rf r2e_tests && ln -s $HOME/r2e_tests r2e_tests\n"
            "python -m pytest --no-header -rA -p no:cacheprovider r2e_tests\nrc=$?\n"
            "rm -f r2e_tests\nexit $rc",
            "FAIL_TO_PASS": ["r2e_tests/test_1.py::test_power_is_right_associative"],
            "PASS_TO_PASS": [],
        }
    )
    gold = anyio.run(lambda: evaluate(instance, instance.patch, backend="local"))
    assert gold.status == EvalStatus.RESOLVED, gold.error or gold.log
    untouched = "diff --git a/README.md b/README.md\n" + (
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# minicalc\n+# minicalc!\n"
    )
    other = anyio.run(lambda: evaluate(instance, untouched, backend="local"))
    assert other.status == EvalStatus.UNRESOLVED, other.error or other.log


HIDDEN_TESTS = """\
from minicalc import evaluate


def test_power():
    assert evaluate("2 ^ 10") == 1024


class TestPrecedence:
    def test_power_binds_tighter_than_multiplication(self):
        assert evaluate("3 * 2 ^ 2") == 12


def test_addition():
    assert evaluate("1 + 2") == 3


def test_modulo():
    assert evaluate("7 % 4") == 3
"""


def test_a_real_format_r2e_row_resolves_with_its_gold_patch_only(
    tmp_path: Path, swe_mini_repos: Path
) -> None:
    """The prepared R2E-Gym row (keys `test_x` / `TestX.test_y`) on the local backend: R2E's
    layout (hidden tests and run_tests.sh under $HOME), its pytest -rA log, its grading."""
    [row] = load_rows(run_prepare("r2e_gym_subset", tmp_path, "docker").path, backend="docker")
    r2e = row.instance
    home = "$HOME"
    layout = (
        f"mkdir -p {home}/r2e_tests && printf %s {shlex.quote(HIDDEN_TESTS)} "
        f"> {home}/r2e_tests/test_1.py && printf %s "
        + shlex.quote("python -m pytest -rA -p no:cacheprovider r2e_tests\n")
        + f" > {home}/run_tests.sh"
    )
    instance = Instance.model_validate(
        {
            **r2e.model_dump(),
            "image": {"local": "host"},
            "repo_source": str(swe_mini_repos / "minicalc"),
            "environment": {"pip_packages": ["pytest"]},
            "env": {},
            "post_setup_cmd": layout,
            "test_cmd": (r2e.test_cmd or "").replace("/root", home),
        }
    )
    gold = anyio.run(lambda: evaluate(instance, instance.patch, backend="local"))
    assert gold.status == EvalStatus.RESOLVED, gold.error or gold.log_warnings or gold.log
    assert gold.tests_status["TestPrecedence.test_power_binds_tighter_than_multiplication"] == (
        "PASSED"
    )
    assert gold.tests_status["test_modulo"] == "FAILED"
    wrong = "diff --git a/README.md b/README.md\n" + (
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# minicalc\n+# minicalc!\n"
    )
    other = anyio.run(lambda: evaluate(instance, wrong, backend="local"))
    assert other.status == EvalStatus.UNRESOLVED, other.error or other.log
    assert other.tests_status["test_power"] == "FAILED"
