"""``sandlot eval``/``rollout`` exit statuses (README's table), the subset of a larger predictions
file, reports written whole, resume keyed by the patch, and errors pointing at their log."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from evalcli_support import fix, make_mirrors, write_rows
from requirements import EVAL, bwrap_missing, importable, needs
from test_evalcli_sources import invoke

from sandlot.cli.exit_codes import ExitCode

LOCAL = needs(bwrap_missing, importable("swebench", EVAL))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """(the mirror directory, the two rows)."""
    return make_mirrors(tmp_path_factory.mktemp("exit"))


def _eval(rows: Path, preds: str, out: Path, mirrors: Path, *extra: str) -> tuple[int, str]:
    return invoke(
        "eval",
        "--dataset",
        str(rows),
        "--predictions",
        preds,
        "--backend",
        "local",
        "--repo-mirror",
        str(mirrors),
        "--run-id",
        "r",
        "--output-dir",
        str(out),
        *extra,
    )


def _preds(path: Path, patches: dict[str, str], model: str = "m") -> Path:
    return write_rows(
        path,
        [
            {"instance_id": iid, "model_name_or_path": model, "model_patch": patch}
            for iid, patch in patches.items()
        ],
    )


def test_an_empty_dataset_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "rows.jsonl"
    empty.write_text("")
    code, out = invoke("eval", "--dataset", str(empty), "--predictions", "gold")
    assert code == ExitCode.BAD_INPUT and "holds no instances" in out
    config = tmp_path / "c.yaml"
    config.write_text("interaction:\n  max_turns: 3\n")
    code, out = invoke(
        "rollout",
        *("--dataset", str(empty), "--config", str(config)),
        *("--base-url", "http://127.0.0.1:9/v1", "--model", "m"),
    )
    assert code == ExitCode.BAD_INPUT and "no rows" in out


def test_predictions_for_none_of_the_selected_instances_are_an_error(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    preds = _preds(tmp_path / "p.jsonl", {"acme__beta-1": "x"})
    code, out = _eval(
        dataset, str(preds), tmp_path / "logs", mirrors, "--instance-ids", "acme__alpha-1"
    )
    assert code == ExitCode.BAD_INPUT and "nothing to evaluate" in out and "p.jsonl" in out


def test_an_output_dir_that_cannot_be_created_is_refused(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out = _eval(dataset, "gold", blocker / "logs", mirrors)
    assert code == ExitCode.BAD_INPUT and "choose another --output-dir" in out


@pytest.mark.e2e
def test_a_disk_that_fills_mid_run_is_one_error_line(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty patches are graded without a sandbox: the failure is the first write."""
    import sandlot.rewards.runner as runner

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runner, "write_text_atomic", full)
    mirrors, rows = made
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    preds = _preds(tmp_path / "p.jsonl", {"acme__alpha-1": "", "acme__beta-1": ""})
    code, out = _eval(dataset, str(preds), tmp_path / "logs", mirrors)
    assert code == ExitCode.OUTPUT_FAILED
    assert "No space left on device" in out and "--run-id r" in out


@pytest.mark.e2e
def test_a_report_is_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandlot.rewards.run_report import write_json_atomic

    report = tmp_path / "report.json"
    write_json_atomic(report, {"done": 1})

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(report, {"done": 2})
    assert json.loads(report.read_text()) == {"done": 1}
    assert os.listdir(tmp_path) == ["report.json"]  # no temporary file left


@LOCAL
@pytest.mark.e2e
def test_instance_ids_evaluate_the_subset_of_a_larger_predictions_file(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    preds = _preds(tmp_path / "p.jsonl", {r["instance_id"]: r["patch"] for r in rows})
    code, out = _eval(
        dataset, str(preds), tmp_path / "logs", mirrors, "--instance-ids", "acme__alpha-1"
    )
    assert code == ExitCode.OK, out
    report = json.loads((tmp_path / "logs" / "r" / "m.r.json").read_text())
    assert report["total_instances"] == report["submitted_instances"] == 1
    assert report["resolved_ids"] == ["acme__alpha-1"]


@LOCAL
@pytest.mark.e2e
def test_an_errored_instance_exits_1_and_points_at_its_log(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    ghost = {**rows[0], "instance_id": "acme__alpha-2", "base_commit": "0" * 40}
    dataset = write_rows(tmp_path / "rows.jsonl", [rows[0], ghost])
    code, out = _eval(dataset, "gold", tmp_path / "logs", mirrors)
    assert code == ExitCode.ERRORS
    log = tmp_path / "logs" / "r" / "gold" / "acme__alpha-2" / "run_instance.log"
    assert log.is_file() and "1 evaluation(s) errored (acme__alpha-2)" in out
    assert "--run-id r" in out
    assert f"  acme__alpha-2: {log}\n" in out  # one line, unwrapped, to copy


@LOCAL
@pytest.mark.e2e
def test_tests_that_give_no_result_exit_3(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Gold resolves nothing because the environment runs no test: not the patches."""
    mirrors, rows = made
    silent = [{**row, "test_cmd": "true"} for row in rows[:1]]
    code, out = _eval(write_rows(tmp_path / "rows.jsonl", silent), "gold", tmp_path, mirrors)
    assert code == ExitCode.NOTHING_RESOLVED and "no test gave a result" in out


@LOCAL
@pytest.mark.e2e
def test_resume_re_evaluates_a_changed_patch_and_a_truncated_report(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    alpha, beta = (r["instance_id"] for r in rows)
    wrong = fix("mul", "return a + b", "return a - b")
    first = _preds(tmp_path / "p.jsonl", {alpha: rows[0]["patch"], beta: wrong})
    logs = tmp_path / "logs"
    code, out = _eval(dataset, str(first), logs, mirrors)
    assert code == ExitCode.OK, out
    run_report = logs / "r" / "m.r.json"
    assert json.loads(run_report.read_text())["unresolved_ids"] == [beta]

    # Same run id and model, beta's patch now the fix; alpha's report cut short by a crash.
    second = _preds(tmp_path / "p2.jsonl", {alpha: rows[0]["patch"], beta: rows[1]["patch"]})
    cut = logs / "r" / "m" / alpha / "report.json"
    cut.write_text(cut.read_text()[:20])
    code, out = _eval(dataset, str(second), logs, mirrors)
    assert code == ExitCode.OK, out
    assert json.loads(run_report.read_text())["resolved_ids"] == [alpha, beta]
    assert json.loads(cut.read_text())[alpha]["resolved"] is True
    # unchanged and whole: resumed
    code, out = _eval(dataset, str(second), logs, mirrors)
    assert code == ExitCode.OK
    assert "resumed from earlier run             │ 2 " in out, out


def test_a_rollout_output_that_cannot_be_created_is_refused(
    made: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    mirrors, rows = made
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = tmp_path / "c.yaml"
    config.write_text("interaction:\n  max_turns: 3\n")
    code, out = invoke(
        "rollout",
        *("--dataset", str(write_rows(tmp_path / "rows.jsonl", rows)), "--config", str(config)),
        *("--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--repo-mirror", str(mirrors)),
        *("--output", str(blocker / "out"), "--no-preflight"),  # the command's own check
    )
    assert code == ExitCode.BAD_INPUT and str(blocker) in out
