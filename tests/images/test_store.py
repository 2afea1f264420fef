"""The cache's list and prune, on records written the way a pull writes them."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from sandlot.images.store import ImageStore

IMAGE_LAYERS = "unpack"
"""This module reads layers unpacked on the host (the fallback where FUSE is unusable)."""


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _blob(store: ImageStore, content: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    store.blob(digest).write_bytes(content)
    return {"digest": digest, "size": len(content)}


def _image(
    store: ImageStore, name: str, layers: list[str], used: float, unpacked: bool = True
) -> str:
    """Record image ``name`` made of ``layers`` (each a 100-byte blob and, when ``unpacked``,
    1000 unpacked bytes), last used at ``used``; return its manifest digest."""
    for layer in layers:
        diff_id = _digest(layer)
        if unpacked and not store.layer(diff_id).exists():
            with store.scratch() as scratch:
                (scratch / "l").mkdir()
                (scratch / "l/f").write_bytes(b"x" * 1000)
                store.put_layer(diff_id, scratch / "l", {"unpacked": 1000, "blob": 100})
    manifest = _blob(store, name.encode())["digest"]
    layer_blobs = [_blob(store, layer.encode().ljust(100)) for layer in layers]
    record = {"manifest": manifest, "references": [name], "diff_ids": [_digest(x) for x in layers],
              "blobs": [manifest, *(b["digest"] for b in layer_blobs)],
              "layer_blobs": layer_blobs, "config": {}}  # fmt: skip
    store.put_image(name, record)
    os.utime(store.images / f"{manifest[7:]}.json", (used, used))
    return manifest


def test_list_shows_sizes_shared_bytes_and_last_use(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    a = _image(store, "a", ["base", "a-top"], used=100)
    b = _image(store, "b", ["base", "b-top"], used=200)
    infos = {i.manifest: i for i in store.entries()}
    assert [i.manifest for i in store.entries()] == [b, a]
    assert (infos[a].size, infos[a].shared, infos[a].last_used) == (2200, 1100, 100)
    assert infos[a].unpacked and store.resolve("a") is not None


def test_a_fetched_image_resolves_and_lists_as_fetched_until_its_blobs_go(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    a = _image(store, "a", ["base", "a-top"], used=100, unpacked=False)
    (info,) = store.entries()
    assert (info.manifest, info.unpacked, info.size) == (a, False, 200)
    record = store.resolve("a")
    assert record is not None and not store.unpacked(record)
    store.blob(record["layer_blobs"][1]["digest"]).unlink()
    assert store.resolve("a") is None  # a blob gone: the next use fetches it again


def test_prune_by_age_then_size_keeps_shared_layers(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    a = _image(store, "a", ["base", "a-top"], used=100)
    b = _image(store, "b", ["base", "b-top"], used=200)
    c = _image(store, "c", ["c-only"], used=300)
    result = store.prune(older_than_s=150, now=300)
    assert (result.images, result.layers, result.blobs) == ((a,), 1, 2)
    assert result.bytes_freed == 1000 + 100 + len("a")  # a-top unpacked, its blob, manifest
    assert store.layer(_digest("base")).is_dir() and not store.layer(_digest("a-top")).exists()
    assert store.resolve("a") is None and store.resolve("b") is not None
    result = store.prune(keep_size=1100, now=300)
    assert result.images == (b,)  # the least recently used goes first
    assert [i.manifest for i in store.entries()] == [c]
    assert not store.layer(_digest("base")).exists()


def test_prune_waits_for_pulls_in_progress(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    with store.pulling():  # a pull that has unpacked a layer and not yet recorded its image
        _image(store, "a", ["a-top"], used=100)
        (store.images / f"{_digest('a')[7:]}.json").unlink()
        fd = os.open(store.locks / "prune.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # the lock prune takes
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    store.prune()
    assert not store.layer(_digest("a-top")).exists()  # unrecorded once the pull is over


def test_prune_removes_fetched_and_unpacked_images_alike(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    _image(store, "fetched", ["base", "f-top"], used=100, unpacked=False)
    _image(store, "unpacked", ["base", "u-top"], used=100)
    result = store.prune(older_than_s=0, now=200)
    assert (len(result.images), result.layers, result.blobs) == (2, 2, 5)
    assert store.entries() == [] and not any(store.layers.iterdir())
    assert not any((store.blobs / "sha256").iterdir())
