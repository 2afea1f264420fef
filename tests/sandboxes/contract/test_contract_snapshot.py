"""Contract: ``snapshot()``, forks (``sandlot.open(snapshot=)``), ``open_group``.

Backends with ``supports_snapshot`` freeze the set-up sandbox's files; the others return a
fallback snapshot whose forks run the set-up again. Both keep the same promises: a fork sees
the set-up's files and none of a sibling's (or the original's) later writes, forks start and
run concurrently, and deleting the snapshot never takes files from a running fork.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import pytest

import sandlot
from sandlot import Sandbox, SandboxError, SandboxStartError
from sandlot.sandboxes.local import LocalSandbox

if TYPE_CHECKING:
    from conftest import ContractTarget

pytestmark = pytest.mark.anyio


@pytest.fixture
def target_fields(target: ContractTarget) -> dict[str, object]:
    """``backend`` and the fields of the target, for ``sandlot.open_group``."""
    return {"backend": target.backend, **target.fields}


# A token drawn by the set-up: a fork of a native snapshot has the original's, a fork of a
# fallback snapshot draws its own.
SETUP = "echo built > setup.txt && mkdir -p deps/a && echo dep > deps/a/m.py && " + (
    "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > token.txt"
)


async def _read(sb: Sandbox, path: str) -> str:
    return (await sb.read_file(path)).decode()


async def test_forks_see_the_set_up_and_not_each_others_writes(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    async with open_sandbox(post_setup_cmd=SETUP) as original:
        snap = await original.snapshot()
        try:
            await original.exec("echo later > later.txt && echo changed > setup.txt")
            token = await _read(original, "token.txt")
            first, second = sandlot.open(snapshot=snap), sandlot.open(snapshot=snap)
            async with first, second:
                changed = await first.exec(
                    "echo mine > mine.txt && echo edited > setup.txt && rm -r deps"
                )
                assert changed.ok, changed.stderr
                seen = await second.exec(
                    "cat setup.txt deps/a/m.py; ls mine.txt later.txt 2>/dev/null; echo end"
                )
                assert seen.stdout.split() == ["built", "dep", "end"], seen.stderr
                assert await _read(first, "mine.txt") == "mine\n"
                same = await _read(second, "token.txt") == token
                assert same is snap.native
                assert snap.native is type(original).supports_snapshot
        finally:
            await snap.delete()


async def test_forks_start_and_run_concurrently(open_sandbox: Callable[..., Sandbox]) -> None:
    async with open_sandbox(post_setup_cmd=SETUP) as original:
        snap = await original.snapshot()
    forks = [sandlot.open(snapshot=snap) for _ in range(3)]
    outputs: dict[int, str] = {}

    async def use(i: int, sb: Sandbox) -> None:
        await sb.start()
        r = await sb.exec(f"echo {i} >> setup.txt && sleep 0.3 && cat setup.txt")
        outputs[i] = r.stdout

    try:
        async with anyio.create_task_group() as tg:
            for i, sb in enumerate(forks):
                tg.start_soon(use, i, sb)
    finally:
        for sb in forks:
            await sb.close()
        await snap.delete()
    assert outputs == {i: f"built\n{i}\n" for i in range(3)}
    assert len({sb.id for sb in forks}) == 3


async def test_deleting_the_snapshot_while_forks_run_is_safe(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    async with open_sandbox(post_setup_cmd=SETUP) as original:
        snap = await original.snapshot()
    async with sandlot.open(snapshot=snap) as fork:
        await snap.delete()
        assert snap.deleted
        r = await fork.exec("cat setup.txt deps/a/m.py && echo new > deps/a/n.py && ls deps/a")
        assert r.ok, r.stderr
        assert r.stdout.split() == ["built", "dep", "m.py", "n.py"]
        if snap.native:  # its files may be gone: no new fork starts from it
            with pytest.raises(SandboxStartError, match="deleted"):
                async with sandlot.open(snapshot=snap):
                    pass
    await snap.delete()  # idempotent


async def test_open_group_sets_up_sandboxes_that_are_independent(
    target_fields: dict[str, object],
) -> None:
    async with sandlot.open_group(n=3, post_setup_cmd=SETUP, **target_fields) as group:
        assert len(group) == 3 and len({sb.id for sb in group}) == 3
        await group[0].exec("echo zero > setup.txt")
        for sb in group[1:]:
            assert await _read(sb, "setup.txt") == "built\n"
        tokens = {await _read(sb, "token.txt") for sb in group}
        assert len(tokens) == (1 if type(group[0]).supports_snapshot else 3)
    assert all(sb.closed for sb in group)


async def test_image_files_the_set_up_removed_stay_removed_in_forks(
    open_sandbox: Callable[..., Sandbox], target: ContractTarget
) -> None:
    removing = (
        "rm /etc/issue && rm -r /usr/share/doc && mkdir /usr/share/doc && "
        "echo only > /usr/share/doc/only.txt"
    )
    original = open_sandbox(post_setup_cmd=removing)
    if original.spec.image == "host":  # read-only in a jail, the machine's own without one
        pytest.skip("a set-up must not remove the host image's files")
    if target.id.endswith("-fake"):  # tests/fakes/jail.py
        pytest.skip("a fake cloud's image is the host's system directories, bound read-only")
    if not original.supports_snapshot:
        pytest.skip("a fallback's forks run the set-up again: nothing is frozen")
    async with original:
        snap = await original.snapshot()
    try:
        async with sandlot.open(snapshot=snap) as fork:
            r = await fork.exec("ls /etc/issue 2>/dev/null; ls /usr/share/doc")
            assert r.stdout.split() == ["only.txt"], r.stderr
    finally:
        await snap.delete()


async def test_a_fork_snapshotted_again_keeps_both_generations(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    async with open_sandbox(post_setup_cmd=SETUP) as original:
        snap = await original.snapshot()
    try:
        async with sandlot.open(snapshot=snap) as fork:
            await fork.exec("echo second > second.txt")
            if isinstance(fork, LocalSandbox) and fork.isolated:
                # its files are the snapshot's layer plus its own: not frozen again
                with pytest.raises(SandboxError, match="snapshot the sandbox it was forked"):
                    await fork.snapshot()
                return
            again = await fork.snapshot()
        try:
            async with sandlot.open(snapshot=again) as grandchild:
                r = await grandchild.exec("cat setup.txt; cat second.txt 2>/dev/null; echo end")
                # a fallback snapshot sets up from the spec: the fork's own file is not there
                expected = ["built", "second", "end"] if again.native else ["built", "end"]
                assert r.stdout.split() == expected, r.stderr
        finally:
            await again.delete()
    finally:
        await snap.delete()
