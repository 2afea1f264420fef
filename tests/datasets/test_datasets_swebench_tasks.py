"""swebench 5.x task repositories and rows that carry their eval script, under either harness.

CI installs swebench 4.1 (``sandlot[eval]``); these tests read a 5.x-style task repository
made in ``tmp_path``, so the 5.x path runs there too. The tests marked for one release compare
with that release's own code (5.x: ``swebench.task.repo``; 4.1: its eval-script writer) and
run wherever it is installed (``pip install 'sandlot[eval5]'`` for 5.x).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from requirements import EVAL, need_module

from sandlot.cli.main import cli
from sandlot.datasets.errors import DatasetError
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sources import read_source
from sandlot.datasets.swebench_specs import SpecError, resolve_log_parser, resolve_test_cmd
from sandlot.datasets.swebench_tasks import (
    TaskRepoError,
    command_of_eval_script,
    iter_task_records,
    specs_missing_reason,
)
from sandlot.rewards.grading import grade

need_module("swebench.harness.grading", EVAL)

SWEBENCH_5 = importlib.util.find_spec("swebench.task") is not None
SWEBENCH_4 = importlib.util.find_spec("swebench.harness.test_spec") is not None

CRLF_PATCH = "diff --git a/x b/x\r\n--- a/x\r\n+++ b/x\r\n+one\r\n"
TEST_PATCH = (
    "diff --git a/tests/test_w.py b/tests/test_w.py\n--- a/tests/test_w.py\n"
    "+++ b/tests/test_w.py\n@@ -1 +1,2 @@\n x = 1\n+# : '>>>>> Start Test Output'\n"
)


def eval_script(test_cmd: str, test_patch: str = TEST_PATCH) -> str:
    """An eval script laid out as swebench 4.1's ``make_eval_script_list_py`` writes it (and as
    5.x task repositories keep it in ``eval.sh``)."""
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
            "cd /testbed",
            "git checkout 0123abcd tests/test_w.py",
            f"git apply -v - <<'EOF_114329324912'\n{test_patch}\nEOF_114329324912",
            ": '>>>>> Start Test Output'",
            test_cmd,
            ": '>>>>> End Test Output'",
            "git checkout 0123abcd tests/test_w.py",
            "",
        ]
    )


def make_task(repo: Path, instance_id: str, **meta: Any) -> Path:
    """One ``tasks/<instance_id>/`` directory, with the files ``swebench.task.checks`` requires."""
    task = repo / "tasks" / instance_id
    task.mkdir(parents=True)
    fields = {
        "instance_id": instance_id,
        "repo": "acme/widget",
        "version": "1.0",
        "base_commit": "0123abcd",
        "split": "test",
        "datasets": ["acme/widget-bench"],
        "image": f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        **meta,
    }
    (task / "task.yaml").write_text(yaml.safe_dump(fields))
    (task / "tests.json").write_text(
        json.dumps({"FAIL_TO_PASS": ["tests/test_w.py::test_a"], "PASS_TO_PASS": []})
    )
    (task / "problem_statement.md").write_text(f"the issue of {instance_id}")
    with open(task / "gold.patch", "w", newline="") as fh:
        fh.write(CRLF_PATCH)
    (task / "test.patch").write_text(TEST_PATCH)
    (task / "eval.sh").write_text(eval_script("pytest -rA tests/test_w.py"))
    (task / "Dockerfile").write_text("FROM scratch\n")
    return task


@pytest.fixture
def task_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "widget-tasks"
    repo.mkdir()
    (repo / "sweb.yaml").write_text(
        yaml.safe_dump({"datasets": ["acme/widget-bench"], "splits": ["test"]})
    )
    make_task(repo, "acme__widget-2")
    make_task(repo, "acme__widget-1", eval_type="fail_only", log_parser="parse_log_django")
    return repo


def rows(repo: Path) -> dict[str, dict[str, Any]]:
    return {row["instance_id"]: row for _, row in iter_task_records(repo)}


def test_task_repo_rows_hold_every_file_and_list(task_repo: Path) -> None:
    read = list(iter_task_records(task_repo))
    assert [where for where, _ in read] == ["tasks/acme__widget-1", "tasks/acme__widget-2"]
    row = read[1][1]
    assert row["patch"] == CRLF_PATCH  # a patch's CRLF survives, or it no longer applies
    assert row["test_patch"] == TEST_PATCH
    assert row["FAIL_TO_PASS"] == ["tests/test_w.py::test_a"]
    assert row["hints_text"] == ""
    assert row["eval_script"].startswith("#!/bin/bash")


def test_test_command_is_what_the_eval_script_runs_between_its_markers() -> None:
    # The test patch quotes a start marker inside the heredoc; the real one comes after it.
    assert command_of_eval_script(eval_script("pytest -rA a.py")) == "pytest -rA a.py"
    two = eval_script("npx jest a.test.js\nnpx jest b.test.js")
    assert command_of_eval_script(two) == "npx jest a.test.js\nnpx jest b.test.js"
    assert command_of_eval_script("#!/bin/bash\npytest\n") is None
    assert command_of_eval_script(": '>>>>> Start Test Output'\npytest\n") is None


def test_a_row_with_its_eval_script_runs_under_either_harness(task_repo: Path) -> None:
    inst = Instance(**rows(task_repo)["acme__widget-1"])
    assert resolve_test_cmd(inst) == "pytest -rA tests/test_w.py"
    assert resolve_log_parser(inst).__name__ == "parse_log_django"


def test_a_fail_only_row_is_graded_by_its_own_rule(task_repo: Path) -> None:
    fail_only = Instance(**{**rows(task_repo)["acme__widget-1"], "log_parser": None})
    both = Instance(**rows(task_repo)["acme__widget-2"])
    log = "PASSED tests/test_other.py::test_b\n"  # says nothing of test_a
    parser = resolve_log_parser(both)
    assert grade(fail_only, log, parser=parser, tests_exit_code=0).resolved
    assert not grade(both, log, parser=parser, tests_exit_code=0).resolved


def test_an_unknown_eval_type_names_the_row_and_the_values(task_repo: Path) -> None:
    inst = Instance(**{**rows(task_repo)["acme__widget-2"], "eval_type": "fail_first"})
    with pytest.raises(TaskRepoError, match=r"acme__widget-2.*fail_first.*pass_and_fail"):
        grade(inst, "", parser=resolve_log_parser(inst), tests_exit_code=0)


def test_a_broken_task_names_its_file(task_repo: Path) -> None:
    (task_repo / "tasks" / "acme__widget-2" / "eval.sh").unlink()
    with pytest.raises(DatasetError, match=r"acme__widget-2/eval\.sh: missing"):
        list(iter_task_records(task_repo))
    (task_repo / "tasks" / "acme__widget-1" / "tests.json").write_text("{")
    with pytest.raises(DatasetError, match=r"acme__widget-1/tests\.json: cannot read"):
        list(iter_task_records(task_repo))


def test_prepare_reads_a_task_repository_and_eval_points_there(task_repo: Path) -> None:
    assert [where for where, _ in read_source(str(task_repo), split="test")] == [
        "tasks/acme__widget-1",
        "tasks/acme__widget-2",
    ]
    with pytest.raises(DatasetError, match="data prepare swe_bench_verified --input"):
        load_instances(task_repo)


def test_cli_eval_of_a_task_repository_says_how_to_convert_it(
    task_repo: Path, tmp_path: Path
) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text("")
    result = CliRunner().invoke(
        cli, ["eval", "--dataset", str(task_repo), "--predictions", "gold", "--backend", "local"]
    )
    assert result.exit_code != 0
    # (the first line says which backend was chosen and where from)
    assert any(line.startswith("Error: ") for line in result.output.splitlines())
    assert "data prepare swe_bench_verified --input" in result.output
    assert "Traceback" not in result.output


def test_cli_prepare_turns_a_task_repository_into_rows(task_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "data",
            "prepare",
            "swe_bench_verified",
            "--input",
            str(task_repo),
            "--backend",
            "docker",
            "--local-save-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    by_id = {i.instance_id: i for i in load_instances(out / "swe_bench_verified_docker.parquet")}
    inst = by_id["acme__widget-1"]
    assert inst.image_for("docker") == rows(task_repo)["acme__widget-1"]["image"]
    assert resolve_test_cmd(inst) == "pytest -rA tests/test_w.py"
    assert inst.log_parser == "parse_log_django"


@pytest.mark.skipif(not SWEBENCH_5, reason="compares with swebench 5.x's own task reader")
def test_rows_are_those_swebench_5_reads(task_repo: Path) -> None:
    from swebench.task.repo import load_task_repo  # type: ignore[import-not-found]

    theirs = {row["instance_id"]: row for row in load_task_repo(task_repo)}
    assert rows(task_repo) == theirs


@pytest.mark.skipif(not SWEBENCH_5, reason="swebench 5.x has no per-repository specifications")
def test_under_swebench_5_a_row_without_script_says_what_to_do() -> None:
    reason = specs_missing_reason()
    assert reason is not None and "task repositories" in reason
    inst = Instance(
        instance_id="django__django-1",
        repo="django/django",
        version="3.0",
        base_commit="0123abcd",
        test_patch=TEST_PATCH,
        FAIL_TO_PASS=["a"],
    )
    with pytest.raises(SpecError, match=r"django__django-1.*eval_script.*swebench 4\.1"):
        resolve_test_cmd(inst)


@pytest.mark.skipif(not SWEBENCH_4, reason="compares with swebench 4.1's eval-script writer")
@pytest.mark.parametrize(
    ("repo", "version", "test_file"),
    [
        ("astropy/astropy", "5.0", "astropy/io/tests/test_x.py"),
        ("django/django", "3.0", "tests/admin_views/tests.py"),
        ("sympy/sympy", "1.9", "sympy/core/tests/test_basic.py"),
    ],
)
def test_the_script_command_is_the_one_4_1_composes_from_its_specs(
    repo: str, version: str, test_file: str
) -> None:
    constants = need_module("swebench.harness.constants", EVAL)
    create_scripts = need_module("swebench.harness.test_spec.create_scripts", EVAL)
    patch = f"diff --git a/{test_file} b/{test_file}\n--- a/{test_file}\n+++ b/{test_file}\n"
    inst = Instance(
        instance_id="x__y-1",
        repo=repo,
        version=version,
        base_commit="0123abcd",
        test_patch=patch,
        FAIL_TO_PASS=["a"],
    )
    specs = constants.MAP_REPO_VERSION_TO_SPECS[repo][version]
    lines = create_scripts.make_eval_script_list(
        inst.model_dump(), specs, "testbed", "/testbed", inst.base_commit, patch
    )
    from_script = command_of_eval_script("\n".join(lines))
    assert from_script == resolve_test_cmd(inst)
    assert resolve_test_cmd(Instance(**inst.model_dump(), eval_script="\n".join(lines))) == (
        from_script
    )


@pytest.mark.skipif(not SWEBENCH_5, reason="swebench 5.x's SUITE_RAN check")
def test_under_swebench_5_a_fail_only_row_whose_suite_never_ran_is_not_resolved(
    task_repo: Path,
) -> None:
    inst = Instance(**rows(task_repo)["acme__widget-1"])  # fail_only
    graded = grade(
        inst,
        "error: browser failed to launch\n",
        parser=resolve_log_parser(inst),
        tests_exit_code=0,
    )
    assert not graded.resolved
    assert "no sign that a test suite ran" in graded.warnings[-1]
