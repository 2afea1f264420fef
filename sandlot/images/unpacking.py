"""An image's layers unpacked at first use: the missing ones, in parallel, each once.

A pull fetches blobs (:mod:`sandlot.images.pulling`); the image's first sandbox, or a pull
that unpacks (``sandlot image pull`` without ``--fetch-only``), unpacks the layers no other
image has unpacked yet. Layers are separate directories, so they unpack at the same time, one
thread each up to this machine's cores: decompression, hashing and the kernel's file creation
release the GIL, only the tar parsing holds it. A layer with a hard link to a file of a layer
below waits, at that entry, for the layers below it in this image, topmost first, down to the
one that has the target; those were submitted first, so they run or have run, and the pool
cannot deadlock.

Each layer unpacks under its file lock into ``tmp/`` and is renamed into place, so two
processes or eight threads unpack it once and an interrupted unpack leaves nothing used; the
prune lock is held shared meanwhile (:meth:`ImageStore.pulling`). A layer that does not
unpack is an :class:`ImageError` naming its blob; a blob that no longer matches its digest
(corrupted on disk since it was fetched) is removed, so the next use fetches it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandlot.images.errors import ImageError
from sandlot.images.root import ImageConfig, ImageRoot
from sandlot.images.squash import convert_layer, mounting
from sandlot.images.store import ImageStore, hex_of
from sandlot.images.unpack import unpack_layer
from sandlot.images.unpack_caps import Budget, image_budget


class _LowerLayerFailed(Exception):
    """A layer below failed: its own error is raised (it was submitted first)."""


def unpack_image(
    store: ImageStore,
    record: dict[str, Any],
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> int:
    """Unpack the layers of image ``record`` (as :meth:`ImageStore.record` returns it) that
    are not unpacked yet, ``workers`` at a time (default: this process's cores).

    Returns:
        How many layers this call unpacked (others may have been unpacked meanwhile by other
        processes or threads).

    Raises:
        ImageError: a layer is corrupt or malformed (the lowest such layer is named; nothing
            of it is cached, a corrupted blob is removed).
        OSError: the disk refused a write.
    """
    diff_ids: list[str] = record["diff_ids"]
    blobs: list[dict[str, Any]] = record["layer_blobs"]
    mounted = mounting()
    missing = [
        i for i, d in enumerate(diff_ids) if not store.ready(d, mounted) and d not in diff_ids[:i]
    ]
    if not missing:
        return 0
    futures: dict[str, Future[bool]] = {}
    # One cap for the image, what its layers unpacked for other images included.
    budget = image_budget(sum(store.content_size(d) for d in set(diff_ids)))

    def below(index: int) -> Callable[[], Iterable[Path]]:
        def each_when_ready() -> Iterator[Path]:
            for diff_id in reversed(diff_ids[:index]):
                future = futures.get(diff_id)
                if future is not None and future.exception() is not None:  # waits for it
                    raise _LowerLayerFailed(diff_id)
                yield store.layer_image(diff_id) if mounted else store.layer(diff_id)

        return each_when_ready

    count = min(len(missing), workers or len(os.sched_getaffinity(0)))
    with store.pulling(), ThreadPoolExecutor(count, thread_name_prefix="sandlot-unpack") as pool:
        for i in missing:  # bottom up: a layer's lower layers are submitted before it
            futures[diff_ids[i]] = pool.submit(
                _ready_one, store, diff_ids[i], blobs[i], below(i), log, budget, mounted
            )
        try:
            return sum(future.result() for future in futures.values())
        finally:
            for future in futures.values():
                future.cancel()  # the pool's exit then waits only for those running


def _ready_one(
    store: ImageStore,
    diff_id: str,
    blob: dict[str, Any],
    below: Callable[[], Iterable[Path]],
    log: Callable[[str], None] | None,
    budget: Budget,
    mounted: bool,
) -> bool:
    """Convert (``mounted``) or unpack one layer unless it is ready; whether this call did."""
    with store.lock("layer-" + hex_of(diff_id)):
        if store.ready(diff_id, mounted):
            return False
        if log:
            verb = "converting" if mounted else "unpacking"
            log(f"{verb} layer {diff_id[7:19]} ({blob['size']} bytes)")
        path = store.blob(blob["digest"])
        with store.scratch() as scratch:
            try:
                store_layer = _convert if mounted else _unpack
                store_layer(store, diff_id, blob, path, scratch, below, budget)
            except ImageError:
                _drop_if_corrupt(path, blob["digest"])
                raise
    return True


def _unpack(
    store: ImageStore,
    diff_id: str,
    blob: dict[str, Any],
    path: Path,
    scratch: Path,
    below: Callable[[], Iterable[Path]],
    budget: Budget,
) -> None:
    stats = unpack_layer(path, diff_id, scratch / "layer", below,
                         declared_size=blob["size"], image_budget=budget)  # fmt: skip
    meta = {"unpacked": stats.bytes, "blob": blob["size"], "entries": stats.entries,
            "devices_skipped": stats.devices_skipped,
            "xattrs_skipped": stats.xattrs_skipped}  # fmt: skip
    store.put_layer(diff_id, scratch / "layer", meta)


def _convert(
    store: ImageStore,
    diff_id: str,
    blob: dict[str, Any],
    path: Path,
    scratch: Path,
    below: Callable[[], Iterable[Path]],
    budget: Budget,
) -> None:
    stats, index = convert_layer(path, diff_id, scratch / "layer.sqfs", below,
                                 declared_size=blob["size"], image_budget=budget)  # fmt: skip
    meta = {"unpacked": stats.size, "blob": blob["size"], "entries": stats.entries,
            "bytes": stats.bytes, "devices_skipped": stats.devices_skipped,
            "xattrs_skipped": stats.xattrs_skipped, "format": "squashfs"}  # fmt: skip
    store.put_layer_image(diff_id, scratch / "layer.sqfs", dataclasses.asdict(index), meta)


def _drop_if_corrupt(path: Path, digest: str) -> None:
    """Remove the blob at ``path`` when it no longer hashes to ``digest`` (skopeo verified it
    when it was fetched: the disk changed it), so that the next use fetches it again."""
    hasher = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(1 << 20):
            hasher.update(chunk)
    if "sha256:" + hasher.hexdigest() != digest:
        path.unlink(missing_ok=True)
        raise ImageError(
            f"layer blob {hex_of(digest)} no longer matches its digest (corrupted in the cache "
            f"since it was fetched): removed, the next use of the image fetches it again",
            retryable=True,
        )


def image_root(store: ImageStore, image: str, record: dict[str, Any]) -> ImageRoot:
    """What a sandbox of image ``record`` (opened by the name ``image``) mounts; its layers
    must be unpacked (:func:`unpack_image`)."""
    layers: list[Path] = []
    mounted = mounting()
    for diff_id in reversed(record["diff_ids"]):  # topmost first; a repeated layer counts once
        path = store.layer_image(diff_id) if mounted else store.layer(diff_id)
        if path not in layers and (mounted or any(path.iterdir())):
            layers.append(path)
    if not layers:  # overlayfs needs one lower layer, even an empty one
        layers.append(store.layer(record["diff_ids"][0]))
    return ImageRoot(
        reference=image,
        manifest=record["manifest"],
        layers=tuple(layers),
        config=ImageConfig.from_oci({"config": record["config"]}),
    )
