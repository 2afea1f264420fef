"""`sandlot eval` from the command line: bad input is named, good input is graded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from repo_paths import EXAMPLES as REPO_EXAMPLES
from requirements import EVAL, bwrap_missing, importable, needs

from sandlot.cli.main import cli

EXAMPLES = REPO_EXAMPLES / "swe-mini"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The swe-mini instances, with their repositories built next to a copy of the file."""
    root = tmp_path_factory.mktemp("swe-mini")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(root / "repos")],
        check=True,
        capture_output=True,
    )
    shutil.copy(EXAMPLES / "instances.jsonl", root / "instances.jsonl")
    return root / "instances.jsonl"


def _eval(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["eval", *args])
    return result.exit_code, result.output


def test_unknown_backend_lists_known_ones(dataset: Path) -> None:
    code, out = _eval("--dataset", str(dataset), "--predictions", "gold", "--backend", "nosuch")
    assert code == 2
    assert "nosuch" in out and "local" in out


def test_unknown_instance_id_in_predictions_names_it_and_the_line(
    dataset: Path, tmp_path: Path
) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps(
            {"instance_id": "ledger__ledger-1", "model_name_or_path": "m", "model_patch": ""}
        )
        + "\n"
        + json.dumps(
            {"instance_id": "ghost__ghost-9", "model_name_or_path": "m", "model_patch": "x"}
        )
        + "\n"
    )
    code, out = _eval("--dataset", str(dataset), "--predictions", str(preds))
    assert code == 2
    assert "ghost__ghost-9" in out and "line 2" in out


def test_missing_instance_field_names_field_and_record(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"instance_id": "x__y-1", "test_patch": "", "FAIL_TO_PASS": ["t"]}) + "\n"
    )
    code, out = _eval("--dataset", str(bad), "--predictions", "gold")
    assert code == 2
    assert "base_commit" in out and "x__y-1" in out


@needs(bwrap_missing, importable("swebench", EVAL))
def test_gold_on_selected_instances(dataset: Path, tmp_path: Path) -> None:
    code, out = _eval(
        "--dataset",
        str(dataset),
        "--predictions",
        "gold",
        "--backend",
        "local",
        "--instance-ids",
        "ledger__ledger-1,textkit__textkit-2",
        "--run-id",
        "cli",
        "--output-dir",
        str(tmp_path),
        "-j",
        "2",
    )
    assert code == 0, out
    assert "2/2 resolved" in out
    report = json.loads((tmp_path / "cli" / "gold.cli.json").read_text())
    assert report["resolved_ids"] == ["ledger__ledger-1", "textkit__textkit-2"]


def _gold_and_wrong(dataset: Path, tmp_path: Path) -> tuple[int, str]:
    """``sandlot eval`` of gold and a wrong file in one call, on ledger-1 and textkit-2 (the
    wrong file's ledger patch edits gold's line: had it reached a shared set-up, gold's patch
    would not apply; its textkit patch is empty)."""
    gold = {
        r["instance_id"]: r["patch"]
        for r in map(json.loads, (EXAMPLES / "instances.jsonl").read_text().splitlines())
    }
    wrong_fix = gold["ledger__ledger-1"].replace('int(frac.ljust(2, "0"))', "int(frac or 0) + 0")
    assert wrong_fix != gold["ledger__ledger-1"]
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(
        "".join(
            json.dumps({"instance_id": i, "model_name_or_path": "wrong", "model_patch": p}) + "\n"
            for i, p in [("ledger__ledger-1", wrong_fix), ("textkit__textkit-2", "")]
        )
    )
    code, out = _eval(
        "--dataset",
        str(dataset),
        "--predictions",
        f"gold,{wrong}",
        "--backend",
        "local",
        "--instance-ids",
        "ledger__ledger-1,textkit__textkit-2",
        "--run-id",
        "pair",
        "--output-dir",
        str(tmp_path / "logs"),
    )
    assert code == 0, out
    assert "2/2 resolved" in out and "0/2 resolved" in out
    gold_report = json.loads((tmp_path / "logs" / "pair" / "gold.pair.json").read_text())
    wrong_report = json.loads((tmp_path / "logs" / "pair" / "wrong.pair.json").read_text())
    assert gold_report["resolved_ids"] == ["ledger__ledger-1", "textkit__textkit-2"]
    assert wrong_report["unresolved_ids"] == ["ledger__ledger-1"]
    assert wrong_report["empty_patch_ids"] == ["textkit__textkit-2"]
    return code, out


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_several_prediction_files_share_each_instance_set_up(dataset: Path, tmp_path: Path) -> None:
    _, out = _gold_and_wrong(dataset, tmp_path)
    # ledger: set up once for gold and wrong; textkit once for gold (an empty patch opens none)
    assert "2 sandbox set-up(s) for 4 prediction(s)" in out


@needs(bwrap_missing, importable("swebench", EVAL))
@pytest.mark.e2e
def test_a_set_up_that_cannot_be_frozen_is_done_per_evaluation(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandlot.errors import SandboxError
    from sandlot.sandboxes.local import LocalSandbox

    async def refuse(self: LocalSandbox) -> str:
        raise SandboxError("cannot freeze", retryable=False)

    monkeypatch.setattr(LocalSandbox, "_snapshot", refuse)
    _, out = _gold_and_wrong(dataset, tmp_path)
    assert "3 sandbox set-up(s) for 4 prediction(s)" in out


def test_two_prediction_files_of_one_model_are_refused(dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "gold.jsonl"
    copy.write_text(
        json.dumps(
            {"instance_id": "ledger__ledger-1", "model_name_or_path": "gold", "model_patch": "x"}
        )
        + "\n"
    )
    code, out = _eval(
        "--dataset",
        str(dataset),
        "--predictions",
        "gold",
        "--predictions",
        str(copy),
        "--output-dir",
        str(tmp_path / "logs"),
    )
    assert code == 2 and "'gold'" in out and "model_name_or_path" in out


def test_unknown_instance_id_in_filter(dataset: Path) -> None:
    code, out = _eval("--dataset", str(dataset), "--predictions", "gold", "--instance-ids", "nope")
    assert code == 2 and "nope" in out
