"""``sandlot.open_group``: n sandboxes of one spec set up once, and its failures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sandlot
from sandlot import SandboxError, SandboxSetupError
from sandlot.sandboxes.local import LocalSandbox

pytestmark = pytest.mark.anyio

TOKEN = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > token.txt"


@pytest.fixture
def root_dir(local_root: Path) -> str:
    return str(local_root)


async def test_a_group_falls_back_to_setting_each_up_when_freezing_fails(
    root_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(self: LocalSandbox) -> str:
        raise SandboxError("cannot freeze", retryable=False)

    monkeypatch.setattr(LocalSandbox, "_snapshot", refuse)
    async with sandlot.open_group(n=2, post_setup_cmd=TOKEN, root_dir=root_dir) as group:
        tokens = {(await sb.read_file("token.txt")) for sb in group}
        assert len(tokens) == 2 and all(sb.origin is None for sb in group)


async def test_a_failing_set_up_fails_the_group_and_leaves_nothing(root_dir: str) -> None:
    with pytest.raises(SandboxSetupError):
        async with sandlot.open_group(n=2, post_setup_cmd="exit 3", root_dir=root_dir):
            pass
    assert os.listdir(root_dir) == []


async def test_a_group_sandbox_whose_fork_fails_to_start_is_set_up_instead(
    root_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = LocalSandbox._start
    refused: list[str] = []

    async def refuse_one_fork(self: LocalSandbox) -> None:
        if self.origin is not None and not refused:
            refused.append(self.id)
            raise SandboxError("the fork's overlay cannot be mounted", retryable=False)
        await start(self)

    monkeypatch.setattr(LocalSandbox, "_start", refuse_one_fork)
    async with sandlot.open_group(n=3, post_setup_cmd=TOKEN, root_dir=root_dir) as group:
        tokens = [await sb.read_file("token.txt") for sb in group]
        assert sorted(sb.origin is not None for sb in group) == [False, True, True]
        assert len(set(tokens)) == 2  # the forks' token, and the set-up's own
    assert os.listdir(root_dir) == []
