"""End-to-end evaluation on the local backend with the swe-mini examples, including bad input,
hostile patches and leak checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import EVAL, bwrap_missing, need_module, needs

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.rewards.evaluation import evaluate
from sandlot.rewards.predictions import Prediction, load_predictions
from sandlot.rewards.result import EvalFailure, EvalResult, EvalStatus
from sandlot.rewards.runner import RunOutcome, run_evaluation

need_module("swebench", EVAL)
pytestmark = needs(bwrap_missing)

EXAMPLES = REPO_EXAMPLES / "swe-mini"


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every local sandbox of this module lives here, so leaks are visible."""
    root = tmp_path_factory.mktemp("sandboxes")
    old = os.environ.get("SANDLOT_LOCAL_ROOT")
    os.environ["SANDLOT_LOCAL_ROOT"] = str(root)
    yield root
    if old is None:
        del os.environ["SANDLOT_LOCAL_ROOT"]
    else:
        os.environ["SANDLOT_LOCAL_ROOT"] = old


@pytest.fixture(scope="module")
def instances(tmp_path_factory: pytest.TempPathFactory, sandbox_root: Path) -> dict[str, Instance]:
    dest = tmp_path_factory.mktemp("repos")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
    )
    out = {}
    for inst in load_instances(EXAMPLES / "instances.jsonl"):
        name = Path(inst.repo_source or "").name
        out[inst.instance_id] = inst.model_copy(update={"repo_source": str(dest / name)})
    return out


def _run(coro_fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    return anyio.run(lambda: coro_fn(*args, **kwargs))


def _processes_with(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(cmdline)
    return found


def _assert_no_leaks(sandbox_root: Path, marker: str | None = None) -> None:
    assert list(sandbox_root.iterdir()) == [], "a sandbox directory was left behind"
    if marker:
        # The jail's init dies of SIGKILL asynchronously, a moment after its parent is reaped.
        deadline = time.monotonic() + 5
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_with(marker) == [], "process left behind"


def _predictions(name: str, insts: dict[str, Instance]) -> dict[str, Prediction]:
    return load_predictions(EXAMPLES / "predictions" / f"{name}.jsonl", insts.values())


def _make_patch(inst: Instance, edits: dict[str, str | None], tmp_path: Path) -> str:
    """A real ``git diff`` of ``edits`` (path → content, None deletes) against base_commit."""
    work = tmp_path / "patchwork"
    subprocess.run(["git", "clone", "-q", str(inst.repo_source), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", inst.base_commit], check=True)
    for rel, content in edits.items():
        target = work / rel
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    diff = subprocess.run(
        ["git", "-C", str(work), "diff", "--cached", inst.base_commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    shutil.rmtree(work)
    return diff


@pytest.mark.slow
def test_gold_wrong_and_empty_runs(
    instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    insts = list(instances.values())
    runs: dict[str, RunOutcome] = {}

    async def run(name: str, run_id: str, workers: int) -> None:
        runs[name] = await run_evaluation(
            insts,
            _predictions(name, instances),
            run_id=run_id,
            output_dir=tmp_path,
            backend="local",
            workers=workers,
        )

    async def all_three() -> None:  # the three runs go at once
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "gold", "g", 3)
            tg.start_soon(run, "wrong", "w", 3)
            tg.start_soon(run, "empty", "e", 4)

    anyio.run(all_three)
    gold, wrong, empty = runs["gold"], runs["wrong"], runs["empty"]
    assert gold.report["resolved_ids"] == sorted(instances)
    assert gold.report["error_ids"] == [] and gold.report["completed_instances"] == len(insts)
    assert all(r.reward == 1.0 for r in gold.results.values())
    one = tmp_path / "g" / "gold" / "ledger__ledger-1"
    for name in ("patch.diff", "eval.sh", "test_output.txt", "report.json", "run_instance.log"):
        assert (one / name).is_file(), name
    assert json.loads((one / "report.json").read_text())["ledger__ledger-1"]["resolved"] is True
    assert json.loads(gold.report_path.read_text())["resolved_instances"] == len(insts)

    assert wrong.report["resolved_ids"] == []
    assert wrong.report["unresolved_instances"] == len(insts)
    broke_p2p = [r for r in wrong.results.values() if r.PASS_TO_PASS.failure]
    assert broke_p2p, "a wrong patch should break a PASS_TO_PASS test"

    assert empty.report["empty_patch_ids"] == sorted(instances)
    assert empty.report["resolved_instances"] == 0
    _assert_no_leaks(sandbox_root)


def test_rerun_with_same_run_id_resumes(
    instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    insts = [instances["ledger__ledger-1"], instances["textkit__textkit-1"]]
    preds = load_predictions("gold", insts)
    first = _run(run_evaluation, insts, preds, run_id="r", output_dir=tmp_path, backend="local")
    assert first.resumed == []
    again = _run(run_evaluation, insts, preds, run_id="r", output_dir=tmp_path, backend="local")
    assert sorted(again.resumed) == sorted(i.instance_id for i in insts)
    assert again.report["resolved_instances"] == 2


def test_bad_patch_is_an_error_and_the_batch_goes_on(
    instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    bad, good = instances["minicalc__minicalc-1"], instances["textkit__textkit-3"]
    preds = {
        bad.instance_id: Prediction(
            instance_id=bad.instance_id,
            model_patch="diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n"
            "@@ -1 +1 @@\n-x\n+y\n",
        ),
        good.instance_id: Prediction(instance_id=good.instance_id, model_patch=good.patch),
    }
    out = _run(run_evaluation, [bad, good], preds, run_id="b", output_dir=tmp_path, backend="local")
    assert out.results[bad.instance_id].status is EvalStatus.PATCH_FAILED
    assert out.results[bad.instance_id].status.value == "error: patch failed to apply"
    assert out.results[bad.instance_id].failure is EvalFailure.PATCH
    assert "nope.py" in (out.results[bad.instance_id].error or "")
    assert out.report["error_ids"] == [bad.instance_id]
    assert out.report["resolved_ids"] == [good.instance_id]
    _assert_no_leaks(sandbox_root)


@pytest.mark.e2e
def test_hanging_tests_are_killed_at_eval_timeout(
    instances: dict[str, Instance], sandbox_root: Path
) -> None:
    marker = "3141.5926"
    inst = instances["ledger__ledger-1"].model_copy(
        update={"test_cmd": f"echo tests-started; sleep {marker}", "eval_timeout": 1.5}
    )
    result: EvalResult = _run(evaluate, inst, inst.patch, backend="local")
    assert result.status is EvalStatus.TIMED_OUT
    assert result.tests_timed_out and not result.resolved and result.reward == 0.0
    assert "tests-started" in result.log
    _assert_no_leaks(sandbox_root, marker)


def test_post_setup_failure_is_an_error_with_its_output(
    instances: dict[str, Instance], sandbox_root: Path
) -> None:
    inst = instances["ledger__ledger-1"].model_copy(
        update={"post_setup_cmd": "echo installing-deps; exit 3"}
    )
    result: EvalResult = _run(evaluate, inst, inst.patch, backend="local")
    assert result.status is EvalStatus.ERROR
    assert "installing-deps" in (result.error or "") and "exit 3" in (result.error or "")
    assert result.failure is EvalFailure.ENVIRONMENT
    _assert_no_leaks(sandbox_root)


@pytest.mark.e2e
def test_an_empty_patch_with_test_empty_runs_the_tests_before_the_fix(
    instances: dict[str, Instance], sandbox_root: Path
) -> None:
    inst = instances["ledger__ledger-1"]
    result: EvalResult = _run(evaluate, inst, "", backend="local", test_empty=True)
    assert result.status is EvalStatus.UNRESOLVED
    assert result.FAIL_TO_PASS.failure == inst.FAIL_TO_PASS
    assert result.PASS_TO_PASS.success == inst.PASS_TO_PASS
    assert result.timings_s["total"] >= result.timings_s["tests"] > 0
    _assert_no_leaks(sandbox_root)


def test_a_base_commit_missing_from_the_repository_is_a_repository_failure(
    instances: dict[str, Instance], sandbox_root: Path
) -> None:
    inst = instances["ledger__ledger-1"].model_copy(update={"base_commit": "0123456789" * 4})
    result: EvalResult = _run(evaluate, inst, inst.patch, backend="local")
    assert result.status is EvalStatus.ERROR and result.failure is EvalFailure.REPOSITORY
    assert "reference is not a tree" in (result.error or "")
    _assert_no_leaks(sandbox_root)


def test_unknown_backend_is_an_error_result(instances: dict[str, Instance]) -> None:
    inst = instances["ledger__ledger-1"]
    result: EvalResult = _run(evaluate, inst, inst.patch, backend="nosuch")
    assert result.status is EvalStatus.ERROR
    assert "nosuch" in (result.error or "") and "local" in (result.error or "")


@pytest.mark.e2e
def test_spoofed_passed_lines_do_not_resolve(
    instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    inst = instances["minicalc__minicalc-1"]
    forged = "".join(f"PASSED {t}\n" for t in inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
    for force_exit_zero in (False, True):
        # The patched conftest prints PASSED lines after pytest's real summary and, in the
        # second variant, also forces exit status 0.
        conftest = (
            "import atexit, os, sys\n\n\n"
            "@atexit.register\n"
            "def _forge():\n"
            f"    sys.stdout.write({forged!r})\n"
            "    sys.stdout.flush()\n" + ("    os._exit(0)\n" if force_exit_zero else "")
        )
        patch = _make_patch(inst, {"conftest.py": conftest}, tmp_path)
        # The log's own defences, without the integrity checks (which revert the conftest:
        # tests/rewards/integrity covers those).
        result: EvalResult = _run(evaluate, inst, patch, backend="local", integrity_checks=False)
        assert result.status is EvalStatus.UNRESOLVED, result.log
        assert "PASSED " + inst.FAIL_TO_PASS[0] in result.log  # the forgery really ran
        assert result.log_warnings
        defended: EvalResult = _run(evaluate, inst, patch, backend="local")
        assert defended.status is EvalStatus.UNRESOLVED, defended.log
        assert [f.path for f in defended.reverted_files] == ["conftest.py"]
        assert "PASSED " + inst.FAIL_TO_PASS[0] not in defended.log
    _assert_no_leaks(sandbox_root)


@pytest.mark.e2e
def test_model_edits_to_test_files_are_undone(
    instances: dict[str, Instance], sandbox_root: Path, tmp_path: Path
) -> None:
    # The model pre-creates the new test file that test_patch adds, with trivial tests of the
    # same names. The reset deletes it, test_patch applies, the real tests run and fail.
    inst = instances["textkit__textkit-1"]
    fakes = "".join(f"def {t.split('::')[1]}():\n    pass\n\n\n" for t in inst.FAIL_TO_PASS)
    patch = _make_patch(inst, {"tests/test_wrap.py": fakes}, tmp_path)
    result: EvalResult = _run(evaluate, inst, patch, backend="local")
    assert result.status is EvalStatus.UNRESOLVED, result.error
    assert result.FAIL_TO_PASS.failure

    # Editing an existing test file that test_patch also edits: undone likewise, and the gold
    # fix still resolves.
    inst = instances["minicalc__minicalc-1"]
    gold_plus_tamper = inst.patch + _make_patch(
        inst, {"tests/test_evaluator.py": "def test_nothing():\n    pass\n"}, tmp_path
    )
    result = _run(evaluate, inst, gold_plus_tamper, backend="local")
    assert result.status is EvalStatus.RESOLVED, result.error or result.log
    _assert_no_leaks(sandbox_root)


def test_the_package_attribute_is_the_async_function_the_readme_awaits() -> None:
    import inspect

    import sandlot.rewards

    assert sandlot.rewards.evaluate is evaluate and inspect.iscoroutinefunction(evaluate)
