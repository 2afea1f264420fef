"""Layers kept as one squashfs file each and mounted with FUSE (``sandlot/images/squash.py``),
and the unpack fallback chosen by ``SANDLOT_IMAGE_LAYERS``: what a sandbox sees (a file deleted
in an upper layer is gone, a replaced directory hides the lower one's files, a hard link
across layers holds its target), what the cache holds, and that the FUSE daemons live exactly
as long as the jail or zygote that mounted them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from registry import tools_missing
from requirements import needs

import sandlot
from sandlot.cli.main import cli
from sandlot.images import open_image, squash
from sandlot.images.squash import mounting
from sandlot.images.store import ImageStore
from sandlot.sandboxes.local import zygote_client
from sandlot.sandboxes.local.sandbox import LocalSandbox


def _fuse_missing() -> str | None:
    if tools_missing():
        return tools_missing()
    os.environ.pop("SANDLOT_IMAGE_LAYERS", None)
    return None if mounting() else "FUSE is not usable here (/dev/fuse, squashfuse, tar2sqfs)"


pytestmark = needs(_fuse_missing)

# What the layers of registry.LAYERED must look like from inside, however they are stored.
_VIEW = {
    "test -e /data/gone || echo gone": "gone",  # deleted in an upper layer (a whiteout)
    "ls /data/repl": "new",  # removed and made again (opaque, or whiteouts of each file)
    "cat /data/hl": "one",  # a hard link to a file of a layer below
    "cat /data/l1": "one",  # a symlink chain
    "cd /data && sha256sum -c big.sha256 >/dev/null && echo intact": "intact",
    "test -c /dev/fuse || echo absent": "absent",  # the zygote's, never a sandbox's
}


def test_the_layer_store_is_chosen_by_setting_else_by_what_the_machine_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", "unpack")
    assert not mounting()
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", "mount")
    assert mounting()
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", "auto")
    monkeypatch.setenv("PATH", "/nonexistent")  # no squashfuse, no tar2sqfs
    squash._fuse_usable.cache_clear()
    try:
        assert not mounting()
    finally:
        squash._fuse_usable.cache_clear()


def _daemons(store: ImageStore, inside_zygote: bool = False) -> list[int]:
    """Pids of the squashfuse processes serving a layer image of ``store`` (named by its
    path in a zygote's view with ``inside_zygote``: every zygote's then; zombies excluded)."""
    names = {p.name if inside_zygote else str(p) for p in store.layers.glob("*.sqfs")}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"squashfuse")
            and any(
                (os.path.basename(a) if inside_zygote else a) in names
                for a in (x.decode(errors="replace") for x in argv)
            )
        ):
            found.append(int(entry.name))
    return found


def _under_zygotes(pids: list[int]) -> set[int]:
    """Those of ``pids`` that descend from a zygote of this process's registry."""
    roots = {e.zygote.process.pid for e in zygote_client._registry.entries().values() if e.zygote}
    found = set()
    for pid in pids:
        ancestor = pid
        while ancestor > 1 and ancestor not in roots:
            try:
                status = Path(f"/proc/{ancestor}/status").read_text()
            except OSError:
                break
            ancestor = int(status.split("PPid:")[1].split()[0])
        if ancestor in roots:
            found.add(pid)
    return found


def _gone(store: ImageStore, inside_zygote: bool = False, among: set[int] | None = None) -> bool:
    """Whether the daemons (those of ``among`` only, when given) are gone."""
    # Readiness, not timing: a killed process has no command line once it is dead.
    for _ in range(200):
        alive = set(_daemons(store, inside_zygote))
        if not (alive if among is None else alive & among):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["mount", "unpack"])
@pytest.mark.parametrize("zygote", [True, False])
async def test_both_layer_stores_show_deletes_replaced_directories_and_links(
    mode: str, zygote: bool, layered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ImageStore(tmp_path / "cache")
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(store.root))
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", mode)
    async with sandlot.open("local", image=layered, zygote=zygote) as sb:
        for command, expected in _VIEW.items():
            r = await sb.exec(command)
            assert r.stdout.strip() == expected, (command, r)
    layer_dirs = [p for p in store.layers.iterdir() if p.is_dir()]
    images = list(store.layers.glob("*.sqfs"))
    if mode == "mount":  # no layer entry ever became a host path; a few files per layer
        assert layer_dirs == [] and images
        assert len(list(store.layers.iterdir())) == 3 * len(images)  # .sqfs, .idx, .json
    else:
        assert layer_dirs and images == []
    listed = CliRunner().invoke(cli, ["image", "list"]).output
    assert ("mountable" if mode == "mount" else "unpacked") in listed
    assert ("layers: one squashfs file each" in listed) is (mode == "mount")
    root = open_image(layered, store)  # host-side lookups, through the index when mounted
    assert root.lookup("/data/gone") is None and root.lookup("/data/repl/old") is None
    assert root.executable("/bin/sh") and not root.executable("/etc/passwd")
    assert "root:x:0:0" in (root.read_text("/etc/passwd") or "")


@pytest.mark.anyio
async def test_the_fuse_daemons_of_a_jail_die_with_it_closed_or_killed(
    layered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ImageStore(tmp_path / "cache")
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(store.root))
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", "mount")
    async with sandlot.open("local", image=layered, zygote=False) as sb:
        assert _daemons(store)
    assert _gone(store)
    sb = await sandlot.open("local", image=layered, zygote=False).__aenter__()
    try:
        assert isinstance(sb, LocalSandbox) and _daemons(store)
        assert sb._init is not None
        os.kill(sb._init.process.pid, signal.SIGKILL)  # unshare -> bash -> bwrap, not its group
        assert _gone(store)
    finally:
        await sb.close()


@pytest.mark.anyio
async def test_the_fuse_daemons_of_a_zygote_live_as_long_as_it(
    layered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ImageStore(tmp_path / "cache")
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(store.root))
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", "mount")
    for entry in zygote_client._registry.entries().values():  # other tests' zygotes
        if entry.zygote:
            await entry.zygote.stop()
    zygote_client._registry.entries().clear()
    # Other zygotes (other tests', another run's) may serve the same layers: only the daemons
    # under this test's zygote count.
    async with sandlot.open("local", image=layered, zygote=True) as sb:
        assert isinstance(sb, LocalSandbox)
        mounted = _under_zygotes(_daemons(store, inside_zygote=True))
        assert mounted
    async with sandlot.open("local", image=layered, zygote=True) as sb:
        # mounted once per zygote, not per sandbox
        assert _under_zygotes(_daemons(store, inside_zygote=True)) == mounted
    zygotes = [e.zygote for e in zygote_client._registry.entries().values() if e.zygote]
    assert zygotes
    for zygote in zygotes:  # killed, not stopped: its PID namespace takes the daemons along
        os.kill(zygote.process.pid, signal.SIGKILL)
    assert _gone(store, inside_zygote=True, among=mounted)
    for zygote in zygotes:
        await zygote.stop()
    zygote_client._registry.entries().clear()
