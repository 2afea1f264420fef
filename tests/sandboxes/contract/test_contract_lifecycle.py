"""Contract: opening, closing, dying, cancellation, setup, network, ``sandlot.open`` errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import pytest

import sandlot
from sandlot import (
    BackendNotFoundError,
    Sandbox,
    SandboxDeadError,
    SandboxSetupError,
)

if TYPE_CHECKING:
    from conftest import ContractTarget, TickProbe

pytestmark = pytest.mark.anyio


async def test_is_alive_follows_the_lifecycle(open_sandbox: Callable[..., Sandbox]) -> None:
    sb = open_sandbox()
    assert not await sb.is_alive()
    async with sb:
        assert await sb.is_alive()
    assert not await sb.is_alive() and sb.closed


async def test_close_is_idempotent(sandbox: Sandbox) -> None:
    await sandbox.close()
    await sandbox.close()
    assert sandbox.closed and not await sandbox.is_alive()


async def test_calls_after_close_raise_dead(sandbox: Sandbox) -> None:
    await sandbox.close()
    with pytest.raises(SandboxDeadError):
        await sandbox.exec("true")
    with pytest.raises(SandboxDeadError):
        await sandbox.read_file("x")
    with pytest.raises(SandboxDeadError):
        await sandbox.write_file("x", b"")
    with pytest.raises(SandboxDeadError):
        await sandbox.start()


async def test_calls_before_start_raise_dead(open_sandbox: Callable[..., Sandbox]) -> None:
    sb = open_sandbox()
    with pytest.raises(SandboxDeadError, match="not started"):
        await sb.exec("true")
    with pytest.raises(SandboxDeadError, match="not started"):
        await sb.read_file("x")
    with pytest.raises(SandboxDeadError, match="not started"):
        await sb.write_file("x", b"")


async def test_error_in_body_closes_and_close_stays_safe(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    sb = open_sandbox()
    with pytest.raises(RuntimeError, match="boom"):
        async with sb:
            await sb.exec("true")
            raise RuntimeError("boom")
    assert sb.closed
    await sb.close()


async def test_post_setup_cmd_runs_before_use(open_sandbox: Callable[..., Sandbox]) -> None:
    async with open_sandbox(post_setup_cmd="echo ready > setup.txt") as sb:
        assert (await sb.exec("cat setup.txt")).stdout == "ready\n"


async def test_post_setup_failure_raises_with_command_and_output(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    cmd = "echo step one; echo it broke >&2; exit 3"
    sb = open_sandbox(post_setup_cmd=cmd)
    with pytest.raises(SandboxSetupError) as info:
        await sb.start()
    err = info.value
    assert (err.command, err.exit_code) == (cmd, 3)
    assert "step one" in err.output_tail and "it broke" in err.output_tail
    assert cmd in str(err) and not err.retryable
    assert sb.closed
    await sb.close()


async def test_cancelled_exec_leaves_no_process(
    sandbox: Sandbox, tick_probe: Callable[[Sandbox], TickProbe]
) -> None:
    probe = tick_probe(sandbox)
    with anyio.move_on_after(1) as scope:
        await sandbox.exec(probe.command + "sleep 30")
    assert scope.cancelled_caught
    await probe.assert_stopped()
    assert (await sandbox.exec("echo still usable")).stdout == "still usable\n"


async def test_cancellation_inside_async_with_closes(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    sb = open_sandbox()
    with anyio.CancelScope() as scope:
        async with sb:
            # The deadline starts once the sandbox is up, so the cancel lands inside exec
            # however slowly the backend starts.
            scope.deadline = anyio.current_time() + 0.5
            await sb.exec("sleep 30")
    assert scope.cancelled_caught
    assert sb.closed and not await sb.is_alive()


async def test_killed_from_outside_raises_dead(sandbox: Sandbox, target: ContractTarget) -> None:
    if target.kill_from_outside is None:
        pytest.skip(f"{target.id} cannot be killed from outside in tests")
    await target.kill_from_outside(sandbox)
    assert not await sandbox.is_alive()
    with pytest.raises(SandboxDeadError):
        await sandbox.exec("true")
    with pytest.raises(SandboxDeadError):
        await sandbox.read_file("x")
    await sandbox.close()


def _interfaces(proc_net_dev: str) -> set[str]:
    return {line.split(":")[0].strip() for line in proc_net_dev.splitlines() if ":" in line}


async def test_network_is_off_by_default(
    open_sandbox: Callable[..., Sandbox], target: ContractTarget
) -> None:
    target.require_isolated()
    async with open_sandbox() as sb:
        r = await sb.exec("cat /proc/net/dev")
        assert _interfaces(r.stdout) == {"lo"}
    async with open_sandbox(network=True) as sb:
        r = await sb.exec("cat /proc/net/dev")
        assert _interfaces(r.stdout) - {"lo"}, "network=True should give a real interface"


async def test_open_rejects_unknown_backend() -> None:
    with pytest.raises(BackendNotFoundError, match="local"):
        sandlot.open("no-such-backend")


async def test_open_names_an_unknown_keyword(target: ContractTarget) -> None:
    with pytest.raises(ValueError, match="imaeg"):
        target.open(imaeg="typo")
