"""The ``modal`` backend through the fake ``modal`` module: exact SDK arguments and faults.

No test reaches Modal: the backend's ``sdk()`` returns :class:`fakes.fake_modal.FakeModal`.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import math
import sys
from collections.abc import Iterator

import anyio
import pytest
from fakes.fake_modal import FakeModal
from fakes.shared import FakeModalSandbox
from requirements import MODAL, bwrap_missing, need_module, needs

import sandlot
from sandlot import (
    BackendUnavailableError,
    SandboxDeadError,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)
from sandlot.sandboxes.labels import CREATED_AT, OWNER, RUN_ID, SANDBOX_ID
from sandlot.sandboxes.modal import ModalOptions
from sandlot.sandboxes.reaper import SandboxReaper, reap
from sandlot.sandboxes.scale.starting import StartLimits

pytestmark = [pytest.mark.anyio, needs(bwrap_missing)]
FAST = StartLimits(backoff_s=0.001, backoff_max_s=0.01, max_attempts=10)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    monkeypatch.setenv("SANDLOT_RUN_ID", "run-modal-test")
    f = FakeModal()
    monkeypatch.setattr(FakeModalSandbox, "fake", f)
    yield f
    f.close()


def make(spec: SandboxSpec | None = None, **options: object) -> FakeModalSandbox:
    return FakeModalSandbox(spec or SandboxSpec(image="python:3.12"), ModalOptions(**options))


async def test_create_passes_exactly_these_arguments(fake: FakeModal) -> None:
    spec = SandboxSpec(
        image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
        env={"PIP_PROGRESS_BAR": "off"},
        workdir="/testbed",
        cpu=2.0,
        memory_mb=4096,
        timeout_s=1800.5,
        labels={"team": "rl"},
    )
    async with make(spec, app_name="rl-app", registry_secret="dockerhub", idle_timeout_s=600) as sb:
        assert fake.calls_of("App.lookup") == [(("rl-app",), {"create_if_missing": True})]
        assert fake.calls_of("Secret.from_name") == [(("dockerhub",), {})]
        ((tag,), image_kw) = fake.calls_of("Image.from_registry")[0]
        assert tag == spec.image and image_kw["secret"].name == "dockerhub"
        ((args, kwargs),) = fake.calls_of("Sandbox.create")
        tags = kwargs.pop("tags")
        assert tags[RUN_ID] == "run-modal-test" and tags[SANDBOX_ID] == sb.id
        assert tags["team"] == "rl" and "@" in tags[OWNER] and int(tags[CREATED_AT]) > 0
        assert kwargs.pop("image").tag == spec.image
        assert kwargs.pop("app").name == "rl-app"
        assert kwargs == {
            "name": f"{sb.id}-1",
            "env": {"PIP_PROGRESS_BAR": "off"},
            "timeout": 1801,
            "idle_timeout": 600,
            "workdir": "/testbed",
            "cpu": 2.0,
            "memory": 4096,
            "block_network": True,
        }
        assert args[:2] == ("/bin/sh", "-c") and "sleep" in args[2] and int(args[3]) > 1801
        r = await sb.exec("echo $X", env={"X": "1"}, timeout=400)
        assert r.stdout == "1\n"
        (argv, exec_kw) = fake.calls_of("Sandbox.exec")[-1]
        assert argv[:2] == ("/bin/sh", "-c") and argv[-2:] == ("/testbed", "echo $X")
        assert exec_kw["text"] is False and exec_kw["env"]["X"] == "1"
        assert set(exec_kw["env"]) == {"X", "SANDLOT_EXEC_ID"}
        # A command may run longer than 300 s: Modal's own timeout is ours + grace + margin.
        assert exec_kw["timeout"] == math.ceil(400 + 1.0) + 30


async def test_network_internet_is_an_egress_allowlist_without_private_ranges(
    fake: FakeModal,
) -> None:
    async with make(SandboxSpec(image="python:3.12", network="internet")) as sb:
        assert await sb.is_alive()
    ((_, kwargs),) = fake.calls_of("Sandbox.create")
    assert kwargs["block_network"] is False
    allowed = [ipaddress.ip_network(c) for c in kwargs["outbound_cidr_allowlist"]]
    reachable = {
        a: any(ipaddress.ip_address(a) in n for n in allowed)
        for a in ("8.8.8.8", "1.1.1.1", "127.0.0.1", "10.0.0.1", "169.254.169.254", "192.168.1.1")
    }
    assert reachable == {
        "8.8.8.8": True,
        "1.1.1.1": True,
        "127.0.0.1": False,
        "10.0.0.1": False,
        "169.254.169.254": False,
        "192.168.1.1": False,
    }


def test_arguments_are_accepted_by_the_installed_sdk() -> None:
    modal = need_module("modal", MODAL)
    create = inspect.signature(modal.Sandbox.create)
    create.bind(
        "/bin/sh",
        "-c",
        "x",
        "1",
        app=None,
        name="n",
        tags={},
        image=None,
        env=None,
        timeout=1,
        idle_timeout=None,
        workdir="/",
        cpu=1.0,
        memory=1,
        block_network=False,
        outbound_cidr_allowlist=["8.0.0.0/7"],
    )
    inspect.signature(modal.Sandbox.exec).bind(None, "sh", timeout=1, env={}, text=False)
    inspect.signature(modal.App.lookup).bind("app", create_if_missing=True)
    inspect.signature(modal.Image.from_registry).bind("img", secret=None)
    inspect.signature(modal.Sandbox.list).bind(app_id="ap", tags={})
    inspect.signature(modal.Sandbox.snapshot_filesystem).bind(None, 20, ttl=3600)
    assert modal.Image.from_id("im-1").object_id == "im-1"  # lazy: no call to Modal yet
    inspect.signature(modal.experimental.image_delete).bind("im-1")
    assert issubclass(modal.exception.SandboxFilesystemNotFoundError, modal.exception.Error)
    for name in ("ResourceExhaustedError", "InternalError", "ConnectionError", "NotFoundError"):
        assert issubclass(getattr(modal.exception, name), modal.exception.Error)


async def test_missing_credentials_name_the_variables(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    monkeypatch.setenv("MODAL_CONFIG_PATH", "/nonexistent/modal.toml")
    with pytest.raises(BackendUnavailableError, match="MODAL_TOKEN_SECRET") as info:
        await make().start()
    assert "MODAL_TOKEN_ID" not in str(info.value).split("set ")[1].split(" (")[0]
    assert fake.calls == [], "nothing may reach Modal without credentials"


async def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "modal", None)  # what an absent package looks like
    from sandlot.sandboxes.modal import ModalSandbox

    with pytest.raises(BackendUnavailableError, match=r"sandlot\[modal\]"):
        await ModalSandbox(SandboxSpec(image="python:3.12")).start()


async def test_unknown_image_fails_at_once(fake: FakeModal) -> None:
    fake.known_images = {"python:3.12"}
    sb = make(SandboxSpec(image="no/such-image:1", start_limits=FAST))
    with pytest.raises(SandboxStartError, match="no/such-image") as info:
        await sb.start()
    assert not info.value.retryable and len(fake.calls_of("Sandbox.create")) == 1


async def test_30_percent_rate_limited_creates_all_start_under_the_cap(
    fake: FakeModal, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "4")
    fake.rate_limit_rate = 0.3
    fake.create_latency_s = 0.02
    sandboxes = [make(SandboxSpec(image="python:3.12", start_limits=FAST)) for _ in range(16)]
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes"):
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(sb.start)
    try:
        assert all(sb.state == "started" for sb in sandboxes)
        assert fake.peak_creating <= 4
        failures = len(fake.calls_of("Sandbox.create")) - len(fake.sandboxes)
        assert failures > 0
        logged = [r for r in caplog.records if "rate limit" in r.getMessage()]
        assert len(logged) == failures
    finally:
        for sb in sandboxes:
            await sb.close()
    assert not fake.live()


async def test_terminate_raising_once_is_retried(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    sb = make()
    await sb.start()
    object_id = sb.backend_id
    fake.terminate_failures = 1
    await sb.close()
    assert fake.terminated == [object_id] and not fake.live()
    assert "closing sandbox" in caplog.text and "failed, retrying" in caplog.text


@pytest.mark.e2e
async def test_terminate_failing_for_good_does_not_raise_from_close(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    sb = make()
    await sb.start()
    fake.terminate_failures = 50
    await sb.close()  # never raises
    assert "could not be destroyed" in caplog.text and "sandlot gc --backend modal" in caplog.text
    assert len(fake.calls_of("Sandbox.terminate")) == 8


def cut_control_calls(sb: FakeModalSandbox) -> None:
    """Cut the control calls of a started ``sb`` at 0.1 s: only the calls a test leaves
    unanswered get the short bound, so a loaded machine cannot trip its start."""
    sb.options = sb.options.model_copy(update={"control_timeout_s": 0.1})


@pytest.mark.e2e
async def test_a_terminate_that_never_answers_is_cut_retried_and_reported(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    """Against an unresponsive API the SDK waits as long as its transport (155 s measured):
    each terminate is cut at control_timeout_s, close retries it within its budget, and the
    last failure is logged with the way to remove the sandbox."""
    sb = make()
    await sb.start()
    cut_control_calls(sb)
    fake.unanswered.add("Sandbox.terminate")
    with anyio.fail_after(30):  # 8 attempts x 0.1 s + the backoff, far below close's budget
        await sb.close()
    assert len(fake.calls_of("Sandbox.terminate")) == 8
    assert "did not answer within control_timeout_s=0.1 s" in caplog.text
    assert "failed" in caplog.text and sb.closed


async def test_file_calls_and_polls_that_never_answer_are_cut(fake: FakeModal) -> None:
    async with make() as sb:
        cut_control_calls(sb)
        fake.unanswered |= {"filesystem.read_bytes", "filesystem.write_bytes", "Sandbox.poll"}
        with anyio.fail_after(30):
            with pytest.raises(SandboxError, match="did not answer") as read:
                await sb.read_file("/tmp/x")
            with pytest.raises(SandboxError, match="did not answer") as write:
                await sb.write_file("/tmp/x", b"x")
            assert await sb.is_alive()  # an unanswered poll says nothing: not dead
        assert read.value.retryable and write.value.retryable
        fake.unanswered.clear()


async def test_a_dying_sandbox_raises_dead(fake: FakeModal) -> None:
    async with make() as sb:
        fake.die(fake.sandboxes[0])
        assert not await sb.is_alive()
        with pytest.raises(SandboxDeadError, match="exit code 137"):
            await sb.exec("true")


async def test_dying_mid_command_raises_dead(fake: FakeModal) -> None:
    async with make() as sb:

        async def kill_soon() -> None:
            await anyio.sleep(0.5)
            fake.die(fake.sandboxes[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with pytest.raises(SandboxDeadError):
                await sb.exec("sleep 30", timeout=20)


@pytest.mark.e2e
async def test_cancelled_run_of_200_starting_terminates_every_created_sandbox(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.create_latency_s = 0.1
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "64")
    sandboxes = [make(SandboxSpec(image="python:3.12")) for _ in range(200)]

    async def rollout(sb: FakeModalSandbox) -> None:
        async with sb:
            await anyio.sleep(3600)

    with anyio.move_on_after(0.15):
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(rollout, sb)
    created = {s.object_id for s in fake.sandboxes}
    assert created and len(created) < 200 and fake.peak_creating <= 64
    assert set(fake.terminated) == created and not fake.live()


async def test_gc_finds_and_kills_by_run_id(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = make()
    await mine.start()
    mine_id = mine.backend_id
    monkeypatch.setenv("SANDLOT_RUN_ID", "other-run")
    other = make()
    await other.start()
    reaper = SandboxReaper(FakeModalSandbox)
    listed = await reaper.list_sandboxes()
    assert {s.run_id for s in listed} == {"run-modal-test", "other-run"}
    report = await reap(reaper, run_id="run-modal-test", dry_run=True)
    assert [s.id for s in report.selected] == [mine_id] and not report.killed
    report = await reap(reaper, run_id="run-modal-test")
    assert [s.id for s in report.killed] == [mine_id]
    assert fake.terminated == [mine_id]
    await mine.close()  # its own close after gc: terminate is a no-op on a finished sandbox
    assert fake.calls_of("Sandbox.list")[-1][1]["tags"] == {RUN_ID: "run-modal-test"}
    await other.close()


# ----------------------------------------------------------------- failure modes of the SDK


async def test_a_broken_output_stream_is_a_sandbox_error_not_an_exception_group(
    fake: FakeModal,
) -> None:
    async with make() as sb:
        fake.stream_failures = 1
        with pytest.raises(SandboxError, match="StreamTerminatedError") as info:
            await sb.exec("echo hi")
        assert info.value.retryable and not isinstance(info.value, SandboxDeadError)
        assert (await sb.exec("echo again")).stdout == "again\n"


async def test_streams_of_a_dying_sandbox_raise_dead(fake: FakeModal) -> None:
    async with make() as sb:

        async def kill_soon() -> None:
            await anyio.sleep(0.3)
            fake.die(fake.sandboxes[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with pytest.raises(SandboxDeadError):
                await sb.exec("sleep 30")  # no timeout: the stream raising ends it


@pytest.mark.parametrize(
    ("message", "retryable"),
    [
        ("Image build for im-123 failed. Please try again.", True),
        ("Image build for im-123 timed out", True),
        ("Image build for im-123 failed: pip: no such package foo", False),
    ],
)
async def test_image_build_errors_are_retried_when_the_builder_says_so(
    fake: FakeModal, message: str, retryable: bool
) -> None:
    fake.build_failures = [message]
    sb = make(SandboxSpec(image="python:3.12", start_limits=FAST))
    if retryable:
        async with sb:
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert len(fake.calls_of("Sandbox.create")) == 2
    else:
        with pytest.raises(SandboxStartError, match="no such package") as info:
            await sb.start()
        assert not info.value.retryable


def test_a_terminated_grpc_stream_is_retryable() -> None:
    from grpclib.exceptions import StreamTerminatedError

    from sandlot.sandboxes.modal.sdk import is_modal_error, translate

    modal = FakeModal()
    try:
        exc = StreamTerminatedError("Connection lost")
        assert is_modal_error(modal, exc) and translate("exec", exc).retryable
    finally:
        modal.close()


@pytest.mark.e2e
async def test_exec_without_timeout_ends_when_the_worker_is_lost_silently(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeModalSandbox, "lifetime_margin_s", 0.5)
    async with make(SandboxSpec(image="python:3.12", timeout_s=2)) as sb:
        fake.freeze(fake.sandboxes[0])
        with anyio.fail_after(10), pytest.raises(SandboxDeadError):
            await sb.exec("sleep 100")


async def test_stdin_beyond_modals_buffer_and_argv_beyond_64_kib(fake: FakeModal) -> None:
    async with make() as sb:
        data = bytes(range(256)) * (20 * 4096)  # 20 MiB > the 16 MiB buffer
        r = await sb.exec("wc -c", stdin=data)
        assert r.stdout.strip() == str(len(data))
        word = "x" * (100 * 1024)
        r = await sb.exec(f"printf %s {word} | wc -c; exit 3")
        assert (r.exit_code, r.stdout.strip()) == (3, str(len(word)))
        assert (await sb.exec("ls /tmp | grep -c sandlot-cmd || true")).stdout.strip() == "0"
        with pytest.raises(SandboxError, match="invalid for environment variables"):
            await sb.exec("true", env={"BAD-KEY": "1"})


async def test_the_exec_deadline_counts_from_the_exec_start(fake: FakeModal) -> None:
    async with make() as sb:
        sandbox = fake.sandboxes[0]
        proc = await sandbox.exec.aio("sleep", "5", timeout=1, text=False)
        await anyio.sleep(0.8)
        with anyio.fail_after(0.6):  # 1 s from the start, not 1 s from wait()
            assert await proc.wait.aio() == -1
        await sb.close()
        assert await sandbox.poll.aio() == 137  # terminate's exit code


async def test_a_create_whose_answer_is_lost_is_terminated_by_name(fake: FakeModal) -> None:
    fake.unanswered.add("Sandbox.create")
    sb = make(
        SandboxSpec(image="python:3.12", start_limits=FAST.model_copy(update={"max_attempts": 2})),
        create_timeout_s=0.2,
    )
    with anyio.fail_after(30), pytest.raises(SandboxStartError, match=r"create_timeout_s=0\.2"):
        await sb.start()
    assert len(fake.sandboxes) == 2 and not fake.live()
    assert [args for args, _ in fake.calls_of("Sandbox.from_name")] == [
        ("sandlot", f"{sb.id}-1"),
        ("sandlot", f"{sb.id}-2"),
    ]


async def test_snapshot_is_a_filesystem_image_that_forks_are_created_from(fake: FakeModal) -> None:
    spec = SandboxSpec(image="python:3.12", post_setup_cmd="echo built > /tmp/setup.txt")
    async with make(spec, control_timeout_s=12.5, snapshot_ttl_s=3600) as original:
        snap = await original.snapshot()
    assert snap.native and snap.handle in fake.images
    assert fake.calls_of("Sandbox.snapshot_filesystem") == [((), {"timeout": 13, "ttl": 3600})]
    registry_pulls = len(fake.calls_of("Image.from_registry"))
    async with sandlot.open(snapshot=snap) as fork:
        assert (await fork.read_file("/tmp/setup.txt")) == b"built\n"
        await snap.delete()  # deferred: the fork runs
        assert snap.handle in fake.images
    assert fake.calls_of("Image.from_id") == [((snap.handle,), {})]
    assert len(fake.calls_of("Image.from_registry")) == registry_pulls, "a fork pulls nothing"
    (_, fork_create) = fake.calls_of("Sandbox.create")[-1]
    assert fork_create["image"].object_id == snap.handle
    assert fork_create["name"] == f"{fork.id}-1"
    assert fake.calls_of("experimental.image_delete") == [((snap.handle,), {})]
    assert fake.images == set()


async def test_a_snapshot_that_never_answers_is_cut_at_the_control_timeout(
    fake: FakeModal,
) -> None:
    async with make() as sb:
        cut_control_calls(sb)
        fake.unanswered.add("Sandbox.snapshot_filesystem")
        with anyio.fail_after(30), pytest.raises(SandboxError, match="did not answer") as info:
            await sb.snapshot()
        assert info.value.retryable
        ((_, kwargs),) = fake.calls_of("Sandbox.snapshot_filesystem")
        assert kwargs["timeout"] == 1  # Modal's own timeout stops the service too


async def test_deleting_an_image_gone_already_or_unanswered_does_not_raise(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    async with make() as sb:
        gone, stuck = await sb.snapshot(), await sb.snapshot()
    await FakeModalSandbox._delete_snapshot(str(gone.handle), gone.options)
    await gone.delete()  # removed from outside already: fine, nothing logged
    assert "failed" not in caplog.text
    fake.unanswered.add("experimental.image_delete")
    stuck.options = stuck.options.model_copy(update={"control_timeout_s": 0.1})
    with anyio.fail_after(30):
        await stuck.delete()
    assert f"removing snapshot {stuck.handle} (modal) failed" in caplog.text


async def test_a_fork_of_an_image_deleted_elsewhere_fails_at_once(fake: FakeModal) -> None:
    async with make() as sb:
        snap = await sb.snapshot()
    await FakeModalSandbox._delete_snapshot(str(snap.handle), snap.options)  # another process
    with pytest.raises(SandboxStartError, match="not found") as info:
        await sandlot.open(snapshot=snap).start()
    assert not info.value.retryable
    assert len(fake.calls_of("Sandbox.create")) == 2, "not retried"
    await snap.delete()
