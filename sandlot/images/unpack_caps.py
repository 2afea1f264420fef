"""How much a layer and an image may unpack to: the bound on a decompression bomb.

A layer's blob size is what the registry declared for it (the manifest's descriptor, which
skopeo checked the blob against), so it is known before a byte is unpacked. A layer may
unpack to at most :data:`DEFAULT_RATIO` times that (``SANDLOT_UNPACK_MAX_RATIO``), but never
less than :data:`LAYER_FLOOR`; an image's layers together to at most
``SANDLOT_UNPACK_MAX_IMAGE_GIB`` (default :data:`DEFAULT_IMAGE_GIB`). What counts is what the
unpack writes: each file's size as the tar declares it (a sparse file counts its apparent
size: holes are written as zeros), each copy of a file a hard link takes from a layer below,
xattr values, and :data:`ENTRY_COST` per entry (an inode and its name: a layer of millions of
entries is a bomb too). The count is taken before the bytes are written, so a refused
layer never allocates what it asked for.

Why these defaults (gzip -6, measured on this machine, tar size / gzip size): a Debian base
image layer 2.7x, a Python virtual environment 3.3x, locales 3.0x, Perl modules 4.2x, C
headers (the most text-heavy tree found) 5.6x, a git checkout 1.6x. 32x is over 5 times the
most compressible real tree; what exceeds it is runs of zeros or repeated bytes, the shape of a
bomb (2 GiB of sparse file is a 122-byte layer: 17,000,000x). The floor keeps tiny layers (a
config file, a few hundred compressed bytes) from a cap of a few KiB. 64 GiB per image is
twice the largest images in common use (CUDA + PyTorch images unpack to 20-30 GB). A layer of
legitimate zeros (a preallocated file; ``/var/log/lastlog`` of a user created with a large UID
and without ``useradd -l``) needs a larger ratio: the error names the setting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sandlot.images.errors import ImageError
from sandlot.settings import settings

DEFAULT_RATIO = 32
"""A layer unpacks to at most this many times its blob (``SANDLOT_UNPACK_MAX_RATIO``)."""

DEFAULT_IMAGE_GIB = 64.0
"""An image unpacks to at most this many GiB (``SANDLOT_UNPACK_MAX_IMAGE_GIB``)."""

LAYER_FLOOR = 64 << 20
"""Bytes any layer may unpack to, whatever its blob's size."""

ENTRY_COST = 128
"""Bytes counted per tar entry (an inode and its name). A real entry compresses to no less than
about 6 bytes (3000 empty files in a PAX tar: 512-byte headers at 82x), so entries alone stay
under the default ratio; a tar of millions of the same header (1000x) does not."""


class Budget:
    """Bytes still allowed; :meth:`charge` refuses past it. Thread-safe: one image's budget
    is charged by the threads unpacking its layers at the same time."""

    def __init__(self, limit: int | None, what: str) -> None:
        """``limit``: bytes (``None``: no cap); ``what``: the cap, said in the error (its
        size, where it comes from, the setting that raises it)."""
        self.limit = limit
        self.what = what
        self.used = 0
        self._lock = threading.Lock()

    def charge(self, size: int, layer: str) -> None:
        """Count ``size`` bytes unpacked from ``layer`` (its blob digest).

        Raises:
            ImageError: past the limit (not retryable; names the layer and the cap).
        """
        if self.limit is None:
            return
        with self._lock:
            self.used += size
            over = self.used > self.limit
        if over:
            raise ImageError(
                f"layer {layer} unpacks to more than {self.what}: refused as a decompression "
                f"bomb, nothing of it was kept",
                retryable=False,
            )

    def release(self, size: int) -> None:
        """Give back ``size`` bytes charged for what will not be kept after all (a layer
        read again from its start)."""
        with self._lock:
            self.used -= size


def layer_budget(declared_size: int) -> Budget:
    """The cap of one layer whose blob is ``declared_size`` bytes."""
    ratio = settings().unpack_max_ratio
    ratio = DEFAULT_RATIO if ratio is None else ratio
    if ratio <= 0:
        return Budget(None, "")
    limit = max(ratio * declared_size, LAYER_FLOOR)
    return Budget(
        limit,
        f"{_size(limit)} ({ratio}x the {_size(declared_size)} its registry declared, at least "
        f"{_size(LAYER_FLOOR)}; SANDLOT_UNPACK_MAX_RATIO sets the multiple, 0 for none)",
    )


def charger(layer: str, declared_size: int, image: Budget | None) -> Callable[[int], None]:
    """What counts the bytes layer ``layer`` (its blob's name) is about to write, against its
    own cap (:func:`layer_budget` of ``declared_size``) and ``image``'s (``None``: none); the
    callable raises :class:`ImageError` past either, before the bytes are written."""
    budget = layer_budget(declared_size)

    def charge(size: int) -> None:
        budget.charge(size, layer)
        if image is not None:
            image.charge(size, layer)

    return charge


def image_budget(already: int = 0) -> Budget:
    """The cap of one image, ``already`` bytes of which are unpacked (its layers other images
    unpacked before)."""
    gib = settings().unpack_max_image_gib
    gib = DEFAULT_IMAGE_GIB if gib is None else gib
    if gib <= 0:
        return Budget(None, "")
    limit = int(gib * (1 << 30))
    budget = Budget(
        limit,
        f"{_size(limit)} with the other layers of its image (SANDLOT_UNPACK_MAX_IMAGE_GIB, "
        f"0 for no cap)",
    )
    budget.used = already
    return budget


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value, unit = n / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"
