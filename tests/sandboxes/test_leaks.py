"""A close that cannot destroy its sandbox is reported (log, counter, the run's leak list), and
``sandlot gc --leaked`` kills exactly the listed sandboxes: the fake Modal, and ``local``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result
from fakes.fake_modal import FakeModal
from fakes.shared import FakeModalSandbox
from requirements import bwrap_missing, needs

from sandlot import SandboxSpec, SandboxStartError
from sandlot.cli import gc_cmd
from sandlot.cli.main import cli
from sandlot.sandboxes import base, leaks
from sandlot.sandboxes.labels import SANDBOX_ID
from sandlot.sandboxes.local import LocalOptions, LocalSandbox
from sandlot.sandboxes.modal import ModalOptions
from sandlot.sandboxes.reaper import SandboxReaper, reap_leaked
from sandlot.sandboxes.scale.starting import StartLimits
from sandlot.sandboxes.transport import RemoteSandbox

pytestmark = [pytest.mark.anyio, needs(bwrap_missing)]
RUN = "run-leak-test"


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SANDLOT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SANDLOT_RUN_ID", RUN)
    return tmp_path / "state"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, state: Path) -> Iterator[FakeModal]:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    f = FakeModal()
    monkeypatch.setattr(FakeModalSandbox, "fake", f)
    monkeypatch.setattr(
        gc_cmd, "get_reaper", lambda name, **kw: SandboxReaper(FakeModalSandbox, **kw)
    )
    yield f
    f.close()


async def gc(*args: str) -> Result:
    """``sandlot gc ARGS`` (its own event loop, so in a worker thread)."""
    return await anyio.to_thread.run_sync(CliRunner().invoke, cli, ["gc", *args])


def listed() -> list[dict[str, object]]:
    path = leaks.leak_file(RUN)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.e2e
async def test_an_unanswered_terminate_is_logged_counted_listed_and_collected_by_gc(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    sb = FakeModalSandbox(SandboxSpec(image="python:3.12"), ModalOptions(app_name="rl"))
    await sb.start()
    # Cut only the unanswered terminates short: a loaded machine must not trip the start.
    sb.options = sb.options.model_copy(update={"control_timeout_s": 0.05})
    modal_id = sb.backend_id
    before = leaks.leaked_sandboxes("modal")
    fake.unanswered.add("Sandbox.terminate")
    with caplog.at_level(logging.ERROR, "sandlot.sandboxes.leaks"):
        await sb.close()
    command = f"sandlot gc --backend modal --leaked --run-id {RUN} --option app_name=rl"
    assert f"{sb.id} (modal {modal_id}) could not be destroyed" in caplog.text
    assert f"`{command}`" in caplog.text and "did not answer" in caplog.text
    assert leaks.leaked_sandboxes("modal") == before + 1
    assert [(e["sandbox_id"], e["backend_id"], e["options"]) for e in listed()] == [
        (sb.id, modal_id, {"app_name": "rl"})
    ]
    assert [s.object_id for s in fake.live()] == [modal_id]

    fake.unanswered.clear()  # the API answers again
    dry = await gc(*command.split()[2:], "--dry-run")
    assert dry.exit_code == 0 and sb.id in dry.output and fake.live(), dry.output
    result = await gc(*command.split()[2:])
    assert result.exit_code == 0 and "killed 1" in result.output, result.output
    assert not fake.live() and listed() == []
    again = await gc("--leaked")
    assert again.exit_code == 0 and "no leaked sandboxes" in again.output


async def test_a_close_that_runs_out_of_budget_is_reported(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_CLOSE_BUDGET_S", 0.3)
    sb = FakeModalSandbox(SandboxSpec(image="python:3.12"), ModalOptions(control_timeout_s=30))
    await sb.start()
    fake.unanswered.add("Sandbox.terminate")
    with anyio.fail_after(10):
        await sb.close()
    (entry,) = listed()
    assert entry["sandbox_id"] == sb.id and "close budget" in str(entry["error"])


@needs(bwrap_missing)
async def test_a_local_close_that_fails_is_listed_and_gc_removes_the_sandbox(
    state: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    sb = LocalSandbox(SandboxSpec(image="host"), LocalOptions(root_dir=str(root)))
    await sb.start()
    home = root / sb.id
    assert home.is_dir()

    async def refuse() -> None:
        raise OSError(16, "Device or resource busy")

    sb._close = refuse  # type: ignore[method-assign]
    before = leaks.leaked_sandboxes("local")
    await sb.close()
    assert leaks.leaked_sandboxes("local") == before + 1 and home.is_dir()
    (entry,) = listed()
    assert entry["backend"] == "local" and entry["options"] == {"root_dir": str(root)}
    assert "Device or resource busy" in str(entry["error"])

    result = await gc("--leaked", "--backend", "local")
    assert result.exit_code == 0 and "killed 1" in result.output, result.output
    assert not home.exists() and listed() == []


class StubReaper:
    backend = "modal"

    def __init__(self, sandboxes: list[RemoteSandbox], fail: set[str]) -> None:
        self.sandboxes, self.fail = sandboxes, fail

    async def list_sandboxes(self, run_id: str | None = None) -> list[RemoteSandbox]:
        return self.sandboxes

    async def kill(self, sandbox: RemoteSandbox) -> None:
        if sandbox.id in self.fail:
            raise RuntimeError("provider said no")


async def test_reap_leaked_kills_only_the_listed_and_keeps_what_it_could_not_kill() -> None:
    def remote(backend_id: str, sandbox_id: str) -> RemoteSandbox:
        return RemoteSandbox("modal", backend_id, {SANDBOX_ID: sandbox_id})

    listed_now = [remote("sb-1", "s1"), remote("sb-2", "s2"), remote("sb-x", "not-leaked")]
    entries = [
        leaks.Leak("modal", RUN, "s1", "sb-1"),
        leaks.Leak("modal", RUN, "s2", None),  # id unknown: matched by label
        leaks.Leak("modal", RUN, "s3", "sb-3"),  # no longer listed: gone
    ]
    report, gone = await reap_leaked(StubReaper(listed_now, fail={"sb-2"}), entries)
    assert [sb.id for sb in report.killed] == ["sb-1"]
    assert [sb.id for sb, _ in report.failed] == ["sb-2"]
    assert [e.sandbox_id for e in gone] == ["s1", "s3"]


APPENDER = textwrap.dedent(
    """
    import anyio, sys
    from sandlot.sandboxes import leaks

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(40):
                leak = leaks.Leak("modal", "{run}", f"{{sys.argv[1]}}-{{i}}", None, "x" * 3000)
                tg.start_soon(leaks.report, leak)

    anyio.run(main)
    """
)


@pytest.mark.e2e
def test_concurrent_appenders_in_several_processes_lose_and_mangle_nothing(state: Path) -> None:
    code = APPENDER.format(run=RUN)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, f"p{n}"], stderr=subprocess.DEVNULL)
        for n in range(4)
    ]
    assert [p.wait() for p in procs] == [0] * 4
    ids = sorted(str(e["sandbox_id"]) for e in listed())
    assert ids == sorted(f"p{n}-{i}" for n in range(4) for i in range(40))
    leaks.forget(RUN, {f"p0-{i}" for i in range(40)})
    assert len(listed()) == 120 and all(
        not str(e["sandbox_id"]).startswith("p0-") for e in listed()
    )


async def test_the_run_summary_names_the_leaks_of_its_backend(state: Path) -> None:
    assert gc_cmd.leak_note("modal", RUN) is None
    await leaks.report(leaks.Leak("modal", RUN, "s1", "sb-1", "terminate: no answer"))
    await leaks.report(leaks.Leak("docker", RUN, "s2", "c2", "remove refused"))
    note = gc_cmd.leak_note("modal", RUN)
    assert note is not None and "1 sandbox(es) could not be destroyed" in note
    assert f"sandlot gc --backend modal --leaked --run-id {RUN}" in note


@pytest.mark.slow
async def test_an_abandoned_create_that_cannot_be_found_is_listed_and_gc_kills_it(
    fake: FakeModal,
) -> None:
    """The create's answer is lost and so is the lookup by name: the sandbox runs, unknown
    to its caller, so the leak list names it by label for gc."""
    fake.unanswered |= {"Sandbox.create", "Sandbox.from_name"}
    limits = StartLimits(backoff_s=0.001, max_attempts=1)
    sb = FakeModalSandbox(
        SandboxSpec(image="python:3.12", start_limits=limits),
        ModalOptions(create_timeout_s=0.1, control_timeout_s=0.05),
    )
    with anyio.fail_after(30), pytest.raises(SandboxStartError):
        await sb.start()
    assert len(fake.live()) == 1
    (entry,) = listed()
    assert entry["sandbox_id"] == sb.id and entry["backend_id"] is None

    fake.unanswered.clear()
    result = await gc("--leaked", "--run-id", RUN)
    assert result.exit_code == 0 and "killed 1" in result.output, result.output
    assert not fake.live() and listed() == []
