"""Per-sandbox resources on ``local``: the disk budget (``disk_mb``) and the CPU limit (``cpu``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from local_helpers import needs_bwrap, needs_cpu_cgroup, needs_mount, open_local

from sandlot.sandboxes.local import cgroup

pytestmark = pytest.mark.anyio


@needs_bwrap
@needs_mount
async def test_disk_budget_holds_across_writable_dirs() -> None:
    async with open_local(disk_mb=64) as sb:
        r = await sb.exec(
            "head -c 40000000 /dev/zero > /tmp/a; echo a=$?; "
            "head -c 40000000 /dev/zero > /testbed/b; echo b=$?; "
            "head -c 40000000 /dev/zero > ~/c; echo c=$?",
            timeout=60,
        )
        assert "a=0" in r.stdout and "b=1" in r.stdout and "c=1" in r.stdout, r
        assert "No space left on device" in r.stderr
        host_dir = sb.host_dir
        assert host_dir is not None
        assert (await sb.exec("rm /tmp/a /testbed/b ~/c; echo ok > f && cat f")).stdout == "ok\n"
    assert host_dir is not None and not host_dir.exists()


@needs_bwrap
@needs_cpu_cgroup
@pytest.mark.e2e
async def test_cpu_limit_caps_a_busy_loop() -> None:
    async with open_local(cpu=0.1) as sb:
        assert any(
            (c / "cpu.cfs_quota_us").exists() or (c / "cpu.max").exists() for c in sb.cgroups
        )
        # A busy loop for 3 s of wall time: at 0.1 core it gets about 0.3 CPU seconds; even on
        # a loaded 2-core host an unlimited one gets well over 0.6. `times` prints the shell's
        # children's user and system time on its second line.
        r = await sb.exec("timeout 3 sh -c 'while :; do :; done'; times", timeout=30)
    assert r.exit_code == 0, r
    user, system = (_seconds(t) for t in r.stdout.splitlines()[-1].split())
    assert user + system < 0.6, r.stdout


def _seconds(text: str) -> float:
    minutes, _, seconds = text.partition("m")
    return int(minutes) * 60 + float(seconds.rstrip("s"))


@needs_bwrap
async def test_a_cpu_limit_without_a_cpu_cgroup_is_said_not_to_hold(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def only_pids(controller: str) -> Path | None:  # as for a user without delegation
        return None

    monkeypatch.setattr(cgroup, "parent_dir", only_pids)
    cgroup._warn_cpu_not_limited.cache_clear()
    with caplog.at_level(logging.WARNING, logger="sandlot.sandboxes.local"):
        for _ in range(2):
            async with open_local(cpu=0.5) as sb:
                assert sb.cgroups == []
                assert (await sb.exec("echo runs")).stdout == "runs\n"
    said = [r.getMessage() for r in caplog.records if "spec.cpu is NOT enforced" in r.getMessage()]
    assert len(said) == 1 and "Delegate=yes" in said[0], said
