"""Sandboxes forked by a zygote: the same jail as one made by its own bwrap, and a zygote's
life (death, replacement, idle cap, refusal) never loses a sandbox silently."""

from __future__ import annotations

import logging
import os
import signal
import socket
import uuid
from pathlib import Path

import anyio
import pytest
from local_helpers import needs_bwrap, open_local, wait_until_no_process_has

from sandlot import SandboxDeadError
from sandlot.sandboxes.local import jail, zygote_client
from sandlot.sandboxes.local.jail import ZygoteJail
from sandlot.sandboxes.local.peer import InitDied

pytestmark = [pytest.mark.anyio, needs_bwrap]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _zygotes() -> dict[str, zygote_client.Zygote]:
    """Live zygotes of this thread, by workdir."""
    return {
        config.workdir: entry.zygote
        for config, entry in zygote_client._registry.entries().items()
        if entry.zygote is not None and entry.zygote.alive
    }


async def test_a_forked_sandbox_holds_no_capability_and_sees_no_other_sandbox() -> None:
    async with open_local() as sb:
        assert sb.init_pid is not None and "bwrap" not in _cmdline(sb.init_pid)
        for process in ("self", "1"):  # a command, and the sandbox's init
            status = await sb.exec(f"grep -E '^(Cap|NoNewPrivs)' /proc/{process}/status")
            fields = dict(line.split(":\t") for line in status.stdout.splitlines())
            assert fields.pop("NoNewPrivs") == "1"
            assert set(fields.values()) == {"0000000000000000"}, (process, status.stdout)
        r = await sb.exec("ls -A /sandlot/.sandboxes /sandlot/.keep 2>&1")
        assert "sandlot-" not in r.stdout and sb.id not in r.stdout, r.stdout
        r = await sb.exec("mount -t tmpfs none /tmp || touch /dev/planted || echo refused")
        assert r.stdout.strip().endswith("refused"), r


async def test_siblings_of_one_zygote_share_no_file_process_or_loopback(marker: str) -> None:
    listen = 'python3 -c \'import socket,time; s=socket.socket(); s.bind(("127.0.0.1", 4711)); '
    listen += f's.listen(); open("/tmp/up", "w").close(); time.sleep(60)\' {marker} &'
    async with open_local() as a, open_local() as b:
        dirs = "/tmp /dev/shm /run /sandlot/home"
        r = await a.exec(f"set -e; for d in {dirs}; do echo a > $d/mine; done")
        assert r.ok, r.stderr
        await a.exec(f"{listen} while [ ! -e /tmp/up ]; do sleep 0.01; done")
        # The init's standard streams: the zygote's would be the same file in both.
        await a.exec("for fd in 0 1 2; do echo a >> /proc/1/fd/$fd; done")
        r = await b.exec(
            "cat /tmp/mine /dev/shm/mine /run/mine /sandlot/home/mine /proc/1/fd/2 2>&1; "
            f"grep -l {marker} /proc/[0-9]*/cmdline 2>/dev/null; "
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 4711), 1)' "
            "2>&1 | tail -1"
        )
        assert "a\n" not in r.stdout and marker not in r.stdout, r.stdout
        assert "ConnectionRefusedError" in r.stdout, r.stdout
    assert wait_until_no_process_has(marker) == []


async def test_a_killed_zygote_takes_its_sandboxes_and_is_replaced(marker: str) -> None:
    async with open_local() as sb:
        await sb.exec(f"(exec -a {marker} sleep 300) & echo started")
        assert sb._zygote is not None
        zygote = sb._zygote[1]
        os.killpg(zygote.process.pid, signal.SIGKILL)
        assert wait_until_no_process_has(marker) == []
        with pytest.raises(SandboxDeadError):
            await sb.exec("true")
    async with open_local() as fresh:
        assert (await fresh.exec("echo alive")).stdout == "alive\n"
        assert fresh._zygote is not None and fresh._zygote[1] is not zygote


async def test_idle_zygotes_beyond_the_cap_are_stopped() -> None:
    shapes = [f"/w{uuid.uuid4().hex[:8]}" for _ in range(zygote_client.IDLE_ZYGOTES + 2)]
    pids = {}
    for workdir in shapes:
        async with open_local(workdir=workdir) as sb:
            assert (await sb.exec("pwd")).stdout == f"{workdir}\n"
            pids[workdir] = _zygotes()[workdir].process.pid
    live = set(_zygotes())
    assert len(live) <= zygote_client.IDLE_ZYGOTES
    assert set(shapes[-zygote_client.IDLE_ZYGOTES :]) <= live  # the most recently used stay
    for workdir in shapes[:2]:
        assert workdir not in live
        assert not await anyio.Path(f"/proc/{pids[workdir]}").exists()


async def test_a_sandbox_the_zygote_cannot_make_fails_alone() -> None:
    async with open_local() as sb:
        assert sb._zygote is not None
        zygote = sb._zygote[1]
        with pytest.raises(InitDied, match="cannot set up the sandbox's jail"):
            await zygote_client.fork_init(
                zygote, name="no-such-sandbox", limits="", cgroup_joins=[], prefix="x"
            )
        assert (await sb.exec("echo still")).stdout == "still\n"
    async with open_local() as after:
        assert (await after.exec("echo next")).stdout == "next\n"


async def test_a_zygote_that_cannot_start_leaves_each_sandbox_its_own_bwrap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> ZygoteJail:
        return ZygoteJail(["bwrap", "--no-such-option"], [])

    monkeypatch.setattr(zygote_client, "zygote_jail", broken)
    workdir = f"/w{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes.local"):
        for _ in range(2):
            async with open_local(workdir=workdir) as sb:
                assert sb.init_pid is not None and "bwrap" in _cmdline(sb.init_pid)
                assert (await sb.exec("pwd")).stdout == f"{workdir}\n"
    assert len([r for r in caplog.records if "own bwrap" in r.getMessage()]) == 1


async def test_zygote_false_gives_each_sandbox_its_own_bwrap() -> None:
    async with open_local(zygote=False) as sb:
        assert sb.init_pid is not None and "bwrap" in _cmdline(sb.init_pid)
        assert (await sb.exec("echo own")).stdout == "own\n"


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_read_only_binds_below_private_mounts_are_there(
    zygote: bool, visible_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An environment under /tmp, or systemd-resolved's resolv.conf under /run: below a mount
    # point each sandbox covers with its own.
    (visible_dir / "file.txt").write_text("FILE")
    (visible_dir / "tree").mkdir()
    (visible_dir / "tree" / "a").write_text("TREE")
    original = jail._read_only_binds

    def more(config: jail.JailConfig) -> list[tuple[str, str]]:
        extra = [(f"{visible_dir}/file.txt", "/run/kept/file.txt")]
        return [*original(config), *extra, (f"{visible_dir}/tree", "/tmp/kept/tree")]

    monkeypatch.setattr(jail, "_read_only_binds", more)
    async with open_local(workdir=f"/w{uuid.uuid4().hex[:8]}", zygote=zygote) as sb:
        r = await sb.exec("cat /run/kept/file.txt /tmp/kept/tree/a")
        assert r.stdout == "FILETREE", r
        r = await sb.exec("echo x > /tmp/kept/tree/a || echo x > /run/kept/file.txt || echo ro")
        assert r.stdout == "ro\n", r
    assert (visible_dir / "tree" / "a").read_text() == "TREE"


@pytest.mark.e2e
async def test_a_stuck_zygote_is_retired_and_its_sandboxes_start_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workdir = f"/w{uuid.uuid4().hex[:8]}"
    async with open_local(workdir=workdir) as first:
        assert first._zygote is not None
        stuck = first._zygote[1]
    ready_pid = zygote_client._ready_pid
    calls = 0

    async def never_ready_once(sock: socket.socket) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep_forever()
        return await ready_pid(sock)

    monkeypatch.setattr(zygote_client, "_ready_pid", never_ready_once)
    monkeypatch.setattr(zygote_client, "_READY_BUDGET_S", 0.5)
    async with open_local(workdir=workdir, start_limits={"max_attempts": 2}) as sb:
        assert stuck.retired and not stuck.alive
        assert not await anyio.Path(f"/proc/{stuck.process.pid}").exists()
        assert sb._zygote is not None and sb._zygote[1] is not stuck
        assert (await sb.exec("echo elsewhere")).stdout == "elsewhere\n"
