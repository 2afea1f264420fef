"""The ``vefaas`` backend: the real Volcengine SDK against a fake control plane on loopback, and
a real ``swerex.server`` per instance behind a gateway that routes by ``x-faas-instance-name``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from fakes.fake_vefaas import FUNCTION_ID, FakeVefaas
from fakes.shared import vefaas_fake_unavailable
from requirements import missing

from sandlot import (
    BackendUnavailableError,
    SandboxDeadError,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)
from sandlot.result import ExecResult
from sandlot.sandboxes import leaks
from sandlot.sandboxes.labels import RUN_ID, SANDBOX_ID
from sandlot.sandboxes.reaper import reap
from sandlot.sandboxes.scale.starting import StartLimits

if (_REASON := vefaas_fake_unavailable()) is not None:
    missing(_REASON)

# The backend needs httpx: imported once the check above has passed.
from sandlot.sandboxes.reaper import SandboxReaper
from sandlot.sandboxes.vefaas import VefaasOptions, VefaasSandbox
from sandlot.sandboxes.vefaas.control import SandboxInfo

pytestmark = pytest.mark.anyio
FAST = StartLimits(backoff_s=0.001, backoff_max_s=0.01, max_attempts=10)
MAX_STARTING = 3  # the process's STARTING cap in these tests
CREDENTIAL_ENV = (
    "VOLCE_ACCESS_KEY",
    "VOLCENGINE_ACCESS_KEY",
    "VOLCE_SECRET_KEY",
    "VOLCENGINE_SECRET_KEY",
    "VEFAAS_FUNCTION_ID",
    "VEFAAS_FUNCTION_ROUTE",
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVefaas]:
    for var in CREDENTIAL_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SANDLOT_RUN_ID", "run-vefaas-test")
    monkeypatch.setenv("SANDLOT_MAX_STARTING", str(MAX_STARTING))
    f = FakeVefaas().start()
    yield f
    f.stop()


def make(fake: FakeVefaas, spec: SandboxSpec | None = None, **options: Any) -> VefaasSandbox:
    opts = VefaasOptions(**{**fake.options(), **options})
    return VefaasSandbox(spec or SandboxSpec(image="python:3.12", start_limits=FAST), opts)


@pytest.mark.e2e
async def test_create_request_carries_exactly_these_fields(fake: FakeVefaas) -> None:
    spec = SandboxSpec(
        image="swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
        env={"PAGER": "cat"},
        cpu=1.5,
        memory_mb=2048,
        timeout_s=7200,
        labels={"team": "rl"},
    )
    fake.known_images = None
    async with make(fake, spec) as sb:
        assert sb.sandbox_id is not None
        (body,) = fake.actions("CreateSandbox")
        metadata = body.pop("Metadata")
        assert metadata[RUN_ID] == "run-vefaas-test" and metadata[SANDBOX_ID] == sb.id
        assert metadata["team"] == "rl"
        info = body.pop("InstanceImageInfo")
        assert info["Image"] == (
            "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/"
            "sweb.eval.x86_64.django_1776_django-11099:v2"
        )
        assert info["Port"] == 8000
        assert "exec swerex-remote" in info["Command"] and "--auth-token" in info["Command"]
        assert body == {
            "FunctionId": FUNCTION_ID,
            "Envs": [{"Key": "PAGER", "Value": "cat"}],
            "Timeout": 7200,
            "TimeoutUnit": "second",
            "CpuMilli": 1500,
            "MemoryMB": 2048,
        }
        assert (await sb.exec("echo $PAGER")).stdout == "cat\n"


async def test_missing_credentials_name_the_variables(fake: FakeVefaas) -> None:
    sb = VefaasSandbox(SandboxSpec(image="python:3.12"), VefaasOptions(endpoint=fake.endpoint))
    with pytest.raises(BackendUnavailableError) as info:
        await sb.start()
    for var in ("VOLCE_ACCESS_KEY", "VOLCENGINE_ACCESS_KEY", "VOLCE_SECRET_KEY"):
        assert var in str(info.value)
    assert fake.calls == []


async def test_missing_or_mismatched_functions_name_the_variables(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BackendUnavailableError, match="VEFAAS_FUNCTION_ID"):
        await make(fake, function_id=None, function_route=None).start()
    monkeypatch.setenv("VEFAAS_FUNCTION_ID", "a,b")
    monkeypatch.setenv("VEFAAS_FUNCTION_ROUTE", "http://one")
    with pytest.raises(BackendUnavailableError, match="paired by position"):
        await make(fake, function_id=None, function_route=None).start()
    assert fake.calls == []


async def test_unknown_image_fails_at_once(fake: FakeVefaas) -> None:
    fake.known_images = {"python:3.12"}
    with pytest.raises(SandboxStartError, match="InvalidImage") as info:
        await make(fake, SandboxSpec(image="nosuch/image:1", start_limits=FAST)).start()
    assert not info.value.retryable and len(fake.actions("CreateSandbox")) == 1


@pytest.mark.e2e
async def test_a_start_command_that_exits_fails_at_once_with_its_output(fake: FakeVefaas) -> None:
    # As when the image has no interpreter: the same command would exit again, so no retry.
    sb = make(fake, bootstrap="echo no server in this image >&2; exit 3")
    with pytest.raises(SandboxStartError, match="StartCommandExited") as info:
        await sb.start()
    assert not info.value.retryable and len(fake.actions("CreateSandbox")) == 1
    assert "status 3" in str(info.value) and "no server in this image" in str(info.value)
    assert sb.closed and not fake.live()


@pytest.mark.e2e
async def test_a_token_that_begins_with_a_dash_still_starts_the_server(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandlot.sandboxes.vefaas.sandbox as module

    monkeypatch.setattr(module.secrets, "token_urlsafe", lambda n: "-dash-first-token")
    async with make(fake) as sb:
        assert (await sb.exec("echo up")).stdout == "up\n"


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        ("", True),
        ("InternalError", True),
        ("InsufficientCapacity", True),
        ("ImagePullFailed", False),
    ],
)
def test_failed_instances_are_retried_unless_the_cause_is_permanent(
    code: str, retryable: bool
) -> None:
    info = SandboxInfo("sb-1", "Failed", {}, error="x", error_code=code)
    assert info.failure_retryable is retryable


@pytest.mark.slow
async def test_throttled_creates_are_retried_under_the_cap(
    fake: FakeVefaas, caplog: pytest.LogCaptureFixture
) -> None:
    fake.throttle_rate = 0.3
    fake.create_latency_s = 0.1
    sandboxes = [make(fake) for _ in range(6)]
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes"):
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(sb.start)
    try:
        assert all(sb.state == "started" for sb in sandboxes)
        throttled = len(fake.actions("CreateSandbox")) - len(fake.instances)
        assert throttled > 0
        assert len([r for r in caplog.records if "Throttling" in r.getMessage()]) == throttled
        assert fake.peak_starting <= MAX_STARTING
    finally:
        for sb in sandboxes:
            await sb.close()
    assert not fake.live()


@pytest.mark.e2e
async def test_kill_failing_once_is_retried(fake: FakeVefaas) -> None:
    sb = make(fake)
    await sb.start()
    fake.kill_failures = 1
    await sb.close()
    assert len(fake.actions("KillSandbox")) == 2 and not fake.live()


@pytest.mark.e2e
async def test_a_kill_that_keeps_failing_lists_the_leak_with_the_vefaas_id(
    fake: FakeVefaas,
) -> None:
    sb = make(fake)
    await sb.start()
    fake.kill_failures = 100
    await sb.close()
    [leak] = [e for e in leaks.read() if e.sandbox_id == sb.id]
    assert leak.backend_id == sb.sandbox_id is not None and fake.live()


@pytest.mark.e2e
async def test_data_plane_5xx_is_retried_then_reported(fake: FakeVefaas) -> None:
    async with make(fake, request_retries=2) as sb:
        fake.gateway_failures = 2
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        fake.gateway_failures = 1000
        with pytest.raises(SandboxError, match="503") as info:
            await sb.exec("echo lost")
        assert info.value.retryable
        fake.gateway_failures = 0
        assert await sb.is_alive()
        assert (await sb.exec("echo back")).stdout == "back\n"


@pytest.mark.slow
async def test_no_request_lasts_as_long_as_the_command(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shrunk scale of "a command longer than 300 s": every request is cut after 0.5 s, yet a
    # 2 s command completes, because a command is a detached job polled with short requests.
    monkeypatch.setattr(VefaasSandbox, "job_call_s", 0.5)
    async with make(fake) as sb:
        r = await sb.exec("sleep 2; echo done", timeout=400)
        assert (r.exit_code, r.stdout) == (0, "done\n")


@pytest.mark.e2e
async def test_gc_finds_and_kills_by_run_id(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = make(fake)
    await mine.start()
    monkeypatch.setenv("SANDLOT_RUN_ID", "other-run")
    other = make(fake)
    await other.start()
    reaper = SandboxReaper(VefaasSandbox, **fake.options())
    assert {s.run_id for s in await reaper.list_sandboxes()} == {"run-vefaas-test", "other-run"}
    report = await reap(reaper, run_id="run-vefaas-test")
    assert [s.id for s in report.killed] == [mine.sandbox_id]
    assert [i.id for i in fake.live()] == [other.sandbox_id]
    await other.close()
    await mine.close()


# ----------------------------------------------------------------- control-plane failure modes


async def exec_meanwhile(
    sb: VefaasSandbox, command: str, timeout: float, then: Callable[[], object]
) -> ExecResult:
    """``sb.exec(command)``, with ``then()`` called 0.2 s after it began."""
    done: list[ExecResult] = []

    async def run() -> None:
        done.append(await sb.exec(command, timeout=timeout))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0.2)
        then()
    return done[0]


def quick(fake: FakeVefaas, **options: Any) -> VefaasSandbox:
    """A sandbox whose control-plane calls time out after 0.5 s (the fake hangs 1 s)."""
    fake.hang_s = 1.0
    return make(fake, control_timeout_s=0.5, **options)


async def test_a_wrong_secret_key_fails_the_signature_check(fake: FakeVefaas) -> None:
    with pytest.raises(SandboxStartError, match="SignatureDoesNotMatch") as info:
        await make(fake, secret_key="not-the-key").start()
    assert not info.value.retryable and not fake.instances


@pytest.mark.e2e
async def test_an_unreachable_control_plane_is_a_retryable_sandbox_error(
    fake: FakeVefaas,
) -> None:
    # urllib3's NewConnectionError is not an OSError: it used to escape start() raw.
    fake.api_down()
    try:
        sb = make(
            fake, spec=SandboxSpec(image="python:3.12", start_limits=StartLimits(max_attempts=2))
        )
        with pytest.raises(SandboxStartError, match="NewConnectionError") as info:
            await sb.start()
        assert info.value.retryable
        reaper = SandboxReaper(VefaasSandbox, **fake.options())
        with pytest.raises(SandboxError, match="ListSandboxes") as listing:
            await reaper.list_sandboxes()
        assert listing.value.retryable
    finally:
        fake.api_up()


@pytest.mark.e2e
async def test_is_alive_never_raises_when_the_control_plane_hangs(fake: FakeVefaas) -> None:
    async with quick(fake) as sb:
        fake.inject("DescribeSandbox", "timeout", "refused")
        assert await sb.is_alive()  # cannot tell: still believed alive
        assert await sb.is_alive()
        fake.expire(fake.instances[sb.sandbox_id or ""])
        assert not await sb.is_alive()


@pytest.mark.parametrize("fault", ["timeout", "dropped", "no_id"])
@pytest.mark.e2e
async def test_a_create_whose_answer_is_lost_leaks_nothing(fake: FakeVefaas, fault: str) -> None:
    fake.inject("CreateSandbox", fault)
    async with quick(fake) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    creates = fake.actions("CreateSandbox")
    assert len(creates) == 1 and len(fake.instances) == 1  # found by its labels and adopted
    assert not fake.leaked()
    assert "None" not in [b.get("SandboxId") for b in fake.actions("DescribeSandbox")]


@pytest.mark.e2e
async def test_a_lost_create_is_found_after_cancellation_too(fake: FakeVefaas) -> None:
    fake.inject("CreateSandbox", "timeout")
    sb = quick(fake)
    with anyio.move_on_after(0.3):
        await sb.start()
    assert sb.closed and len(fake.instances) == 1
    assert not fake.leaked()


@pytest.mark.parametrize("fault", ["error_body", "429", "500"])
@pytest.mark.e2e
async def test_a_throttled_create_is_retried_whatever_the_http_status(
    fake: FakeVefaas, fault: str
) -> None:
    # "error_body" is a 200 whose ResponseMetadata carries RequestLimitExceeded: the SDK
    # raises ApiException(status=200), which used to be taken for a permanent refusal.
    fake.inject("CreateSandbox", fault)
    async with make(fake) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert len(fake.actions("CreateSandbox")) == 2 and not fake.leaked()


def test_error_codes_are_classified_by_name_not_status() -> None:
    from volcenginesdkcore.rest import ApiException

    from sandlot.sandboxes.vefaas.control import translate

    def in_200(code: str) -> ApiException:
        return ApiException(status=200, reason=str({"Code": code, "Message": "m"}))

    for code in ("Throttling", "RequestLimitExceeded", "FlowLimitExceeded", "InternalError"):
        err = translate("CreateSandbox", in_200(code))
        assert err.retryable and err.code == code and err.status == 200
    for code in ("InvalidParameter", "ResourceNotFound.Function", "SignatureDoesNotMatch"):
        assert not translate("CreateSandbox", in_200(code)).retryable
    assert translate("X", ApiException(status=200, reason="InternalServiceError")).retryable
    assert translate("X", ApiException(status=404, reason="Not Found")).not_found


@pytest.mark.e2e
async def test_a_throttled_describe_while_waiting_keeps_the_sandbox(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandlot.sandboxes.shared.swerex_bootstrap import DEFAULT_BOOTSTRAP

    monkeypatch.setattr(VefaasSandbox, "status_first_s", 0.05)
    fake.inject("DescribeSandbox", "429", "error_body", "timeout", "500", "refused")
    # The server comes up 2 s late, so the wait describes the instance several times.
    async with quick(fake, bootstrap="sleep 2; " + DEFAULT_BOOTSTRAP) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert len(fake.actions("CreateSandbox")) == 1, "a healthy sandbox was destroyed"
    assert [a for a, _ in fake.faults_served].count("DescribeSandbox") == 5
    assert not fake.leaked()


@pytest.mark.e2e
async def test_describes_while_waiting_back_off(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandlot.sandboxes.shared.swerex_bootstrap import DEFAULT_BOOTSTRAP

    monkeypatch.setattr(VefaasSandbox, "status_first_s", 0.1)
    async with make(fake, bootstrap="sleep 2.5; " + DEFAULT_BOOTSTRAP):
        pass
    # Every 0.1 s would be ~25 describes; growing by 1.5x from 0.1 s it is at most 8.
    assert 2 <= len(fake.actions("DescribeSandbox")) <= 8


# ----------------------------------------------------------------- gc


async def _bare_instances(fake: FakeVefaas, n: int, run_id: str) -> list[str]:
    """``n`` instances created through the real SDK that only sleep (no server to wait for)."""
    from sandlot.sandboxes.vefaas.config import credentials
    from sandlot.sandboxes.vefaas.control import ControlPlane

    opts = VefaasOptions(**fake.options())
    control = ControlPlane(credentials(opts), opts)
    ids: list[str] = []
    for i in range(n):
        request = control.create_request(
            SandboxSpec(
                image="python:3.12", timeout_s=600, labels={RUN_ID: run_id, SANDBOX_ID: f"bare-{i}"}
            ),
            function_id=FUNCTION_ID,
            command="exec sleep 600",
            port=8000,
        )
        ids.append(await control.create(request, lambda _: None))
    return ids


@pytest.mark.e2e
async def test_gc_reads_every_page_up_to_the_reported_total(fake: FakeVefaas) -> None:
    ids = await _bare_instances(fake, 8, "run-paged")
    fake.page_cap = 3  # the service returns fewer rows than PageSize asks for
    reaper = SandboxReaper(VefaasSandbox, **fake.options())
    assert sorted(s.id for s in await reaper.list_sandboxes("run-paged")) == sorted(ids)
    report = await reap(reaper, run_id="run-paged")
    assert len(report.killed) == 8 and not report.failed and not fake.leaked()


async def test_gc_counts_a_sandbox_that_expired_after_listing_as_killed(
    fake: FakeVefaas,
) -> None:
    (sandbox_id,) = await _bare_instances(fake, 1, "run-expiring")
    reaper = SandboxReaper(VefaasSandbox, **fake.options())
    (listed,) = await reaper.list_sandboxes("run-expiring")
    fake.expire(fake.instances[sandbox_id])
    await reaper.kill(listed)  # 404: already gone, which is what gc wanted


async def test_gc_needs_no_function_route(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _bare_instances(fake, 1, "run-no-route")
    options = {k: v for k, v in fake.options().items() if k != "function_route"}
    reaper = SandboxReaper(VefaasSandbox, **options)
    report = await reap(reaper, run_id="run-no-route")
    assert len(report.killed) == 1 and not fake.leaked()


# ----------------------------------------------------------------- bootstrap without PyPI


@pytest.mark.e2e
async def test_the_fake_image_has_no_swerex_on_its_path(fake: FakeVefaas) -> None:
    # Without swerex_python the bootstrap must install swe-rex; from a wheelhouse that does
    # not exist that fails, and says so, instead of silently using the host's interpreter.
    sb = make(fake, swerex_python=None, swerex_find_links="/opt/no-wheelhouse")
    with pytest.raises(SandboxStartError, match="StartCommandExited") as info:
        await sb.start()
    assert not info.value.retryable
    (body,) = fake.actions("CreateSandbox")
    command = body["InstanceImageInfo"]["Command"]
    assert "--no-index --find-links /opt/no-wheelhouse swe-rex==1.4.0" in command
    assert not fake.leaked()


@pytest.fixture
def short_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data-plane requests give up 0.8 s after they began (0.3 s limit + 0.5 s margin)."""
    import sandlot.sandboxes.vefaas.sandbox as module

    monkeypatch.setattr(VefaasSandbox, "job_call_s", 0.3)
    monkeypatch.setattr(
        module, "SwerexClient", functools.partial(module.SwerexClient, margin_s=0.5)
    )


@pytest.mark.slow
async def test_a_hung_gateway_gives_sandbox_errors_from_exec_and_its_cleanup(
    fake: FakeVefaas, short_requests: None
) -> None:
    fake.hang_s = 1.5  # longer than a request waits
    async with make(fake, request_retries=1) as sb:
        # The launch's two tries hang, then the liveness probe's /is_alive: a 504 tells
        # nothing, so the sandbox is not dead and the launch's error is the caller's.
        fake.gateway_hangs = 3
        with pytest.raises(SandboxError, match="ReadTimeout") as info:
            await sb.exec("echo never")
        assert info.value.retryable
        # The gateway hangs after the launch: the timed-out command's cleanup hangs too, and
        # the caller still gets its (timed-out) result, not an httpx exception.
        result = await exec_meanwhile(
            sb, "sleep 5", 0.5, lambda: setattr(fake, "gateway_hangs", 100)
        )
        assert result.timed_out
        fake.gateway_hangs = 0


# ----------------------------------------------------------------- lost creates, foreign sandboxes


@pytest.mark.e2e
async def test_a_create_that_takes_effect_after_the_timeout_is_found_and_adopted(
    fake: FakeVefaas,
) -> None:
    # The service acts on the create 1 s after it arrived; the client gave up after 0.5 s. The
    # recovery used to list twice within ~0.1 s, find nothing, and the retry made a second.
    fake.inject("CreateSandbox", "stall")
    async with quick(fake) as sb:
        assert [i.id for i in fake.live()] == [sb.sandbox_id], "not one instance, or not ours"
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    await anyio.sleep(fake.hang_s)  # any create still in the service has landed by now
    assert len(fake.instances) == 1 and not fake.leaked()


@pytest.mark.e2e
async def test_a_lost_create_that_never_took_effect_is_looked_for_then_retried(
    fake: FakeVefaas,
) -> None:
    fake.inject("CreateSandbox", "blackhole")
    async with quick(fake, create_settle_s=1.0) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert len(fake.instances) == 1 and not fake.leaked()
    assert len(fake.actions("ListSandboxes")) >= 2  # looked for it more than once


@pytest.mark.e2e
async def test_recovery_and_gc_kill_only_their_own_when_the_service_ignores_filters(
    fake: FakeVefaas,
) -> None:
    bystanders = await _bare_instances(fake, 3, "another-run")
    fake.ignore_filters = True
    fake.inject("CreateSandbox", "dropped")  # taken effect, answer lost: recovery lists
    async with quick(fake) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert [i.id for i in fake.leaked()] == bystanders, "killed another run's, or leaked ours"
    reaper = SandboxReaper(VefaasSandbox, **fake.options())
    assert await reaper.list_sandboxes("run-vefaas-test") == []
    assert len(await reaper.list_sandboxes("another-run")) == 3


# ----------------------------------------------------------------- the SWE-ReX server


@pytest.mark.e2e
async def test_a_dead_server_makes_the_sandbox_dead_after_one_probe(fake: FakeVefaas) -> None:
    from sandlot import SandboxDeadError

    async with make(fake, server_restart_s=0.5, request_retries=1) as sb:
        fake.server_down(sb.sandbox_id or "")  # dead; the control plane still says Running
        with pytest.raises(SandboxDeadError, match="SWE-ReX server"):
            await sb.exec("echo lost")
        assert sb.state == "dead"
        asked = len(fake.gateway_requests)
        with pytest.raises(SandboxDeadError):
            await sb.exec("echo again")
        assert not await sb.is_alive()
        assert len(fake.gateway_requests) == asked, "a dead sandbox was asked again"


@pytest.mark.e2e
async def test_a_server_restart_keeps_the_running_commands_result(fake: FakeVefaas) -> None:
    async with make(fake) as sb:
        # The server restarts (3 s without answers) while the command runs.
        restart = functools.partial(fake.server_down, sb.sandbox_id or "", 3.0)
        result = await exec_meanwhile(sb, "sleep 1; echo done", 60, restart)
        assert (result.exit_code, result.stdout) == (0, "done\n")
        assert sb.state == "started"


# ----------------------------------------------------------------- credentials, timeouts


@pytest.mark.e2e
async def test_temporary_credentials_carry_their_session_token(
    fake: FakeVefaas, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes.fake_vefaas import STS_AK, STS_SK, STS_TOKEN

    sts = {"access_key": STS_AK, "secret_key": STS_SK}
    with pytest.raises(SandboxStartError, match="InvalidSecurityToken") as info:
        await make(fake, **sts).start()
    assert not info.value.retryable and not fake.instances
    monkeypatch.setenv("VOLCE_SESSION_TOKEN", STS_TOKEN)
    async with make(fake, **sts) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        reaper = SandboxReaper(VefaasSandbox, **{**fake.options(), **sts})
        assert [s.id for s in await reaper.list_sandboxes("run-vefaas-test")] == [sb.sandbox_id]
    monkeypatch.delenv("VOLCE_SESSION_TOKEN")
    async with make(fake, **sts, session_token=STS_TOKEN) as sb:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert not fake.leaked()


@pytest.mark.e2e
async def test_no_control_call_waits_for_an_answer_that_never_comes(fake: FakeVefaas) -> None:
    # Each action black-holed once (accepted, never answered): every call ends at
    # control_timeout_s and the sandbox still starts, runs and is killed.
    for action in ("CreateSandbox", "DescribeSandbox", "KillSandbox", "ListSandboxes"):
        fake.inject(action, "blackhole")
    with anyio.fail_after(60):  # a hang guard, not a timing assertion
        async with quick(fake, create_settle_s=1.0) as sb:
            assert await sb.is_alive()  # the describe is black-holed: cannot tell
            assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert not fake.leaked()
    assert {f for _, f in fake.faults_served} == {"blackhole"}


@pytest.mark.e2e
async def test_a_data_call_that_is_never_answered_is_cut_and_retried(
    fake: FakeVefaas, short_requests: None
) -> None:
    # The gateway accepts the launch and never answers it.
    async with make(fake, request_retries=1) as sb:
        fake.gateway_blackholes = 1
        with anyio.fail_after(30):  # a hang guard, not a timing assertion
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert fake.gateway_blackholes == 0


@pytest.mark.e2e
async def test_a_close_while_a_command_runs_ends_it_as_dead(fake: FakeVefaas) -> None:
    sb = make(fake)
    await sb.start()
    ended: list[BaseException] = []

    async def run() -> None:
        try:
            await sb.exec("sleep 3", timeout=10)
        except SandboxDeadError as exc:
            ended.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0.5)
        await sb.close()
    assert len(ended) == 1 and not fake.leaked()
