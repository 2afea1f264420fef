"""STARTING cap, retries with backoff, start budget, cancellation: ``Sandbox.start`` at scale."""

from __future__ import annotations

import logging

import anyio
import pytest
from cloud_sim import Cloud, FakeCloudSandbox
from pydantic import ValidationError

from sandlot import SandboxSpec, SandboxStartError
from sandlot.sandboxes.scale.starting import StartLimits, starting_gate
from sandlot.settings import Settings, SettingsError

pytestmark = pytest.mark.anyio


def limits(**kw: float) -> StartLimits:
    return StartLimits(**{"backoff_s": 0.001, "backoff_max_s": 0.01, "budget_s": 30, **kw})


# A cloud backend needs a container image ("host", the default, is the local backend's).
IMAGE = "python:3.12"


def make(start_limits: StartLimits, **spec: object) -> FakeCloudSandbox:
    return FakeCloudSandbox(SandboxSpec(image=IMAGE, start_limits=start_limits, **spec))


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert StartLimits.from_env() == StartLimits()
    monkeypatch.setenv("SANDLOT_START_BUDGET_S", "12.5")
    got = StartLimits.from_env()
    assert (got.budget_s, got.max_attempts) == (12.5, 3)
    monkeypatch.setenv("SANDLOT_START_ATTEMPTS", "zero")
    with pytest.raises(SettingsError, match="SANDLOT_START_ATTEMPTS"):
        StartLimits.from_env()


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    lim = StartLimits(backoff_s=1.0, backoff_max_s=8.0)
    for retry, step in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        pauses = {lim.backoff(retry) for _ in range(50)}
        assert all(step / 2 <= p <= step for p in pauses)
        assert len(pauses) > 1, "no jitter"


async def test_the_starting_caps_are_process_settings_that_no_spec_can_resize(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The STARTING caps size one gate that every sandbox of the process shares, so they are
    process settings (``SANDLOT_MAX_STARTING``, ``SANDLOT_CLUSTER_MAX_STARTING``), not fields of
    one sandbox's ``start_limits`` (issue #39): each start sizes the gate from the settings."""
    with pytest.raises(ValidationError, match="max_starting"):
        SandboxSpec(start_limits={"max_starting": 1})
    with pytest.raises(ValidationError, match="cluster_max_starting"):
        StartLimits(cluster_max_starting=1)  # type: ignore[call-arg]
    assert (Settings.from_env({}).max_starting, Settings.from_env({}).cluster_max_starting) == (
        64,
        256,
    )
    with pytest.raises(SettingsError, match="SANDLOT_MAX_STARTING"):
        Settings.from_env({"SANDLOT_MAX_STARTING": "-1"})
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "3")
    cloud.latency_s = 0.05
    sandboxes = [make(limits(max_attempts=1)) for _ in range(12)]
    async with anyio.create_task_group() as tg:
        for sb in sandboxes:
            tg.start_soon(sb.start)
    assert cloud.peak <= 3 and starting_gate().stats.peak == 3
    for sb in sandboxes:
        await sb.close()


async def test_30_percent_rate_limited_all_start_under_the_cap(
    cloud: Cloud, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud.rate_limited = 0.3
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "8")
    lim = limits(max_attempts=10)
    sandboxes = [make(lim) for _ in range(60)]
    retries_before = starting_gate().stats.retries
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes"):
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(sb.start)
    assert all(sb.state == "started" for sb in sandboxes)
    assert cloud.peak <= 8 and starting_gate().stats.peak <= 8
    assert cloud.refused > 0
    retried = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retried) == cloud.refused == starting_gate().stats.retries - retries_before
    assert "429 Throttling" in retried[0].getMessage()
    for sb in sandboxes:
        await sb.close()
    assert not cloud.leaked


async def test_permanent_errors_are_not_retried(cloud: Cloud) -> None:
    cloud.permanent = "image python:9 not found"
    sb = make(limits(max_attempts=5))
    with pytest.raises(SandboxStartError, match="python:9") as info:
        await sb.start()
    assert sb.attempts == 1 and not info.value.retryable and sb.closed


async def test_retries_stop_after_max_attempts(cloud: Cloud) -> None:
    cloud.rate_limited = 1.0
    sb = make(limits(max_attempts=3))
    with pytest.raises(SandboxStartError, match="rate limit") as info:
        await sb.start()
    assert sb.attempts == 3 and info.value.retryable and sb.closed


async def test_start_budget_bounds_a_hung_create(cloud: Cloud) -> None:
    cloud.hang = True
    sb = make(limits(budget_s=0.2, max_attempts=3))
    with anyio.fail_after(10):
        with pytest.raises(SandboxStartError, match=r"start budget of 0\.2 s") as info:
            await sb.start()
    assert info.value.retryable and sb.closed


async def test_slot_is_released_before_post_setup(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "1")
    seen: list[int] = []

    class Probe(FakeCloudSandbox):
        async def exec(self, cmd, **kw):  # type: ignore[no-untyped-def,override]
            seen.append(starting_gate().stats.starting)
            return await super().exec(cmd, **kw)

    spec = SandboxSpec(image=IMAGE, start_limits=limits(), post_setup_cmd="setup")
    sb = Probe(spec)
    await sb.start()
    assert seen == [0]
    await sb.close()


async def test_cancelled_run_of_200_starting_kills_every_created_sandbox(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud.latency_s = 0.05
    monkeypatch.setenv("SANDLOT_MAX_STARTING", "32")
    lim = limits()
    sandboxes = [make(lim) for _ in range(200)]

    async def rollout(sb: FakeCloudSandbox) -> None:
        async with sb:
            await anyio.sleep(3600)  # the agent's work, cut short by the cancelled run

    with anyio.move_on_after(0.2) as scope:
        async with anyio.create_task_group() as tg:
            for sb in sandboxes:
                tg.start_soon(rollout, sb)
    assert scope.cancelled_caught
    assert cloud.created, "some creates should have gone through"
    assert not all(sb.state == "started" for sb in sandboxes), "the run should be cut short"
    assert cloud.peak <= 32
    assert not cloud.leaked
    assert all(sb.closed for sb in sandboxes if sb.attempts)
