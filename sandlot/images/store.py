"""The image cache: content-addressed by digest, safe for concurrent processes and threads.

Layout under :func:`default_root` (``$SANDLOT_IMAGE_CACHE``, else
``$XDG_CACHE_HOME/sandlot/images``, else ``~/.cache/sandlot/images``)::

    blobs/sha256/<hex>        layer, config and manifest blobs as pulled (skopeo's shared blob
                              directory: a blob present is never transferred again)
    layers/<hex>.sqfs         a layer as one squashfs image in overlayfs format, named by its
                              diff_id, mounted by each jail (where layers are mounted:
                              :func:`sandlot.images.squash.mounting`)
    layers/<hex>.idx          its index: paths, modes, links, /etc/passwd and /etc/group
    layers/<hex>/             or, where they are not, the layer unpacked in overlayfs format
                              (at the image's first use, or by a pull that unpacks)
    layers/<hex>.json         its sizes
    images/<hex>.json         an image, named by its manifest digest: blobs, layers, config,
                              last use (written once its blobs are all fetched)
    refs/<key>.json           a name (tag, or local source and its mtime) -> manifest digest
    locks/, tmp/

Everything is written under ``tmp/`` and renamed into place, so an interrupted pull leaves
nothing a later run would use; file locks (:mod:`filelock`, ``flock(2)``, which also
excludes the threads of one process when each opens its own lock) make concurrent pulls of
one image download it once and unpack each layer once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from sandlot.images.squash import mounting
from sandlot.settings import settings


def default_root() -> Path:
    """The cache directory (see the module docstring)."""
    configured = settings().image_cache
    if configured:
        return Path(configured).absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "sandlot", "images").absolute()


def hex_of(digest: str) -> str:
    """``<hex>`` of ``sha256:<hex>``.

    Raises:
        ValueError: not a sha256 digest.
    """
    algorithm, _, hexpart = digest.partition(":")
    if (
        algorithm != "sha256"
        or len(hexpart) != 64
        or not all(c in "0123456789abcdef" for c in hexpart)
    ):
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return hexpart


@dataclass(frozen=True)
class ImageInfo:
    """One cached image, as ``sandlot image list`` shows it.

    Attributes:
        manifest: ``sha256:<hex>``.
        references: names that resolve to it.
        size: bytes of its layer blobs plus those of its layers unpacked.
        shared: of ``size``, bytes of layers other cached images use too.
        last_used: Unix time of its last pull or sandbox start.
        unpacked: every layer of it is ready to mount: converted to an image file where
            layers are mounted, else unpacked (else only fetched: its first sandbox
            converts or unpacks the rest).
    """

    manifest: str
    references: tuple[str, ...]
    size: int
    shared: int
    last_used: float
    unpacked: bool


@dataclass(frozen=True)
class PruneResult:
    """What :meth:`ImageStore.prune` removed: image manifests, unpacked layers, blobs, and
    the bytes of both freed."""

    images: tuple[str, ...]
    layers: int
    blobs: int
    bytes_freed: int


class ImageStore:
    """The cache at ``root`` (created on first use)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.blobs = self.root / "blobs"
        self.layers = self.root / "layers"
        self.images = self.root / "images"
        self.refs = self.root / "refs"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"

    def ensure(self) -> None:
        """Create the cache's directories."""
        for path in (
            self.blobs / "sha256",
            self.layers,
            self.images,
            self.refs,
            self.locks,
            self.tmp,
        ):
            path.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def pulling(self) -> Iterator[None]:
        """Held (shared) by every pull while it adds layers and records, so that
        :meth:`prune`, which holds it exclusively, never removes a layer a pull has unpacked
        but not yet recorded. ``flock(2)``: shared among pulls, across processes and threads."""
        with self._flock(fcntl.LOCK_SH):
            yield

    @contextmanager
    def _flock(self, mode: int) -> Iterator[None]:
        self.locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.locks / "prune.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)

    def lock(self, name: str) -> filelock.FileLock:
        """An exclusive lock named ``name`` shared by every process using this cache."""
        return filelock.FileLock(str(self.locks / f"{name}.lock"), thread_local=False)

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A new directory under ``tmp/``, removed on exit whatever happens."""
        path = self.tmp / uuid.uuid4().hex
        path.mkdir(parents=True)
        try:
            yield path
        finally:
            remove_tree(path)

    # ------------------------------------------------------------------ blobs and layers

    def blob(self, digest: str) -> Path:
        """Where blob ``digest`` is stored."""
        return self.blobs / "sha256" / hex_of(digest)

    def layer(self, diff_id: str) -> Path:
        """Where the layer whose uncompressed digest is ``diff_id`` is unpacked."""
        return self.layers / hex_of(diff_id)

    def layer_image(self, diff_id: str) -> Path:
        """Where the layer ``diff_id`` is stored as one squashfs image file."""
        return self.layers / f"{hex_of(diff_id)}.sqfs"

    def layer_index(self, diff_id: str) -> Path:
        """Where the index of :meth:`layer_image` is (:class:`sandlot.images.squash.Index`)."""
        return self.layers / f"{hex_of(diff_id)}.idx"

    def ready(self, diff_id: str, mounted: bool) -> bool:
        """Whether layer ``diff_id`` is ready: as an image file (``mounted``) or unpacked."""
        return self.layer_image(diff_id).is_file() if mounted else self.layer(diff_id).is_dir()

    def _meta(self, diff_id: str) -> dict[str, Any]:
        try:
            meta = json.loads((self.layers / f"{hex_of(diff_id)}.json").read_text())
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def unpacked_size(self, diff_id: str) -> int:
        """Bytes on disk of the unpacked or converted layer ``diff_id`` (0 when it is
        neither)."""
        return int(self._meta(diff_id).get("unpacked", 0))

    def content_size(self, diff_id: str) -> int:
        """Bytes of file content layer ``diff_id`` holds, as the caps count it (its files
        when unpacked; what its image file holds uncompressed when converted; 0 when it is
        neither)."""
        meta = self._meta(diff_id)
        return int(meta.get("bytes", meta.get("unpacked", 0)))

    def layer_sizes(self, record: dict[str, Any]) -> dict[str, int]:
        """diff_id -> bytes of its blob plus, when unpacked, its files, for image ``record``."""
        return {
            diff_id: int(blob["size"]) + self.unpacked_size(diff_id)
            for diff_id, blob in zip(record["diff_ids"], record["layer_blobs"], strict=True)
        }

    def unpacked(self, record: dict[str, Any]) -> bool:
        """Whether every layer of image ``record`` is ready to mount (converted where layers
        are mounted, else unpacked)."""
        mounted = mounting()
        return all(self.ready(d, mounted) for d in record["diff_ids"])

    def put_layer(self, diff_id: str, unpacked: Path, meta: dict[str, Any]) -> None:
        """Move the layer unpacked at ``unpacked`` (under ``tmp/``) into place with ``meta``."""
        write_json(self.layers / f"{hex_of(diff_id)}.json", meta, self.tmp)
        os.rename(unpacked, self.layer(diff_id))

    def put_layer_image(
        self, diff_id: str, image: Path, index: dict[str, Any], meta: dict[str, Any]
    ) -> None:
        """Move the layer image at ``image`` (under ``tmp/``) into place with its ``index``
        and ``meta``; the image last, as :meth:`ready` looks for it."""
        write_json(self.layer_index(diff_id), index, self.tmp)
        write_json(self.layers / f"{hex_of(diff_id)}.json", meta, self.tmp)
        os.rename(image, self.layer_image(diff_id))

    # ------------------------------------------------------------------ images and names

    def ref_file(self, key: str) -> Path:
        """The name record for the name key ``key`` (see :func:`ref_key`)."""
        return self.refs / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def resolve(self, key: str) -> dict[str, Any] | None:
        """The record of the image name key ``key`` resolves to, when it and all its blobs
        are cached (its layers may not be unpacked yet); else ``None``."""
        try:
            manifest = json.loads(self.ref_file(key).read_text())["manifest"]
        except (OSError, ValueError, KeyError):
            return None
        record = self.record(manifest)
        if record is None or not all(self.blob(b).is_file() for b in record["blobs"]):
            return None
        return record

    def record(self, manifest: str) -> dict[str, Any] | None:
        """The stored record of the image with manifest digest ``manifest``, or ``None``."""
        try:
            record: dict[str, Any] = json.loads(
                (self.images / f"{hex_of(manifest)}.json").read_text()
            )
        except (OSError, ValueError):
            return None
        return record

    def put_image(self, key: str, record: dict[str, Any]) -> None:
        """Store image ``record`` and point name key ``key`` at it (both atomically)."""
        path = self.images / f"{hex_of(record['manifest'])}.json"
        old = self.record(record["manifest"])
        names = sorted({*(old or {}).get("references", ()), *record["references"]})
        write_json(path, {**record, "references": names}, self.tmp)
        write_json(self.ref_file(key), {"name": key, "manifest": record["manifest"]}, self.tmp)

    def touch(self, manifest: str) -> None:
        """Record a use of image ``manifest`` now (its record's mtime is its last use)."""
        with suppress(OSError):
            os.utime(self.images / f"{hex_of(manifest)}.json")

    # ------------------------------------------------------------------ list and prune

    def entries(self) -> list[ImageInfo]:
        """Every cached image, most recently used first."""
        records = self._records()
        users: dict[str, int] = {}
        for record, _ in records:
            for diff_id in set(record["diff_ids"]):
                users[diff_id] = users.get(diff_id, 0) + 1
        out = []
        for record, used in records:
            sizes = self.layer_sizes(record)
            out.append(
                ImageInfo(
                    manifest=record["manifest"],
                    references=tuple(record.get("references", ())),
                    size=sum(sizes.values()),
                    shared=sum(s for d, s in sizes.items() if users[d] > 1),
                    last_used=used,
                    unpacked=self.unpacked(record),
                )
            )
        return sorted(out, key=lambda i: i.last_used, reverse=True)

    def _records(self) -> list[tuple[dict[str, Any], float]]:
        out = []
        for path in self.images.glob("*.json") if self.images.is_dir() else ():
            try:
                out.append((json.loads(path.read_text()), path.stat().st_mtime))
            except (OSError, ValueError):
                continue
        return out

    def prune(
        self,
        older_than_s: float | None = None,
        keep_size: int | None = None,
        now: float | None = None,
    ) -> PruneResult:
        """Remove images unused for ``older_than_s`` seconds, then the least recently used
        ones until the cache holds at most ``keep_size`` bytes (blobs and unpacked layers),
        then every unpacked layer, blob and name no remaining image needs, whether the image
        was only fetched or also unpacked. With neither limit, only what no image needs is
        removed.

        A sandbox running an image that is pruned keeps working only as long as the kernel
        keeps the removed layer files it has open: prune when no sandbox runs.
        """
        now = time.time() if now is None else now
        with self._flock(fcntl.LOCK_EX):
            images = sorted(self.entries(), key=lambda i: i.last_used)
            removed: list[str] = []
            kept = list(images)
            if older_than_s is not None:
                removed += [i.manifest for i in kept if now - i.last_used > older_than_s]
                kept = [i for i in kept if i.manifest not in removed]
            if keep_size is not None:
                while kept and self._size_of(kept) > keep_size:
                    removed.append(kept.pop(0).manifest)
            for manifest in removed:
                (self.images / f"{hex_of(manifest)}.json").unlink(missing_ok=True)
            return self._collect(tuple(removed))

    def _size_of(self, images: list[ImageInfo]) -> int:
        sizes: dict[str, int] = {}
        for image in images:
            record = self.record(image.manifest)
            sizes.update(self.layer_sizes(record) if record else {})
        return sum(sizes.values())

    def _collect(self, removed: tuple[str, ...]) -> PruneResult:
        records = [r for r, _ in self._records()]
        needed_layers = {hex_of(d) for r in records for d in r["diff_ids"]}
        needed_blobs = {hex_of(b) for r in records for b in r["blobs"]}
        freed = layers = blobs = 0
        for meta in self.layers.glob("*.json") if self.layers.is_dir() else ():
            if meta.stem not in needed_layers:
                freed += self.unpacked_size("sha256:" + meta.stem)
                remove_tree(self.layers / meta.stem)
                for suffix in (".sqfs", ".idx"):
                    (self.layers / f"{meta.stem}{suffix}").unlink(missing_ok=True)
                meta.unlink(missing_ok=True)
                layers += 1
        blob_dir = self.blobs / "sha256"
        for blob in blob_dir.iterdir() if blob_dir.is_dir() else ():
            if blob.name not in needed_blobs:
                with suppress(OSError):
                    freed += blob.stat().st_size
                    blob.unlink()
                    blobs += 1
        live = {r["manifest"] for r in records}
        for ref in self.refs.glob("*.json") if self.refs.is_dir() else ():
            try:
                if json.loads(ref.read_text())["manifest"] not in live:
                    ref.unlink()
            except (OSError, ValueError, KeyError):
                ref.unlink(missing_ok=True)
        return PruneResult(removed, layers, blobs, freed)


def write_json(path: Path, data: Any, tmp: Path) -> None:
    """Write ``data`` to ``path`` atomically (through ``tmp``, on the same filesystem)."""
    staging = tmp / f"{uuid.uuid4().hex}.json"
    staging.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(staging, path)


def remove_tree(path: Path) -> None:
    """Remove ``path`` (if it exists), also where unpacking left directories that are not
    writable or not listable (a layer keeps the image's modes)."""
    if not path.is_dir() or path.is_symlink():
        return
    os.chmod(path, stat.S_IRWXU)
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:  # before os.walk descends into them
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, stat.S_IRWXU)
    shutil.rmtree(path)
