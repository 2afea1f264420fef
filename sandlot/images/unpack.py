"""One OCI layer tar into a directory in kernel overlayfs format.

The OCI image spec (``image-spec/layer.md``) describes a layer as a tar of changes; overlayfs
(``Documentation/filesystems/overlayfs.rst``) describes an upper directory. This module turns
one into the other, layer by layer, so a layer shared by many images is unpacked once and any
stack of them can be mounted as ``lowerdir``s:

* ``.wh.NAME`` (a whiteout) becomes a character device 0/0 named ``NAME`` (which the kernel lets
  any user create, since Linux 5.8); ``.wh..wh..opq`` (an opaque directory) becomes the xattr
  ``user.overlay.opaque=y`` on its directory, which overlayfs mounted with ``userxattr`` in a
  user namespace reads (Linux 5.11);
* a hard link whose target is not in this layer is copied from the target in the layers
  below, as docker and containers/storage resolve it (the layers below are asked for only
  then, topmost first: a layer unpacked in parallel with those below it waits, at such a link,
  only for the layers down to the one that has its target); a hard link may point only at a
  regular file;
* symlinks are created as they are and never followed: every entry is created relative to a
  directory descriptor walked to without following a link (:mod:`sandlot.images.layer_writer`),
  so an entry below a symlink, a ``..`` component or an absolute name is refused or resolved
  inside the layer, and modes and times go through descriptors, never a path;
* device nodes are skipped, as rootless podman skips them (counted in the result); FIFOs are
  kept;
* modes (with setuid/setgid/sticky bits) and modification times are kept; ownership is not:
  every file belongs to the user who pulled, and appears as root in the jail's user namespace;
* xattrs from PAX ``SCHILY.xattr.*`` records are kept when they are ``user.*`` (on files and
  directories); others (``security.capability``, ``trusted.*``, ``system.*``) are skipped and
  counted, also when root pulls; ``*.overlay.*`` ones are refused, as they would forge overlay
  metadata;
* what a layer writes is capped (:mod:`sandlot.images.unpack_caps`): a multiple of its
  compressed size, and a total per image.

The uncompressed stream is hashed while it is read: a layer whose digest is not its config's
``diff_id`` is an error. A layer that fails leaves nothing of itself.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sandlot.images.errors import ImageError
from sandlot.images.layer_stream import LayerStream
from sandlot.images.layer_writer import OPAQUE_XATTR, LayerWriter
from sandlot.images.store import remove_tree
from sandlot.images.unpack_caps import Budget, charger

__all__ = ["OPAQUE_XATTR", "UnpackStats", "unpack_layer"]


@dataclass
class UnpackStats:
    """What one layer held.

    Attributes:
        entries: tar entries processed.
        bytes: bytes of regular file content written.
        devices_skipped: device nodes left out (rootless).
        xattrs_skipped: xattrs not kept (not ``user.*``, or refused by the filesystem).
    """

    entries: int = 0
    bytes: int = 0
    devices_skipped: int = 0
    xattrs_skipped: int = 0


def unpack_layer(
    blob: Path,
    diff_id: str,
    dest: Path,
    below: Callable[[], Iterable[Path]],
    *,
    declared_size: int | None = None,
    image_budget: Budget | None = None,
) -> UnpackStats:
    """Unpack layer ``blob`` into the new directory ``dest``.

    Args:
        blob: the layer as stored (gzip, zstd or plain tar; told apart by magic bytes).
        diff_id: ``sha256:<hex>`` of the uncompressed tar, from the image config.
        dest: a directory that does not exist yet (the caller renames it into place).
        below: returns the unpacked layers under this one, topmost first; called only when
            a hard link's target is not in this layer, and iterated until the target is found
            (an iterator that waits for each layer to be unpacked before yielding it waits
            for no more layers than the link needs).
        declared_size: bytes of the blob as its manifest declares (default: the blob's size
            on disk, which skopeo checked against it); the layer may unpack to a multiple of
            it (:func:`sandlot.images.unpack_caps.layer_budget`).
        image_budget: the cap of the whole image, shared by its layers (default: none).

    Raises:
        ImageError: the tar is corrupt, its digest is not ``diff_id``, an entry would write
            outside ``dest`` or is otherwise refused, or it unpacks to more than a cap allows
            (not retryable). ``dest`` is removed.
        OSError: the disk refused a write (``dest`` is removed).
    """
    size = blob.stat().st_size if declared_size is None else declared_size
    charge = charger(blob.name, size, image_budget)
    dest.mkdir(mode=0o700)
    try:
        return _unpack(blob, diff_id, dest, below, charge)
    except BaseException:
        remove_tree(dest)
        raise


def _unpack(
    blob: Path,
    diff_id: str,
    dest: Path,
    below: Callable[[], Iterable[Path]],
    charge: Callable[[int], None],
) -> UnpackStats:
    stats = UnpackStats()
    writer = LayerWriter(dest, below, stats, blob.name, charge)
    try:
        with LayerStream(blob) as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|", errorlevel=2) as tar:  # type: ignore[call-overload]
                    for member in tar:
                        writer.add(tar, member)
                found = stream.digest()
            except (tarfile.TarError, EOFError, ValueError) as exc:
                stream.check()  # a corrupt blob explains a truncated tar: say that
                raise ImageError(f"layer {blob.name} is not a valid tar: {exc}") from exc
        writer.finish()
    finally:
        writer.close()
    if found != diff_id:
        raise ImageError(
            f"layer {blob.name} unpacks to {found}, not the diff_id {diff_id} its image config "
            f"names: the blob is corrupt or the image is malformed; nothing was cached"
        )
    return stats
