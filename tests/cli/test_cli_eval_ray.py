"""`sandlot eval --ray` and `sandlot data selftest --ray` on a local Ray head (`ray start
--head`) write the reports they write without Ray."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo_paths import EXAMPLES, REPO
from requirements import EVAL, TRAIN, bwrap_missing, importable, needs

from sandlot.cli.main import cli

SWE_MINI = EXAMPLES / "swe-mini"
_HEAD_START_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A Ray head of this machine (`ray start --head --block` in a session of its own,
    killed with its processes after the test; never `ray stop`, which would stop every
    cluster of the user). Its workers import this checkout's sandlot. Token authentication is
    off for this private test cluster on the loopback address."""
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths are bounded
    ray_cli = Path(sys.executable).with_name("ray")
    command = [str(ray_cli), "start", "--head", "--block", "--port", str(port)]
    command += ["--num-cpus", "2", "--node-ip-address", "127.0.0.1", "--include-dashboard"]
    command += ["false", "--object-store-memory", str(100 * 2**20), "--temp-dir", temp]
    head = subprocess.Popen(
        [*command, "--disable-usage-stats"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + _HEAD_START_S
        while True:  # the head is up once its GCS port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None, "ray start --head exited"
                assert time.monotonic() < deadline, "the Ray head did not start"
                time.sleep(0.5)
        address = f"127.0.0.1:{port}"
        with pytest.MonkeyPatch.context() as env_patch:
            env_patch.setenv("RAY_ADDRESS", address)
            env_patch.setenv("RAY_AUTH_MODE", "disabled")
            yield address
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head's session: its raylet, GCS, workers
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _reports(run: Path) -> dict[str, Any]:
    """Every report of a run directory, by path, without the per-instance timings."""
    found: dict[str, Any] = {}
    for path in sorted(run.rglob("*.json")):
        if path.name in ("result.json",):
            continue
        data = json.loads(path.read_text())
        if path.name == "report.json":
            for entry in data.values():
                entry.pop("timings_s")
        found[str(path.relative_to(run)).replace(run.name, "RUN")] = data
    return found


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """swe-mini's rows, their repositories built beside."""
    root = tmp_path_factory.mktemp("swe-mini")
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(root / "repos")],
        check=True,
        capture_output=True,
    )
    shutil.copy(SWE_MINI / "instances.jsonl", root / "instances.jsonl")
    return root / "instances.jsonl"


@needs(importable("ray", TRAIN), importable("swebench", EVAL), bwrap_missing)
@pytest.mark.e2e
def test_eval_on_ray_writes_the_reports_of_one_machine(
    ray_head: str, dataset: Path, tmp_path: Path
) -> None:
    wrong = SWE_MINI / "predictions" / "wrong.jsonl"
    common = ["eval", "--dataset", str(dataset), "--predictions", f"gold,{wrong}"]
    common += ["--backend", "local", "-j", "4", "--output-dir", str(tmp_path / "logs")]
    alone = CliRunner().invoke(cli, [*common, "--run-id", "alone"])
    assert alone.exit_code == 0, alone.output
    on_ray = CliRunner().invoke(cli, [*common, "--run-id", "ray", "--ray"])
    assert on_ray.exit_code == 0, on_ray.output
    assert "on Ray" in on_ray.output
    reports = _reports(tmp_path / "logs" / "ray")
    assert len(reports) == 2 + 16  # a run report per file, a report.json per evaluation
    assert reports == _reports(tmp_path / "logs" / "alone")


@needs(importable("ray", TRAIN), importable("swebench", EVAL), bwrap_missing)
@pytest.mark.e2e
def test_selftest_on_ray_gives_the_verdicts_of_one_machine(
    ray_head: str, dataset: Path, tmp_path: Path
) -> None:
    rows = dataset.read_text().splitlines()[:3]
    broken = json.loads(rows[0]) | {"instance_id": "bad__missing-commit", "base_commit": "0" * 40}
    three = dataset.with_name("three.jsonl")
    three.write_text("".join(line + "\n" for line in [*rows[1:], json.dumps(broken)]))
    common = ["data", "selftest", "--dataset", str(three), "--backend", "local", "-j", "4"]
    common += ["--output-dir", str(tmp_path)]
    alone = CliRunner().invoke(cli, [*common, "--run-id", "alone"])
    assert alone.exit_code == 0, alone.output
    on_ray = CliRunner().invoke(cli, [*common, "--run-id", "ray", "--ray"])
    assert on_ray.exit_code == 0, on_ray.output
    reports = [
        json.loads((tmp_path / run / "selftest.json").read_text()) for run in ("alone", "ray")
    ]
    for report in reports:
        assert report["reasons"] == {"repository_unavailable": 1}
        report.pop("run_id")
        for row in report["rows"]:
            row["log"] = row["log"].replace("/ray/", "/alone/")
    assert reports[0] == reports[1]
