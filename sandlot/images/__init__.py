"""Container images for the ``local`` backend: pulled rootless, layers stored once.

``image=`` on ``local`` accepts what docker accepts plus the local sources skopeo reads
(:mod:`sandlot.images.reference`). :func:`open_image` turns such a name into an
:class:`ImageRoot`: the image's layers in the content-addressed cache
(:mod:`sandlot.images.store`), each one squashfs file the jail mounts with FUSE (or, where FUSE
is unusable, unpacked into a directory), and its config; the jail stacks them as kernel
overlayfs lower layers under a private writable layer. See ``docs/images.md``.

Pieces, bottom up: ``reference`` (what a name means), ``tools`` (skopeo, found or a one-line
install hint), ``squash`` (one OCI layer blob into one squashfs file in overlayfs form, and its
index; whether layers are mounted here), ``unpack`` (the fallback: one OCI layer tar into an
overlayfs-format directory), ``root`` (what a sandbox mounts: layers, config, lookups through
the stack), ``store`` (the cache: paths, locks, records, list, prune), ``unpacking`` (an image's
missing layers converted or unpacked, in parallel, each once: at first use), ``remote`` (one
manifest request: does the registry hold a name; what a failed skopeo call means), ``progress``
(what a running fetch has transferred, on stderr), ``pulling`` (the fetch: skopeo into the
shared blob store; and ``open_image``), ``prefetch`` (pulls on every node of a Ray cluster). The
jail's side is ``sandlot.sandboxes.local.jail`` (``bwrap --overlay`` from bubblewrap 0.9, else
``overlay_argv``).
"""

from __future__ import annotations

from sandlot.images.errors import ImageError
from sandlot.images.pulling import open_image, pull
from sandlot.images.reference import is_image_reference
from sandlot.images.root import ImageConfig, ImageRoot

__all__ = ["ImageConfig", "ImageError", "ImageRoot", "is_image_reference", "open_image", "pull"]
