"""The cache's list and prune, on records written the way a pull writes them."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from sandlot.images.store import ImageStore


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _image(store: ImageStore, name: str, layers: list[str], used: float) -> str:
    """Record image ``name`` made of ``layers`` (each 1000 unpacked bytes), last used at
    ``used``; return its manifest digest."""
    for layer in layers:
        diff_id = _digest(layer)
        if not store.layer(diff_id).exists():
            with store.scratch() as scratch:
                (scratch / "l").mkdir()
                (scratch / "l/f").write_bytes(b"x" * 1000)
                store.put_layer(diff_id, scratch / "l", {"unpacked": 1000, "blob": 0})
    manifest = _digest(name)
    record = {"manifest": manifest, "references": [name], "diff_ids": [_digest(x) for x in layers],
              "blobs": [manifest], "layer_blobs": [], "config": {}}  # fmt: skip
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
    assert (infos[a].size, infos[a].shared, infos[a].last_used) == (2000, 1000, 100)
    assert store.resolve("a") is not None


def test_prune_by_age_then_size_keeps_shared_layers(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    store.ensure()
    a = _image(store, "a", ["base", "a-top"], used=100)
    b = _image(store, "b", ["base", "b-top"], used=200)
    c = _image(store, "c", ["c-only"], used=300)
    result = store.prune(older_than_s=150, now=300)
    assert result.images == (a,) and result.layers == 1 and result.bytes_freed == 1000
    assert store.layer(_digest("base")).is_dir() and not store.layer(_digest("a-top")).exists()
    assert store.resolve("a") is None and store.resolve("b") is not None
    result = store.prune(keep_size=1000, now=300)
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
