"""``sandlot gc --backend kubernetes --run-id``: the pods a ``kill -9``'d run left, found by
their ``sandlot.run_id`` label on the fake API server and deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from fakes.shared import kubernetes_fake_unavailable
from requirements import need

from sandlot.cli.main import cli

if TYPE_CHECKING:
    from fakes.fake_kubernetes import FakeKubernetes

CRASHING_RUN = textwrap.dedent(
    """
    import anyio, sandlot

    async def main():
        boxes = [sandlot.open("kubernetes", image="python:3.12", kubeconfig={kubeconfig!r},
                              namespace="sandlot") for _ in range(3)]
        for sb in boxes:
            await sb.start()
        print("ready", flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    reason = kubernetes_fake_unavailable()
    need(reason is None, str(reason))
    from fakes.fake_kubernetes import FakeKubernetes

    fake = FakeKubernetes().start()
    yield fake
    fake.stop()


@pytest.mark.slow
def test_gc_removes_every_pod_a_kill_9_run_left(kube: FakeKubernetes, tmp_path: Path) -> None:
    kubeconfig = str(kube.kubeconfig())
    env = {k: v for k, v in os.environ.items() if k != "SANDLOT_RUN_ID"}
    env["SANDLOT_STATE_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN.format(kubeconfig=kubeconfig)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    (run,) = [r["run_id"] for r in runs if r["pid"] == proc.pid]
    assert len(kube.live()) == 3, "the run leaked nothing?"
    where = ["--option", f"kubeconfig={kubeconfig}", "--option", "namespace=sandlot"]

    gc = ["gc", "--backend", "kubernetes", "--run-id", run, *where]
    result = CliRunner().invoke(cli, [*gc, "--dry-run"])
    assert result.exit_code == 0 and "would kill 3" in result.output, result.output
    assert len(kube.live()) == 3

    other = CliRunner().invoke(cli, ["gc", "--backend", "kubernetes", "--run-id", "x", *where])
    assert other.exit_code == 0 and len(kube.live()) == 3, other.output

    result = CliRunner().invoke(cli, gc)
    assert result.exit_code == 0, result.output
    assert "killed 3" in result.output
    assert kube.live() == []
