"""Fetch-only pulls, and the layers unpacked at the image's first use (against the registry)."""

from __future__ import annotations

import json
import tarfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from registry import Registry, concurrently, push_layers, tools_missing
from requirements import needs

import sandlot
import sandlot.images.unpacking as unpacking
from sandlot.images import ImageError, open_image, pull
from sandlot.images.store import ImageStore
from sandlot.images.unpack import UnpackStats

pytestmark = needs(tools_missing)

DIR, FILE, LINK = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.LNKTYPE
LINKED = [
    [("data", DIR, ""), ("data/a", FILE, "one")],
    [("data/hl", LINK, "data/a"), ("data/b", FILE, "two")],  # a hard link into the layer below
    [("data/c", FILE, "three")],
]
"""Three layers, the middle one hard-linking a file of the bottom one."""

Below = Callable[[], Iterable[Path]]
Unpack = Callable[..., UnpackStats]

IMAGE_LAYERS = "unpack"
"""This module reads layers unpacked on the host (the fallback where FUSE is unusable)."""


def _fetched(registry: Registry, tmp_path: Path) -> tuple[str, ImageStore, dict[str, Any]]:
    """The image of :data:`LINKED`, fetched only into a new cache; and its record."""
    ref = push_layers(registry, tmp_path, LINKED)
    store = ImageStore(tmp_path / "cache")
    result = pull(ref, store, unpack=False)
    assert (result.cached, result.layers_transferred, result.layers_unpacked) == (False, 3, 0)
    record = store.record(result.manifest)
    assert record is not None
    return ref, store, record


def test_a_fetch_only_pull_unpacks_nothing_and_the_first_open_unpacks(
    registry: Registry, tmp_path: Path
) -> None:
    ref, store, _ = _fetched(registry, tmp_path)
    assert not any(store.layers.iterdir())
    (info,) = store.entries()
    assert not info.unpacked and info.references == (ref,)
    root = open_image(ref, store)
    assert len(root.layers) == 3 and store.entries()[0].unpacked
    for path, content in {"/data/a": "one", "/data/hl": "one", "/data/c": "three"}.items():
        found = root.lookup(path)
        assert found is not None and found.read_text() == content, path
    again = pull(ref, store)
    assert (again.cached, again.layers_transferred, again.layers_unpacked) == (True, 0, 0)


def test_a_pull_that_unpacks_after_a_fetch_only_one_transfers_nothing(
    registry: Registry, tmp_path: Path
) -> None:
    ref, store, _ = _fetched(registry, tmp_path)
    result = pull(ref, store)
    assert (result.cached, result.layers_transferred, result.layers_unpacked) == (True, 0, 3)
    assert store.entries()[0].unpacked


def test_independent_layers_unpack_at_the_same_time(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = push_layers(registry, tmp_path, [[("a", FILE, "a")], [("b", FILE, "b")]])
    store = ImageStore(tmp_path / "cache")
    record = store.record(pull(ref, store, unpack=False).manifest)
    assert record is not None
    both = threading.Barrier(2, timeout=120)  # broken unless the two unpacks overlap
    real: Unpack = unpacking.unpack_layer

    def meeting(blob: Path, diff_id: str, dest: Path, below: Below, **kw: Any) -> UnpackStats:
        both.wait()
        return real(blob, diff_id, dest, below, **kw)

    monkeypatch.setattr(unpacking, "unpack_layer", meeting)
    assert unpacking.unpack_image(store, record, workers=2) == 2


def test_a_hard_link_waits_only_for_the_layers_down_to_its_target(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = [[("base", FILE, "x")], [("data", DIR, ""), ("data/a", FILE, "one")],
              [("data/hl", LINK, "data/a")]]  # fmt: skip
    ref = push_layers(registry, tmp_path, layers)
    store = ImageStore(tmp_path / "cache")
    record = store.record(pull(ref, store, unpack=False).manifest)
    assert record is not None
    bottom, _, top = record["diff_ids"]
    top_done = threading.Event()
    real: Unpack = unpacking.unpack_layer

    def ordered(blob: Path, diff_id: str, dest: Path, below: Below, **kw: Any) -> UnpackStats:
        if diff_id == bottom:  # the bottom layer finishes last: the top must not wait for it
            assert top_done.wait(timeout=120), "the top layer waited for the bottom one"
        stats = real(blob, diff_id, dest, below, **kw)
        if diff_id == top:
            top_done.set()
        return stats

    monkeypatch.setattr(unpacking, "unpack_layer", ordered)
    assert unpacking.unpack_image(store, record, workers=3) == 3
    found = unpacking.image_root(store, ref, record).lookup("/data/hl")
    assert found is not None and found.read_text() == "one"


_OPEN_IN_A_PROCESS = """
import json, sys
from pathlib import Path
import sandlot.images.unpacking as unpacking
from sandlot.images import open_image
from sandlot.images.store import ImageStore
calls = []
real = unpacking.unpack_layer
unpacking.unpack_layer = lambda *args, **kw: calls.append(1) or real(*args, **kw)
root = open_image(sys.argv[1], ImageStore(Path(sys.argv[2])))
print(json.dumps([len(calls), root.lookup("/data/hl").read_text()]))
"""


def test_concurrent_first_opens_unpack_each_layer_once(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, store, _ = _fetched(registry, tmp_path)
    calls: list[str] = []
    real: Unpack = unpacking.unpack_layer

    def counted(blob: Path, diff_id: str, dest: Path, below: Below, **kw: Any) -> UnpackStats:
        calls.append(diff_id)
        return real(blob, diff_id, dest, below, **kw)

    monkeypatch.setattr(unpacking, "unpack_layer", counted)
    seen: list[str] = []

    def one() -> None:
        found = open_image(ref, store).lookup("/data/hl")
        seen.append(found.read_text() if found else "missing")

    outputs = concurrently(_OPEN_IN_A_PROCESS, [ref, str(store.root)], one)
    unpacked = len(calls)
    for out in outputs:
        count, content = json.loads(out)
        unpacked += count
        seen.append(content)
    assert unpacked == 3 and seen == ["one"] * 10


def test_an_interrupted_first_open_leaves_nothing_used(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, store, record = _fetched(registry, tmp_path)
    top = record["diff_ids"][-1]
    real: Unpack = unpacking.unpack_layer

    def interrupted(blob: Path, diff_id: str, dest: Path, below: Below, **kw: Any) -> UnpackStats:
        stats = real(blob, diff_id, dest, below, **kw)
        if diff_id == top:  # written, verified, not yet renamed into place
            raise KeyboardInterrupt
        return stats

    monkeypatch.setattr(unpacking, "unpack_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        open_image(ref, store)
    assert not store.layer(top).exists() and not any(store.tmp.iterdir())
    assert not store.entries()[0].unpacked
    monkeypatch.setattr(unpacking, "unpack_layer", real)
    found = open_image(ref, store).lookup("/data/c")
    assert found is not None and found.read_text() == "three"


def test_a_blob_corrupted_in_the_cache_is_refused_removed_and_fetched_again(
    registry: Registry, tmp_path: Path
) -> None:
    ref, store, record = _fetched(registry, tmp_path)
    blob = record["layer_blobs"][1]["digest"]
    data = bytearray(store.blob(blob).read_bytes())
    data[len(data) // 2] ^= 0xFF
    store.blob(blob).write_bytes(bytes(data))
    with pytest.raises(ImageError, match=f"layer blob {blob[7:]} no longer matches") as caught:
        open_image(ref, store)
    assert caught.value.retryable
    assert not store.layer(record["diff_ids"][1]).exists() and not store.blob(blob).exists()
    assert not any(store.tmp.iterdir())
    found = open_image(ref, store).lookup("/data/hl")  # fetched again, then unpacked
    assert found is not None and found.read_text() == "one"


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_sandbox_of_a_fetched_only_layered_image(
    layered: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ImageStore(tmp_path / "cache")
    pull(layered, store, unpack=False)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(store.root))
    async with sandlot.open("local", image=layered) as sb:
        r = await sb.exec("cat /data/hl && sha256sum -c /data/big.sha256 && ls /data/repl")
        assert r.stdout.split() == ["one", "/data/big:", "OK", "new"], r
    assert store.entries()[0].unpacked
