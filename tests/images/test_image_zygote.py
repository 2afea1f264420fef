"""Sandboxes of container images forked by a zygote (``sandlot/sandboxes/local/zygote.py``
with ``IMAGES``): the same jail as their own bwrap makes, and that bwrap when there is none."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from registry import Registry, build_and_push, tools_missing
from requirements import TEST_IMAGE, needs

import sandlot
from sandlot.images.store import ImageStore
from sandlot.sandboxes.local import zygote_client
from sandlot.sandboxes.local.jail import ZygoteJail
from sandlot.sandboxes.local.sandbox import LocalSandbox

pytestmark = needs(tools_missing)

# Each line: what a command sees, the same in a jail of its own bwrap and of a zygote.
_VIEW = {
    "grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status | tr -s '\\t' ' '": (
        "CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapAmb: 0000000000000000"
    ),
    "grep -c Seccomp:.2 /proc/self/status": "1",
    "pwd; id -u": "/testbed\n0",
    "test -e /sandlot/.layers || test -e /sandlot/.sandboxes || echo hidden": "hidden",
    "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '": "lo",
    "echo 1 > /proc/sys/kernel/core_pattern 2>/dev/null || echo refused": "refused",
    "mount -t tmpfs none /mnt 2>/dev/null || echo refused": "refused",
    "test -e /data/gone || cat /data/hl": "one",  # the layers: a delete, a hard link
    "echo mine > /usr/local/x && cat /usr/local/x": "mine",
}


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.anyio
@pytest.mark.parametrize("zygote", [True, False])
@pytest.mark.slow
async def test_a_zygote_makes_the_jail_of_an_image_as_its_own_bwrap_does(
    zygote: bool, layered: str, shared_store: ImageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    async with sandlot.open("local", image=layered, zygote=zygote) as sb:
        assert isinstance(sb, LocalSandbox) and sb.init_pid is not None
        assert ("bwrap" in _cmdline(sb.init_pid)) is not zygote
        for command, expected in _VIEW.items():
            r = await sb.exec(command)
            assert r.stdout.strip() == expected, (command, r)
        async with sandlot.open("local", image=layered, zygote=zygote) as sibling:
            r = await sibling.exec("test -e /usr/local/x || echo private")
            assert r.stdout == "private\n"


@pytest.mark.anyio
async def test_a_fork_of_an_image_snapshot_is_made_by_the_zygote(
    layered: str, shared_store: ImageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    async with sandlot.open("local", image=layered) as sb:
        await sb.exec("echo set-up > /testbed/ready && rm /data/hl")
        snap = await sb.snapshot()
    try:
        async with sandlot.open(snapshot=snap) as fork:
            assert isinstance(fork, LocalSandbox) and fork.init_pid is not None
            assert "bwrap" not in _cmdline(fork.init_pid)
            r = await fork.exec("cat /testbed/ready; test -e /data/hl || echo removed")
            assert r.stdout.split() == ["set-up", "removed"], r
    finally:
        await snap.delete()


@pytest.mark.anyio
async def test_an_image_zygote_that_cannot_start_leaves_each_sandbox_its_own_bwrap(
    layered: str,
    shared_store: ImageStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object) -> ZygoteJail:
        return ZygoteJail(["bwrap", "--no-such-option"], [])

    monkeypatch.setattr(zygote_client, "zygote_jail", broken)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes.local"):
        for _ in range(2):
            async with sandlot.open("local", image=layered, workdir="/w-fallback") as sb:
                assert isinstance(sb, LocalSandbox) and sb.init_pid is not None
                assert "bwrap" in _cmdline(sb.init_pid)
                assert (await sb.exec("pwd; cat /data/hl")).stdout.split() == ["/w-fallback", "one"]
    assert len([r for r in caplog.records if "own bwrap" in r.getMessage()]) == 1


@pytest.mark.anyio
async def test_commands_under_per_command_limits_run_in_a_zygote_made_image_sandbox(
    layered: str, shared_store: ImageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such a command is forked by the init, which then runs ``os.execvpe``: that imports a
    module the first time, from the host's files, out of reach after the child's pivot."""
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    async with sandlot.open(
        "local", image=layered, memory_mb=1024, cpu_time_s=60, workdir="/usr/src/app"
    ) as sb:
        assert isinstance(sb, LocalSandbox) and sb.init_pid is not None
        assert "bwrap" not in _cmdline(sb.init_pid)
        r = await sb.exec("ulimit -v; ulimit -t; pwd")
        assert r.stdout.split() == [str(1024 * 1024), "60", "/usr/src/app"], r


@pytest.mark.anyio
async def test_the_jail_mounts_through_the_image_symlinks_inside_the_image(
    registry: Registry, shared_store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child mounts before its pivot, with the host's root: an image's absolute link
    followed there would lead out of the image."""
    containerfile = (
        f"FROM {TEST_IMAGE}\nRUN mkdir -p /var/tmp2 /srv/app && rm -rf /tmp /testbed && "
        "ln -s /var/tmp2 /tmp && ln -s ../srv/app /testbed\n"
    )
    ref = build_and_push(tmp_path, containerfile, "links:1", registry)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    async with sandlot.open("local", image=ref) as sb, sandlot.open("local", image=ref) as other:
        assert isinstance(sb, LocalSandbox) and sb.init_pid is not None and sb.host_dir
        assert "bwrap" not in _cmdline(sb.init_pid)
        r = await sb.exec("echo x > /tmp/f && readlink /tmp && pwd -P")
        assert r.stdout.split() == ["/var/tmp2", "/srv/app"], r
        assert (sb.host_dir / "tmp" / "f").read_text() == "x\n"  # the sandbox's own /tmp
        assert (await other.exec("test -e /tmp/f || echo private")).stdout == "private\n"


_AS_CALLER = """
import anyio, sandlot, sys
async def main():
    async with sandlot.open("local", image=sys.argv[1]) as sb:
        cmdline = open(f"/proc/{sb.init_pid}/cmdline", "rb").read()
        r = await sb.exec("id -u; grep -c 'CapEff:.0000000000000000' /proc/self/status")
        print("bwrap" in cmdline.decode(errors="replace"), *r.stdout.split())
anyio.run(main)
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is missing")
def test_an_image_zygote_runs_for_a_caller_that_is_not_root(
    layered: str, shared_store: ImageStore, tmp_path: Path
) -> None:
    """bwrap drops the capabilities of a caller that is not root unless told to keep them;
    uid 1000 in a user namespace of its own stands for such a caller."""
    env = {**os.environ, "SANDLOT_IMAGE_CACHE": str(shared_store.root)}
    env["SANDLOT_LOCAL_ROOT"] = str(tmp_path / "sandboxes")
    done = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c",
         _AS_CALLER, layered],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["False", "0", "1"], (done.stdout, done.stderr[-2000:])
