"""Contract: hostile use of resources (issue 13): process floods, deleted tools, disk budget,
network modes. Every backend either enforces a limit or refuses to start with a clear error."""

from __future__ import annotations

import secrets
import shutil
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import pytest

from sandlot import Sandbox, SandboxStartError

if TYPE_CHECKING:
    from conftest import ContractTarget, ShortTimeout, TickProbe

pytestmark = pytest.mark.anyio

# Counts live processes whose command line starts with "$1", from /proc (no ps/pgrep needed).
_COUNT = """
n=0
for d in /proc/[0-9]*; do
  c=$(tr '\\0' ' ' < "$d/cmdline" 2>/dev/null)
  case $c in "$1"*) n=$((n+1));; esac
done
echo $n
"""


async def _count(sb: Sandbox, prefix: str) -> int:
    r = await sb.exec(["bash", "-c", _COUNT, "count", prefix])
    return int(r.stdout)


def _unique() -> int:
    """A number for a command line that no other test or run uses: where a target shares the
    host's PID namespace, :func:`_count` also sees every other sandbox's processes (e.g. the
    docker target's killed sleepers, until the engine reaps them)."""
    return 1_000_000 + secrets.randbelow(9_000_000)


async def test_a_process_flood_is_killed_at_the_timeout(
    sandbox: Sandbox, tick_probe: Callable[[Sandbox], TickProbe]
) -> None:
    # Bounded (200 sleepers plus a busy loop that ignores SIGTERM), unlike a real fork bomb, so
    # that it is safe on every target, including those that run on the host.
    probe, n = tick_probe(sandbox), _unique()
    flood = f"trap '' TERM; for i in $(seq 200); do sleep {n} & done; while :; do :; done"
    r = await sandbox.exec(probe.command + flood, timeout=3)
    assert r.timed_out
    await probe.assert_stopped()
    assert await _count(sandbox, f"sleep {n}") == 0
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_timeouts_kill_after_grep_and_sleep_are_deleted(
    sandbox: Sandbox, target: ContractTarget, short_timeout: ShortTimeout
) -> None:
    target.require_isolated()
    # Never let this delete the host's tools: the sandbox's /usr/bin must not be the host's.
    canary = await sandbox.exec("touch /usr/bin/.sandlot-canary && echo wrote")
    if canary.stdout == "wrote\n":
        shared = await anyio.Path("/usr/bin/.sandlot-canary").exists()
        await sandbox.exec("rm -f /usr/bin/.sandlot-canary")
        assert not shared, f"{target.id}: the sandbox writes the host's /usr/bin"
    await sandbox.exec("rm -f /usr/bin/grep /usr/bin/sleep /bin/grep /bin/sleep")
    assert shutil.which("grep") and shutil.which("sleep")
    n = _unique()
    timeout = await short_timeout(lambda: sandbox.exec("true"), 1)
    r = await sandbox.exec(f"trap '' TERM; echo started {n}; while :; do :; done", timeout=timeout)
    assert r.timed_out and r.stdout == f"started {n}\n"
    assert await _count(sandbox, f"bash -c trap '' TERM; echo started {n}") == 0
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_disk_budget_is_kept_or_refused(open_sandbox: Callable[..., Sandbox]) -> None:
    sb = open_sandbox(disk_mb=64)
    try:
        await sb.start()
    except SandboxStartError as exc:
        assert "disk_mb" in str(exc) and not exc.retryable
        assert sb.closed
        return
    async with sb:
        r = await sb.exec("head -c 100M /dev/zero > big.bin")
        assert r.exit_code != 0
        assert "space" in r.stderr.lower() or "quota" in r.stderr.lower(), r.stderr


async def test_network_internet_is_kept_or_refused(open_sandbox: Callable[..., Sandbox]) -> None:
    sb = open_sandbox(network="internet")
    try:
        await sb.start()
    except SandboxStartError as exc:
        assert "internet" in str(exc) and not exc.retryable
        assert sb.closed
        return
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        async with sb:
            r = await sb.exec(f"timeout 3 bash -c '</dev/tcp/127.0.0.1/{port}'")
            assert r.exit_code != 0, "network='internet' reached the host's 127.0.0.1"
