"""``sandlot gc``: selection, the CLI, and a real docker run killed with ``kill -9``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import ClassVar

import click
import pytest
from click.testing import CliRunner
from repo_paths import TESTS
from requirements import TEST_IMAGE, bwrap_missing, docker_engine, needs
from swe_mini_copy import swe_mini_copy

from sandlot.cli import gc_cmd
from sandlot.cli.main import cli
from sandlot.sandboxes import registry
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.labels import CREATED_AT, OWNER, RUN_ID, owner, recorded_runs, run_id
from sandlot.sandboxes.reaper import select
from sandlot.sandboxes.transport import RemoteSandbox


def sb(run: str, created: float | None, sid: str = "", who: str | None = None) -> RemoteSandbox:
    labels = {RUN_ID: run, OWNER: owner() if who is None else who}
    if created is not None:
        labels[CREATED_AT] = str(int(created))
    return RemoteSandbox("docker", sid or uuid.uuid4().hex, labels)


def test_select_by_run_and_age() -> None:
    now = 10_000.0
    old_a, new_a, old_b, undated = (
        sb("a", now - 7200),
        sb("a", now - 60),
        sb("b", now - 7200),
        sb("a", None),
    )
    every = [old_a, new_a, old_b, undated]
    assert select(every, run_id="a", now=now) == [old_a, new_a, undated]
    assert select(every, older_than_s=3600, now=now) == [old_a, old_b]
    assert select(every, run_id="a", older_than_s=3600, now=now) == [old_a]


def test_select_by_owner() -> None:
    mine, theirs, unlabelled = sb("a", 0, who="me@h"), sb("a", 0, who="you@h"), sb("a", 0, who="")
    assert select([mine, theirs, unlabelled], owner="me@h") == [mine]
    assert select([mine, theirs, unlabelled]) == [mine, theirs, unlabelled]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert gc_cmd.parse_duration(text) == seconds


def test_parse_duration_rejects_garbage() -> None:
    with pytest.raises(click.BadParameter, match="2 hours"):
        gc_cmd.parse_duration("2 hours")


class StubReaper:
    backend = "stub"

    def __init__(self, sandboxes: list[RemoteSandbox], fail: set[str]) -> None:
        self.sandboxes, self.fail, self.killed = sandboxes, fail, []  # type: ignore[var-annotated]

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        return [s for s in self.sandboxes if run_id is None or s.run_id == run_id]

    async def kill(self, sandbox: RemoteSandbox) -> None:
        if sandbox.id in self.fail:
            raise RuntimeError("provider said no")
        self.killed.append(sandbox.id)


def test_cli_requires_a_filter_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["gc", "--backend", "docker"])
    assert result.exit_code == 2 and "--run-id" in result.output
    result = runner.invoke(cli, ["gc", "--backend", "nope", "--all"])
    assert result.exit_code == 2 and "unknown sandbox backend 'nope'" in result.output

    stub = StubReaper(
        [sb("r1", time.time(), "s1"), sb("r1", time.time(), "s2"), sb("r2", 0, "s3")], {"s2"}
    )
    monkeypatch.setattr(gc_cmd, "get_reaper", lambda name, **kw: stub)
    monkeypatch.setitem(registry._registered, "stub", Sandbox)  # a name --backend accepts
    result = runner.invoke(cli, ["gc", "--backend", "stub", "--run-id", "r1", "--dry-run"])
    assert result.exit_code == 0 and "would kill 2" in result.output and stub.killed == []
    result = runner.invoke(cli, ["gc", "--backend", "stub", "--run-id", "r1"])
    assert result.exit_code == 1, result.output
    assert (
        stub.killed == ["s1"]
        and "failed 1" in result.output
        and "provider said no" in result.output
    )


class ListedReaper(StubReaper):
    """The reaper a third-party backend names: what `sandlot gc` builds from the class."""

    made: ClassVar[list[ListedReaper]] = []

    def __init__(self, **options: str) -> None:
        super().__init__([sb("r1", time.time(), "t1"), sb("r2", time.time(), "t2")], set())
        self.options = options
        ListedReaper.made.append(self)


def test_gc_serves_a_registered_backend_through_the_reaper_its_class_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class ThirdParty(Sandbox):
        name = "third-party"
        reaper = f"{__name__}:ListedReaper"

    class NoReaper(Sandbox):
        name = "no-reaper"

    # Registered for this test only: other tests list the known backends.
    monkeypatch.setitem(registry._registered, "third-party", ThirdParty)
    monkeypatch.setitem(registry._registered, "no-reaper", NoReaper)
    runner = CliRunner()
    result = runner.invoke(
        cli, ["gc", "--backend", "third-party", "--run-id", "r1", "--option", "zone=eu"]
    )
    assert result.exit_code == 0, result.output
    [reaper] = ListedReaper.made
    assert reaper.killed == ["t1"] and reaper.options == {"zone": "eu"}
    result = runner.invoke(cli, ["gc", "--backend", "no-reaper", "--all"])
    assert result.exit_code == 1 and "has no reaper" in result.output


def test_gc_serves_a_registered_backend_through_its_listing_primitives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = StubReaper([sb("r1", time.time(), "p1"), sb("r2", time.time(), "p2")], set())

    class Listing(Sandbox):
        name = "listing"

        @classmethod
        def _reaper_context(cls, options: object) -> StubReaper:
            return platform

        @classmethod
        async def _list_labelled(cls, context: StubReaper, run_id: str | None) -> list:
            return await context.list_sandboxes(None)  # ignores the filter: gc checks again

        @classmethod
        async def _kill_listed(cls, context: StubReaper, sandbox: RemoteSandbox) -> None:
            await context.kill(sandbox)

    monkeypatch.setitem(registry._registered, "listing", Listing)
    result = CliRunner().invoke(cli, ["gc", "--backend", "listing", "--run-id", "r1"])
    assert result.exit_code == 0 and platform.killed == ["p1"], result.output


def _stub(monkeypatch: pytest.MonkeyPatch, *, can_ask: bool) -> StubReaper:
    old = time.time() - 7200
    stub = StubReaper(
        [sb("r1", old, "mine1"), sb("r1", old, "mine2"), sb("r2", old, "theirs", who="you@gpu7")],
        set(),
    )
    monkeypatch.setattr(gc_cmd, "get_reaper", lambda name, **kw: stub)
    monkeypatch.setitem(registry._registered, "stub", Sandbox)  # a name --backend accepts
    monkeypatch.setattr(gc_cmd, "_can_ask", lambda: can_ask)
    return stub


def test_an_option_the_backend_lacks_is_reported_not_a_traceback() -> None:
    # VefaasOptions forbids unknown fields: the pydantic ValidationError used to escape gc.
    result = CliRunner().invoke(
        cli, ["gc", "--backend", "vefaas", "--run-id", "r", "--option", "no_such=1"]
    )
    assert result.exit_code == 1 and "no_such" in result.output, result.output
    assert not isinstance(result.exception, ValueError), result.exception


def test_other_owners_sandboxes_are_left_alone_unless_any_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stub = _stub(monkeypatch, can_ask=False)
    run = ["gc", "--backend", "stub", "--older-than", "1h", "--yes"]
    result = CliRunner().invoke(cli, run)
    assert result.exit_code == 0, result.output
    assert sorted(stub.killed) == ["mine1", "mine2"]
    assert "1 matching sandboxes of other owners left alone (you@gpu7)" in result.output
    result = CliRunner().invoke(cli, ["gc", "--backend", "stub", "--run-id", "r2"])
    assert "theirs" not in stub.killed and "0 selected" in result.output
    result = CliRunner().invoke(cli, [*run, "--any-owner"])
    assert result.exit_code == 0 and "theirs" in stub.killed, result.output


@pytest.mark.parametrize("selector", [["--older-than", "1h"], ["--all"]])
def test_broad_selections_list_by_run_and_owner_and_ask(
    monkeypatch: pytest.MonkeyPatch, selector: list[str]
) -> None:
    run = ["gc", "--backend", "stub", *selector, "--any-owner"]
    stub = _stub(monkeypatch, can_ask=False)
    result = CliRunner().invoke(cli, run)
    assert result.exit_code == 2 and "confirm with --yes" in result.output
    assert stub.killed == []

    stub = _stub(monkeypatch, can_ask=True)
    result = CliRunner().invoke(cli, run, input="n\n")
    assert result.exit_code == 1 and "Aborted" in result.output and stub.killed == []
    groups = result.output[result.output.index("to kill, by run and owner") :]
    assert "r1" in groups and owner() in groups and "you@gpu7" in groups
    result = CliRunner().invoke(cli, run, input="y\n")
    assert result.exit_code == 0 and sorted(stub.killed) == ["mine1", "mine2", "theirs"]


def test_run_id_is_pinned_and_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDLOT_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SANDLOT_RUN_ID", raising=False)
    first = run_id()
    assert os.environ["SANDLOT_RUN_ID"] == first and run_id() == first
    (record,) = recorded_runs()
    assert record["run_id"] == first and record["pid"] == os.getpid()


CRASHING_RUN = textwrap.dedent(
    """
    import anyio, sandlot

    async def main():
        boxes = [sandlot.open("docker", image={image!r}, pull="never") for _ in range(3)]
        for sb in boxes:
            await sb.start()
        print("ready", flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


@pytest.mark.slow
def test_gc_removes_everything_a_kill_9_run_left_on_docker(tmp_path: Path) -> None:
    client = docker_engine()
    env = {k: v for k, v in os.environ.items() if k != "SANDLOT_RUN_ID"}
    env["SANDLOT_STATE_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN.format(image=TEST_IMAGE)],
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
    label = {"label": f"{RUN_ID}={run}"}
    assert len(client.api.containers(all=True, filters=label)) == 3, "the run leaked nothing?"

    result = CliRunner().invoke(cli, ["gc", "--backend", "docker", "--run-id", run, "--dry-run"])
    assert result.exit_code == 0 and "would kill 3" in result.output
    assert len(client.api.containers(all=True, filters=label)) == 3

    result = CliRunner().invoke(cli, ["gc", "--backend", "docker", "--run-id", run])
    assert result.exit_code == 0, result.output
    assert "killed 3" in result.output
    assert client.api.containers(all=True, filters=label) == []


@pytest.mark.slow
def test_eval_labels_its_sandboxes_with_the_run_id_the_user_chose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fakes.fake_modal import FakeModal
    from fakes.shared import FakeModalSandbox
    from requirements import bwrap_missing, need

    need(bwrap_missing() is None, str(bwrap_missing()))
    monkeypatch.setenv("SANDLOT_RUN_ID", "inherited-run")
    monkeypatch.setenv("SANDLOT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    fake = FakeModal()
    monkeypatch.setattr(FakeModalSandbox, "fake", fake)
    try:
        result = CliRunner().invoke(
            cli,
            [
                "eval",
                "--dataset",
                str(swe_mini_copy(tmp_path)),
                "--predictions",
                "gold",
                "--backend",
                "modal-fake",
                "--image",
                "python:3.12",
                "--instance-ids",
                "ledger__ledger-1",
                "--run-id",
                "my-eval-7",
                "--output-dir",
                str(tmp_path / "out"),
            ],
        )
        creates = fake.calls_of("Sandbox.create")
        assert creates, result.output
        assert {kw["tags"][RUN_ID] for _, kw in creates} == {"my-eval-7"}
        assert not fake.live()
    finally:
        fake.close()
    args = ["--dataset", str(tmp_path / "instances.jsonl"), "--predictions", "gold"]
    bad = CliRunner().invoke(cli, ["eval", *args, "--run-id", "no spaces/please"])
    assert bad.exit_code == 2 and "--run-id" in bad.output and "letters, digits" in bad.output


@pytest.mark.slow
def test_rollout_labels_its_sandboxes_with_the_run_id_the_user_chose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fakes.fake_modal import FakeModal
    from fakes.shared import FakeModalSandbox
    from requirements import bwrap_missing, need

    need(bwrap_missing() is None, str(bwrap_missing()))
    monkeypatch.setenv("SANDLOT_RUN_ID", "inherited-run")
    monkeypatch.setenv("SANDLOT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    config = tmp_path / "agent.yaml"
    config.write_text("interaction:\n  max_turns: 1\nconcurrency: 1\n")
    fake = FakeModal()
    monkeypatch.setattr(FakeModalSandbox, "fake", fake)
    args = [
        "rollout",
        "--dataset",
        str(swe_mini_copy(tmp_path)),
        "--config",
        str(config),
        "--base-url",
        "http://127.0.0.1:9/v1",  # nothing listens: the episode fails after its sandbox started
        "--no-preflight",  # which would refuse that URL before any sandbox
        "--model",
        "m",
        "--backend",
        "modal-fake",
        "--image",
        "python:3.12",
        "--instance-ids",
        "ledger__ledger-1",
        "--output",
        str(tmp_path / "out"),
    ]
    try:
        result = CliRunner().invoke(cli, [*args, "--run-id", "my-rollout-7"])
        creates = fake.calls_of("Sandbox.create")
        assert creates, result.output
        assert {kw["tags"][RUN_ID] for _, kw in creates} == {"my-rollout-7"}
        assert "my-rollout-7" in result.output and not fake.live()
    finally:
        fake.close()
    bad = CliRunner().invoke(cli, [*args, "--run-id", "x" * 64])
    assert bad.exit_code == 2 and "--run-id" in bad.output


LOCAL_CRASHING_RUN = textwrap.dedent(
    """
    import anyio, sandlot

    async def main():
        jailed = sandlot.open("local")
        bare = sandlot.open("local", isolation="none")
        for sb in (jailed, bare):
            await sb.start()
            await sb.exec("(exec -a {marker} sleep 1000) >/dev/null 2>&1 &")
        print(jailed.host_dir, bare.host_dir, *jailed.cgroups, flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.slow
@needs(bwrap_missing)
def test_gc_removes_everything_a_kill_9_run_left_on_local(tmp_path: Path) -> None:
    marker = f"sandlot-gc-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "sandboxes"
    env = {k: v for k, v in os.environ.items() if k != "SANDLOT_RUN_ID"}
    env.update(SANDLOT_STATE_DIR=str(tmp_path), SANDLOT_LOCAL_ROOT=str(root))
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCAL_CRASHING_RUN.format(marker=marker)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=TESTS,
    )
    try:
        assert proc.stdout is not None
        left = [Path(p) for p in proc.stdout.readline().split()]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    (run,) = [r["run_id"] for r in runs if r["pid"] == proc.pid]
    assert len(left) >= 2 and all(p.exists() for p in left), "the run leaked nothing?"
    time.sleep(0.5)
    assert _pids_with(marker), "the daemon of the unjailed sandbox died with its caller?"

    gc = ["gc", "--backend", "local", "--option", f"root_dir={root}", "--run-id", run]
    result = CliRunner().invoke(cli, [*gc, "--dry-run"])
    assert result.exit_code == 0 and "would kill 2" in result.output, result.output
    assert all(p.exists() for p in left)

    result = CliRunner().invoke(cli, gc)
    assert result.exit_code == 0 and "killed 2" in result.output, result.output
    assert not any(p.exists() for p in left)
    deadline = time.monotonic() + 5
    while _pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_with(marker) == []
    assert (
        CliRunner()
        .invoke(cli, ["gc", "--backend", "local", "--option", f"root_dir={root}", "--all"])
        .exit_code
        == 0
    )
