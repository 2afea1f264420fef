"""``sandlot audit RUN_DIR`` over a written ``trajectories.jsonl``: counts per rule and per
instance, ``audit.json``, the dataset found through ``summary.json``, bad input refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from sandlot.cli.main import cli
from sandlot.rollout.trajectory import ExitReason, Step, ToolObservation, Trajectory

INSTANCES = Path(__file__).resolve().parents[3] / "examples" / "swe-mini" / "instances.jsonl"


def _traj(instance_id: str, sample: int, *commands: str) -> Trajectory:
    steps = [
        Step(
            turn=n,
            content="",
            observations=[
                ToolObservation(tool="bash", arguments={"command": c}, output="", status="ok")
            ],
        )
        for n, c in enumerate(commands, start=1)
    ]
    return Trajectory(
        instance_id=instance_id, sample=sample, exit_reason=ExitReason.SUBMITTED, steps=steps
    )


def _run_dir(tmp_path: Path, dataset: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    trajectories = [
        _traj("minicalc__minicalc-1", 0, "git log --all", "curl https://x.org/fix.patch"),
        _traj("minicalc__minicalc-1", 1, "git reflog"),
        _traj("textkit__textkit-1", 0, "cat tests/test_wrap.py"),
        _traj("textkit__textkit-2", 0, "python -m pytest -q tests"),
    ]
    lines = "".join(t.model_dump_json() + "\n" for t in trajectories)
    (run / "trajectories.jsonl").write_text(lines)
    (run / "summary.json").write_text(json.dumps({"run": {"dataset": dataset}}))
    return run


def test_counts_per_rule_and_instance_with_the_recorded_dataset(tmp_path: Path) -> None:
    shutil.copy(INSTANCES, tmp_path / "instances.jsonl")
    run = _run_dir(tmp_path, "instances.jsonl")  # relative: found beside the run directory
    result = CliRunner().invoke(cli, ["audit", str(run)])
    assert result.exit_code == 0, result.output
    assert "3/4 episode(s) flagged" in result.output
    report = json.loads((run / "audit.json").read_text())
    assert report["dataset"] == str(tmp_path / "instances.jsonl")
    counts = {k: (v["episodes"], v["flags"]) for k, v in report["per_rule"].items() if v["flags"]}
    assert counts == {"git-history": (2, 2), "network": (1, 1), "graded-read": (1, 1)}
    assert report["per_instance"] == {
        "minicalc__minicalc-1": {"git-history": 2, "network": 1},
        "textkit__textkit-1": {"graded-read": 1},
    }
    assert report["unchecked"] == {}
    first = report["audits"][0]["flags"][1]
    assert first == {
        "rule": "network",
        "turn": 2,
        "command": "curl https://x.org/fix.patch",
        "detail": "curl",
    }


def test_without_a_dataset_the_instance_rules_are_unchecked(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "gone.jsonl")
    out = tmp_path / "elsewhere.json"
    result = CliRunner().invoke(cli, ["audit", str(run), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "no dataset" in result.output and "graded-read" in result.output
    report = json.loads(out.read_text())
    assert report["dataset"] is None and report["unchecked"]["graded-read"] == 4
    assert report["flagged_episodes"] == 2  # graded-read could not fire


def test_a_directory_without_trajectories_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", str(tmp_path)])
    assert result.exit_code == 2 and "has no trajectories.jsonl" in result.output


def test_a_training_directory_audits_every_line_of_every_dump(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    # Training runs an instance again and again, always as sample 0, from several processes.
    one = [_traj("textkit__textkit-1", 0, "cat tests/test_wrap.py"), _traj("textkit__textkit-1", 0)]
    two = [_traj("textkit__textkit-1", 0, "git reflog")]
    for name, trajs in (("trajectories.n1.11.jsonl", one), ("trajectories.n2.7.jsonl", two)):
        (kept / name).write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    result = CliRunner().invoke(cli, ["audit", str(kept), "--dataset", str(INSTANCES)])
    assert result.exit_code == 0, result.output
    assert "2/3 episode(s) flagged" in result.output
    report = json.loads((kept / "audit.json").read_text())
    assert report["per_instance"] == {"textkit__textkit-1": {"graded-read": 1, "git-history": 1}}
