"""Pull an image into the cache and open it for a sandbox.

A pull fetches: skopeo copies the image into a private OCI layout whose blobs go to the
cache's shared blob directory (``--dest-shared-blob-dir``): a blob already there (a layer
another image shares) is not transferred again, and skopeo verifies every blob it transfers
against its digest. The manifest and config are verified and the image record and its name
written last. That is the work of ``skopeo copy`` into an OCI layout, and no more: unpacking
the layers (creating the image's files, which costs 10-20x the copy on a local disk) happens
at the image's first use (:mod:`sandlot.images.unpacking`), or right after the fetch when the
pull is asked to (``unpack=True``, the default of :func:`pull`). A name already cached is not
fetched again (docker's ``missing`` pull policy); ``force`` re-resolves it.

A registry nobody listens on fails at once, naming the registry (a refused connection is not
retried). The layers and bytes a fetch has transferred are shown as it goes
(:mod:`sandlot.images.progress`, on stderr).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandlot.images import progress
from sandlot.images.errors import ImageError
from sandlot.images.progress import PullObserver
from sandlot.images.reference import Reference, parse
from sandlot.images.remote import registry_error
from sandlot.images.root import ImageRoot
from sandlot.images.store import ImageStore, hex_of
from sandlot.images.tools import find_tool
from sandlot.images.unpacking import image_root, unpack_image

RETRIES = 3
"""How often a copy that failed for a transient reason is repeated, after 1, 2, 4 s (skopeo's
own ``--retry-times`` is 0: it would also repeat a refused connection, for seconds, where
nothing listens)."""


@dataclass(frozen=True)
class PullResult:
    """One pull.

    Attributes:
        manifest: ``sha256:<hex>`` of the image's manifest.
        cached: it was already fetched (nothing transferred).
        transferred: bytes of layer blobs transferred (those not in the cache before).
        layers_transferred: how many layer blobs were transferred.
        layers_unpacked: how many layers this pull unpacked (0 with ``unpack=False``; the
            others were already, or are left to the first use).
        seconds: wall time of the pull.
    """

    manifest: str
    cached: bool
    transferred: int
    layers_transferred: int
    layers_unpacked: int
    seconds: float


def name_key(ref: Reference) -> str:
    """The cache key of a name: the skopeo source, and for a local source also the size and
    modification time of its file (or ``index.json``), so a rebuilt archive is pulled again."""
    if not ref.local:
        return ref.source
    body = ref.source.split(":", 1)[1]
    for candidate in (body, body.rsplit(":", 1)[0]):
        path = Path(candidate)
        target = path / "index.json" if path.is_dir() else path
        if target.exists():
            st = target.stat()
            return f"{ref.source}@{st.st_size}:{st.st_mtime_ns}"
    return ref.source


def _parse(image: str) -> Reference:
    try:
        ref = parse(image)
    except ValueError as exc:
        raise ImageError(str(exc), retryable=False) from exc
    if ref is None:
        raise ImageError(f"{image!r} is not an image reference ('host' or a directory)")
    return ref


def open_image(image: str, store: ImageStore | None = None) -> ImageRoot:
    """The image named ``image``, ready to mount: fetched when it is not cached, then those
    of its layers not unpacked yet are unpacked (in parallel, each once); records its use.

    Raises:
        ImageError: it cannot be fetched or a layer cannot be unpacked (``retryable`` says
            whether to retry).
        BackendUnavailableError: skopeo is missing (the message says how to install it).
        OSError: the disk refused a write.
    """
    store = store or ImageStore()
    record, _ = _fetch(store, _parse(image), force=False, log=None, observer=progress.observer())
    unpack_image(store, record)
    return image_root(store, image, record)


def pull(
    image: str,
    store: ImageStore | None = None,
    *,
    force: bool = False,
    unpack: bool = True,
    log: Callable[[str], None] | None = None,
    observer: PullObserver | None = None,
) -> PullResult:
    """Fetch ``image`` into the cache (once, whatever other processes and threads do), then
    unpack its layers unless ``unpack`` is false.

    Args:
        image: a reference (see :mod:`sandlot.images.reference`).
        store: the cache; the default one when ``None``.
        force: re-resolve a tag already cached (its unchanged blobs are not transferred).
        unpack: also unpack the layers not unpacked yet (in parallel), so the image's first
            sandbox starts as fast as the next ones: the default, since one pulls ahead to be
            ready to run. ``False`` fetches only (the work of ``skopeo copy``); the first
            sandbox of the image then unpacks.
        log: called with one line per step (for progress output).
        observer: told the layers and bytes of the fetch as it goes; ``None``: the default
            one (:func:`sandlot.images.progress.observer`, lines on stderr).

    Raises:
        ImageError: the fetch or an unpack failed; nothing of it is used by a later run.
        BackendUnavailableError: skopeo is missing.
        OSError: the disk refused a write.
    """
    store = store or ImageStore()
    started = time.monotonic()
    watcher = observer or progress.observer()
    record, fresh = _fetch(store, _parse(image), force=force, log=log, observer=watcher)
    unpacked = unpack_image(store, record, log) if unpack else 0
    return PullResult(
        manifest=record["manifest"],
        cached=fresh is None,
        transferred=sum(b["size"] for b in fresh or ()),
        layers_transferred=len(fresh or ()),
        layers_unpacked=unpacked,
        seconds=time.monotonic() - started,
    )


def _fetch(
    store: ImageStore,
    ref: Reference,
    *,
    force: bool,
    log: Callable[[str], None] | None,
    observer: PullObserver | None,
) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """The record of ``ref``, fetched unless cached (and not ``force``), and the layer blobs
    this call transferred (``None`` when it fetched nothing); records the image's use; the
    fetch's progress goes to ``observer``."""
    key = name_key(ref)
    record = None if force else store.resolve(key)
    if record is not None:  # cached: no lock needed to read what is written atomically
        store.touch(record["manifest"])
        return record, None
    store.ensure()
    name_lock = store.lock("name-" + hashlib.sha256(key.encode()).hexdigest()[:32])
    with store.pulling(), name_lock:
        # A name that pins a digest never resolves to anything else: nothing to re-resolve.
        record = None if force and not ref.by_digest else store.resolve(key)
        if record is not None:
            store.touch(record["manifest"])
            return record, None
        started = time.monotonic()
        had = set(os.listdir(store.blobs / "sha256"))
        if observer:
            observer.started(ref.text)
        with store.scratch() as layout:
            _skopeo_copy(ref, store, layout, log, observer)
            record = _read_layout(store, layout, ref)
        store.put_image(key, record)
    fresh = [b for b in record["layer_blobs"] if hex_of(b["digest"]) not in had]
    if observer:
        observer.finished(ref.text, sum(b["size"] for b in fresh), time.monotonic() - started)
    return record, fresh


def _skopeo_copy(
    ref: Reference,
    store: ImageStore,
    layout: Path,
    log: Callable[[str], None] | None,
    observer: PullObserver | None,
) -> None:
    """Copy ``ref`` into the OCI layout ``layout`` with its blobs in the shared store; a copy
    that fails for a transient reason (a 5xx, a connection dropped, also mid-blob) is repeated
    up to :data:`RETRIES` times, the blobs it finished not transferred again; a refused
    connection is not (the error names the registry)."""
    argv = [find_tool("skopeo"), "copy", "--retry-times", "0"]
    argv += ["--dest-shared-blob-dir", str(store.blobs)]
    if ref.plain_http:
        argv.append("--src-tls-verify=false")
    argv += [ref.source, f"oci:{layout / 'layout'}:image"]
    for attempt in range(RETRIES + 1):
        if log:
            log(f"{ref.text}: copying with skopeo" + (f" (retry {attempt})" if attempt else ""))
        returncode, stderr = _run_copy(argv, store, layout, ref.text, observer)
        if returncode == 0:
            return
        error = registry_error(ref, stderr)
        if not error.retryable or attempt == RETRIES:
            raise error
        time.sleep(2**attempt)


def _run_copy(
    argv: list[str], store: ImageStore, layout: Path, image: str, observer: PullObserver | None
) -> tuple[int, str]:
    """Run one ``skopeo copy``, its progress told to ``observer``; its exit status and stderr.
    skopeo names each blob it copies on stdout ("Copying blob sha256:..."), which is how the
    layers are counted; the child is killed if this thread is interrupted."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    layers: list[str] = []

    def read_names() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("Copying blob "):
                layers.append(line.split()[2])

    reader = threading.Thread(target=read_names, daemon=True)
    reader.start()
    try:
        with progress.watching(store.blobs / "sha256", layout / "layout", layers, image, observer):
            assert process.stderr is not None
            stderr = process.stderr.read()
            returncode = process.wait()
            reader.join()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return returncode, stderr


def _verified_json(store: ImageStore, digest: str, what: str) -> dict[str, Any]:
    data = store.blob(digest).read_bytes()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"the {what} blob {digest} does not match its digest; nothing was cached")
    document: dict[str, Any] = json.loads(data)
    return document


def _read_layout(store: ImageStore, layout: Path, ref: Reference) -> dict[str, Any]:
    index = json.loads((layout / "layout" / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    manifest = _verified_json(store, manifest_digest, "manifest")
    config_digest = manifest["config"]["digest"]
    config = _verified_json(store, config_digest, "config")
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    layers = [
        {"digest": x["digest"], "size": x["size"], "media_type": x["mediaType"]}
        for x in manifest["layers"]
    ]
    if len(diff_ids) != len(layers):
        raise ImageError(
            f"image {ref.text!r} is malformed: {len(layers)} layers but {len(diff_ids)} diff_ids"
        )
    return {
        "manifest": manifest_digest,
        "references": [ref.text],
        "diff_ids": diff_ids,
        "layer_blobs": layers,
        "blobs": [manifest_digest, config_digest, *(x["digest"] for x in layers)],
        "config": config.get("config") or {},
        "platform": f"{config.get('os', '?')}/{config.get('architecture', '?')}",
        "pulled_at": time.time(),
    }
