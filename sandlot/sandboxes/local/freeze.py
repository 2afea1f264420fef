"""A local sandbox's snapshot: its private writable directories, copied once.

A local sandbox writes only into its host directory (:class:`HostDirs`): ``work``, ``tmp``,
``home``, ``overlay`` (pip on top of a cached environment) and, for a container image,
``upper``, the writable layer of its overlayfs root (the workdir lives there). A snapshot is a
sibling directory ``sandlot-snap-<hex>`` under the sandboxes' root holding a copy of each
(``cp -a --reflink=auto``: a clone where the filesystem can, btrfs or XFS; overlayfs
whiteouts and ``user.overlay.*`` attributes kept) and a ``labels.json``, so that ``sandlot gc
--backend local`` lists and removes it as it does a sandbox's directory.

A fork in a jail stacks the snapshot's files read-only below its own writable ``upper``
(nothing copied: overlayfs copies a file up when the fork writes it): for a container image
the snapshot's ``upper`` above the image's layers, for ``image="host"`` or a root filesystem
directory the snapshot's ``work`` as the workdir's lower layer. Its ``tmp``, ``home`` and
``overlay`` are copied in (small: what the set-up wrote outside the workdir). Without a jail
(``isolation="none"``) there is no overlay: the workdir is copied too, a cost that grows with
its number of files. Such a layered fork is not snapshotted again (its files are two layers).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from sandlot.errors import SandboxError
from sandlot.sandboxes.local.hostdirs import HostDirs, remove_tree

SNAPSHOT_PREFIX = "sandlot-snap-"
UPPER = "upper"
"""The writable layer of a sandbox's overlay (a container image's root, or a fork's workdir),
in a sandbox's or a snapshot's directory."""
OVERLAY_WORK = "overlay-work"
"""overlayfs's own ``workdir`` beside ``upper``."""
LOWER = "lower"
"""In a fork's directory: symlink to the snapshot's ``work`` (the same name as ``zygote.LOWER``;
that file is not imported here)."""
WORK = "work"
"""A sandbox's (or a snapshot's) workdir, when it is not a container image's."""
_COPIED = (WORK, "tmp", "home", "overlay")


def _copy(sources: list[Path], dest: Path) -> None:
    """Copy the directories ``sources`` into the directory ``dest`` (one ``cp``: each process
    spawned costs a fork's start more than a small tree does); one of the same name already
    there is merged into.

    Raises:
        SandboxError: ``cp`` failed (its message).
    """
    if not sources:
        return
    argv = ["cp", "-a", "--reflink=auto", "--preserve=xattr", "-t", str(dest)]
    done = subprocess.run([*argv, *map(str, sources)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(
            f"cannot copy {dest.name} from {sources[0].parent}: {done.stderr.strip()}"
        )


def freeze(dirs: HostDirs, dest: Path, labels: Mapping[str, str]) -> None:
    """Copy the writable directories of the sandbox in ``dirs`` to the new snapshot ``dest``.

    Raises:
        SandboxError: a copy failed (``dest`` is removed again).
        OSError: ``dest`` exists or cannot be created.
    """
    dest.mkdir(mode=0o700)
    try:
        _copy([dirs.root / name for name in (*_COPIED, UPPER) if (dirs.root / name).is_dir()], dest)
        HostDirs(dest).write_labels(labels)
    except BaseException:
        remove_tree(dest)
        raise


def thaw(snapshot: Path, dirs: HostDirs, *, stack_work: bool) -> None:
    """Copy the snapshot's directories into the new sandbox's ``dirs``, but ``upper`` (a
    container image's fork stacks it as a layer, :class:`JailConfig` ``layers``) and, with
    ``stack_work``, ``work``: the fork's workdir is then an overlayfs of the snapshot's
    ``work`` under its own ``upper``, mounted by the jail (``JailConfig.work_layers``) or by
    a zygote's child, which finds the snapshot by the symlink :data:`LOWER`.

    Raises:
        SandboxError: a copy failed, or the snapshot is gone.
        OSError: the overlay's directories cannot be made.
    """
    if not snapshot.is_dir():
        raise SandboxError(f"snapshot {snapshot} is gone (removed by `sandlot gc`?)")
    names = [n for n in _COPIED if not (stack_work and n == WORK) and (snapshot / n).is_dir()]
    _copy([snapshot / name for name in names], dirs.root)
    # The fork makes its own `python` link (LocalSandbox._offer_python) when it needs one.
    (dirs.shim_bin / "python").unlink(missing_ok=True)
    if stack_work:
        # Relative: the zygote sees the sandboxes' directory elsewhere.
        (dirs.root / LOWER).symlink_to(os.path.relpath(snapshot / WORK, dirs.root))
        dirs.ensure(dirs.root / UPPER, 0o755)
        dirs.ensure(dirs.root / OVERLAY_WORK)
