"""``sandlot eval --backend kubernetes`` of examples/swe-mini against the fake API server: the
gold patches resolve 8/8, the wrong ones none, and no pod is left."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from fakes.shared import kubernetes_fake_unavailable
from repo_paths import EXAMPLES
from requirements import EVAL, importable, need, needs

from sandlot.cli.main import cli

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes

SWE_MINI = EXAMPLES / "swe-mini"
# Each pod pip-installs pytest from the mirror (a venv with ensurepip, then pip: ~6 s of CPU per
# pod, most of each item's ~30 s; the `local` backend's interpreter has pytest already), and
# every timed-out kill scans the host's /proc (the fake's pods share its PID namespace).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900), needs(importable("swebench", EVAL))]


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubernetes]:
    reason = kubernetes_fake_unavailable()
    need(reason is None, str(reason))
    from fakes.fake_kubernetes import FakeKubernetes

    fake = FakeKubernetes().start()
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig()))  # all the backend is told
    yield fake
    fake.stop()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(tmp_path / "repos")],
        check=True,
        capture_output=True,
    )
    shutil.copy(SWE_MINI / "instances.jsonl", tmp_path / "instances.jsonl")
    return tmp_path / "instances.jsonl"


@pytest.mark.parametrize(("predictions", "resolved"), [("gold.jsonl", 8), ("wrong.jsonl", 0)])
def test_eval_of_swe_mini_on_kubernetes(
    kube: FakeKubernetes, dataset: Path, tmp_path: Path, predictions: str, resolved: int
) -> None:
    out = tmp_path / "out"
    args = ["eval", "--dataset", str(dataset), "--backend", "kubernetes", "-j", "4"]
    args += ["--predictions", str(SWE_MINI / "predictions" / predictions)]
    result = CliRunner().invoke(cli, [*args, "--output-dir", str(out), "--run-id", "k8s-eval"])
    assert "backend: kubernetes" in result.output, result.output
    reports = [json.loads(p.read_text()) for p in out.rglob("*.json") if p.name != "report.json"]
    run = next(r for r in reports if "resolved_ids" in r)
    assert len(run["resolved_ids"]) == resolved, result.output
    assert not run.get("error_ids"), result.output
    assert kube.live() == []
