"""`sandlot data selftest` on swe-mini's real rows mixed with broken ones: it keeps exactly the
good rows, names each bad row's reason, and the kept file evaluates gold N/N."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo_paths import EXAMPLES
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, importable, needs

from sandlot.cli.main import cli
from sandlot.datasets.loaders import iter_records, load_instances
from sandlot.datasets.parquet import write_rows
from sandlot.datasets.rows import TaskRow, build_row

SWE_MINI = EXAMPLES / "swe-mini"

COINS = """\
diff --git a/tests/test_coins.py b/tests/test_coins.py
new file mode 100644
--- /dev/null
+++ b/tests/test_coins.py
@@ -0,0 +1,8 @@
+import os
+
+import pytest
+
+
+@pytest.mark.parametrize("coin", range(20))
+def test_coin(coin):
+    assert os.urandom(1)[0] % 2
"""
"""Twenty tests that pass or fail at random: two runs fail the same ones with probability
2**-20, so the row is flaky in every run of this test but one in a million."""

REASONS = {
    "bad__nonexistent-f2p": "gold_does_not_resolve",
    "bad__f2p-passes-before": "f2p_passes_before",
    "bad__missing-commit": "repository_unavailable",
    "bad__flaky": "flaky",
}


def _broken(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One broken row per case of :data:`REASONS`, made from swe-mini's."""
    calc, case, money = (
        rows["minicalc__minicalc-1"],
        rows["textkit__textkit-2"],
        rows["ledger__ledger-1"],
    )
    missing = dict(calc, instance_id="bad__nonexistent-f2p")
    missing["FAIL_TO_PASS"] = ["tests/test_evaluator.py::test_that_does_not_exist"]
    passes = dict(case, instance_id="bad__f2p-passes-before")
    passes["FAIL_TO_PASS"] = case["FAIL_TO_PASS"] + case["PASS_TO_PASS"][:1]
    passes["PASS_TO_PASS"] = case["PASS_TO_PASS"][1:]
    commit = dict(money, instance_id="bad__missing-commit", base_commit="0123456789" * 4)
    flaky = dict(calc, instance_id="bad__flaky", test_patch=calc["test_patch"] + COINS)
    flaky["PASS_TO_PASS"] = calc["PASS_TO_PASS"] + [
        f"tests/test_coins.py::test_coin[{i}]" for i in range(20)
    ]
    flaky["test_cmd"] = calc["test_cmd"] + " tests/test_coins.py"
    return [missing, passes, commit, flaky]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """swe-mini's rows (their repositories built beside) with the broken rows among them;
    and the good rows' ids."""
    root = tmp_path_factory.mktemp("selftest")
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(root / "repos")],
        check=True,
        capture_output=True,
    )
    good = [json.loads(line) for line in (SWE_MINI / "instances.jsonl").read_text().splitlines()]
    bad = _broken({r["instance_id"]: r for r in good})
    rows = good[:3] + bad[:2] + good[3:6] + bad[2:] + good[6:]
    path = root / "instances.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["instance_id"] for r in good]


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _selftest_then_eval(mixed: tuple[Path, list[str]], tmp_path: Path, *extra: str) -> None:
    dataset, good = mixed
    kept, logs = tmp_path / "kept.jsonl", tmp_path / "logs"
    args = ["data", "selftest", "--dataset", str(dataset), "--repeats", "2", "-j", "4", *extra]
    args += ["--output", str(kept), "--output-dir", str(logs), "--run-id", "st"]
    code, out = _invoke(*args)
    assert code == 0, out
    assert "8/12 rows kept" in out
    report = json.loads((logs / "st" / "selftest.json").read_text())
    assert report["kept_ids"] == good
    assert (report["bad_rows"], report["infrastructure_errors"]) == (4, 0)
    rows = {row["instance_id"]: row for row in report["rows"]}
    assert {iid: rows[iid]["reason"] for iid in REASONS} == REASONS
    assert "test_that_does_not_exist" in rows["bad__nonexistent-f2p"]["detail"]
    assert "reference is not a tree" in rows["bad__missing-commit"]["detail"]
    assert all(Path(row["log"]).is_file() for row in rows.values())
    written = [json.loads(line) for line in kept.read_text().splitlines()]
    assert [r["instance_id"] for r in written] == good
    shutil.copytree(dataset.parent / "repos", tmp_path / "repos")  # the rows' repo_source
    code, out = _invoke(
        "eval", "--dataset", str(kept), "--predictions", "gold", *extra,
        "--output-dir", str(tmp_path / "eval"),
    )  # fmt: skip
    assert code == 0, out
    assert "8/8 resolved" in out


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_selftest_keeps_exactly_the_good_rows_on_local(
    mixed: tuple[Path, list[str]], tmp_path: Path
) -> None:
    _selftest_then_eval(mixed, tmp_path, "--backend", "local")


@needs(importable("swebench", EVAL), docker_engine_missing)
@pytest.mark.e2e
def test_selftest_keeps_exactly_the_good_rows_on_docker(
    mixed: tuple[Path, list[str]], tmp_path: Path
) -> None:
    _selftest_then_eval(mixed, tmp_path, "--backend", "docker", "--image", TEST_IMAGE)


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_a_rerun_with_the_run_id_evaluates_nothing_again(
    mixed: tuple[Path, list[str]], tmp_path: Path
) -> None:
    dataset, _ = mixed
    two = [r for r in dataset.read_text().splitlines() if '"bad__missing-commit"' in r][:1]
    two += dataset.read_text().splitlines()[:1]  # minicalc__minicalc-1
    small = dataset.with_name("two.jsonl")
    small.write_text("".join(line + "\n" for line in two))
    args = ["data", "selftest", "--dataset", str(small), "--backend", "local"]
    args += ["--output-dir", str(tmp_path), "--run-id", "again"]
    code, first = _invoke(*args)
    assert code == 0, first
    results = sorted((tmp_path / "again").glob("*/*/result.json"))
    finished = {p: p.stat().st_mtime_ns for p in results if (p.parent / "report.json").exists()}
    assert len(finished) == 2  # the good row's two; the missing commit's errored
    report = json.loads((tmp_path / "again" / "selftest.json").read_text())
    code, second = _invoke(*args)
    assert code == 0, second
    assert "resumed 2 finished evaluation(s)" in second
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    assert json.loads((tmp_path / "again" / "selftest.json").read_text()) == report


def test_an_output_in_another_format_is_refused_before_anything_runs(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    shutil.copy(SWE_MINI / "instances.jsonl", dataset)
    code, out = _invoke(
        "data", "selftest", "--dataset", str(dataset), "--output", str(tmp_path / "kept.parquet"),
        "--output-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    assert code == 2
    assert "kept.parquet" in out and ".jsonl" in out
    assert not (tmp_path / "logs").exists()


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_verl_parquet_rows_are_judged_and_kept_as_verl_rows(
    mixed: tuple[Path, list[str]], tmp_path: Path
) -> None:
    dataset, _ = mixed
    chosen = {"textkit__textkit-1", "bad__f2p-passes-before"}
    instances = [  # as `sandlot data prepare` writes them: the backend's image chosen
        i.model_copy(update={"image": i.image_for("local")})
        for i in load_instances(dataset)
        if i.instance_id in chosen
    ]
    rows = [
        build_row(
            inst, index=n, prompt=[{"role": "user", "content": inst.problem_statement}],
            data_source="swe-mini", reward_name="swe", backend="local",
        )
        for n, inst in enumerate(instances)
    ]  # fmt: skip
    source = write_rows(rows, tmp_path / "rows.parquet")
    code, out = _invoke(
        "data", "selftest", "--dataset", str(source), "--backend", "local",
        "--output", str(tmp_path / "kept.parquet"), "--output-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    assert code == 0, out
    assert "1/2 rows kept" in out and "f2p_passes_before" in out
    kept = [TaskRow.from_record(r) for _, r in iter_records(tmp_path / "kept.parquet")]
    assert kept == [r for r in rows if r.extra_info.instance_id == "textkit__textkit-1"]
