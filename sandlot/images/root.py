"""What a sandbox of a container image mounts: its layers and its config."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandlot.images.errors import ImageError
from sandlot.images.squash import OPAQUE_XATTR, load_index

_MAX_SYMLINKS = 40  # as the kernel's path walk (MAXSYMLINKS)


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config (``config`` object of ``image-spec/config.md``) a
    sandbox honours.

    Attributes:
        env: ``Env``, as a mapping (a later duplicate wins, as in docker).
        working_dir: ``WorkingDir`` (``""`` when unset).
        user: ``User`` (``""`` when unset, i.e. root).
        entrypoint: ``Entrypoint``.
        cmd: ``Cmd``.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @classmethod
    def from_oci(cls, document: Mapping[str, Any]) -> ImageConfig:
        """From a parsed image config blob (its ``config`` object may be absent)."""
        config = document.get("config") or {}
        env: dict[str, str] = {}
        for item in config.get("Env") or ():
            key, _, value = item.partition("=")
            env[key] = value
        return cls(
            env=env,
            working_dir=config.get("WorkingDir") or "",
            user=config.get("User") or "",
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
        )


@dataclass(frozen=True)
class ImageRoot:
    """An image ready to mount.

    Attributes:
        reference: the name it was opened by.
        manifest: ``sha256:<hex>`` of its manifest (as stored).
        layers: its layers, topmost first (overlayfs ``lowerdir`` order), each in overlayfs
            format: a squashfs image file (``.sqfs``, :mod:`sandlot.images.squash`), which the
            jail mounts and host-side lookups read through its index, or a host directory (an
            unpacked layer, :mod:`sandlot.images.unpack`; a snapshot's writable layer).
        config: what of its config a sandbox honours.
    """

    reference: str
    manifest: str
    layers: tuple[Path, ...]
    config: ImageConfig

    def lookup(self, path: str) -> Path | None:
        """Where ``path`` (absolute, in the image) is in the merged view, following symlinks
        as the kernel would inside the image; ``None`` when it does not exist. For a layer
        that is a directory, the host file; for an image file, ``<image>/<path>``, which is
        no host path (read it with :meth:`read_text`)."""
        parts = [p for p in path.split("/") if p]
        hops = 0
        done: list[str] = []
        visible: Sequence[Path] = self.layers
        while parts:
            name = parts.pop(0)
            if name == "..":
                done = done[:-1]
                visible = self._dir_layers(done)
                continue
            found = self._entry(visible, done, name)
            if found is None:
                return None
            layer, st = found
            if stat.S_ISLNK(st[0]):
                hops += 1
                if hops > _MAX_SYMLINKS:
                    return None
                target = st[1] or ""
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    done = []
                visible = self._dir_layers(done)
                continue
            done.append(name)
            if parts:
                if not stat.S_ISDIR(st[0]):
                    return None
                visible = self._dir_layers(done)
            else:
                return layer.joinpath(*done)
        return self.layers[-1].joinpath(*done) if self.layers else None

    def _entry(
        self, visible: Sequence[Path], parent: list[str], name: str
    ) -> tuple[Path, tuple[int, str | None, int]] | None:
        for layer in visible:
            st = _lstat(layer, [*parent, name])
            if st is None:
                continue
            if stat.S_ISCHR(st[0]) and st[2] == 0:
                return None  # a whiteout
            return layer, st
        return None

    def _dir_layers(self, parts: list[str]) -> list[Path]:
        """The layers that contribute to directory ``parts``, topmost first (overlayfs merges
        directories down to the first opaque one, and stops at anything not a directory)."""
        out: list[Path] = []
        for layer in self.layers:
            st = _lstat(layer, parts)
            if st is None:
                continue
            if not stat.S_ISDIR(st[0]):
                break
            out.append(layer)
            if _opaque(layer, parts):
                break
        return out

    def user_ids(self) -> tuple[int, int] | None:
        """(uid, gid) of the config's ``User`` (``name``, ``uid``, ``name:group``,
        ``uid:gid``, names looked up in the image's ``/etc/passwd`` and ``/etc/group`` as
        docker does); ``None`` for root or no ``User``.

        Raises:
            ImageError: a name the image's files do not have.
        """
        user, _, group = self.config.user.partition(":")
        if user in ("", "0", "root") and group in ("", "0", "root"):
            return None
        uid, gid = self._id(user or "0", "/etc/passwd", 2), None
        if group:
            gid = self._id(group, "/etc/group", 2)
        elif not user.isdigit():
            gid = self._field(user, "/etc/passwd", 3)
        return uid, gid if gid is not None else uid

    def _id(self, name: str, table: str, column: int) -> int:
        if name.isdigit():
            return int(name)
        found = self._field(name, table, column)
        if found is None:
            raise ImageError(
                f"image {self.reference!r} runs as User {self.config.user!r}, but its {table} "
                f"has no {name!r}"
            )
        return found

    def _field(self, name: str, table: str, column: int) -> int | None:
        text = self.read_text(table)
        if text is None:
            return None
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) > column and fields[0] == name and fields[column].isdigit():
                return int(fields[column])
        return None

    def read_text(self, path: str) -> str | None:
        """The text of file ``path`` (absolute, in the image); ``None`` when it does not
        exist or, in a layer image, is not one of those its index keeps
        (:data:`sandlot.images.squash.SMALL_FILES`)."""
        found = self.lookup(path)
        if found is None:
            return None
        for layer in self.layers:
            if found.is_relative_to(layer) and _is_image(layer):
                return load_index(layer).files.get(found.relative_to(layer).as_posix())
        try:
            return found.read_text(errors="replace")
        except OSError:
            return None

    def mode(self, path: str) -> int | None:
        """The ``st_mode`` of ``path`` (absolute, in the image, links followed) in either kind
        of layer; ``None`` when it does not exist."""
        found = self.lookup(path)
        if found is None:
            return None
        for layer in self.layers:
            if found.is_relative_to(layer):
                st = _lstat(layer, list(found.relative_to(layer).parts))
                return None if st is None else st[0]
        return None

    def executable(self, path: str) -> bool:
        """Whether ``path`` (absolute, in the image) is an executable file."""
        mode = self.mode(path)
        return mode is not None and stat.S_ISREG(mode) and bool(mode & 0o111)


def _is_image(layer: Path) -> bool:
    return layer.suffix == ".sqfs"


def _lstat(layer: Path, parts: Sequence[str]) -> tuple[int, str | None, int] | None:
    """(mode, link target, rdev) of ``parts`` in ``layer`` without following a final link;
    ``None`` when absent."""
    if _is_image(layer):
        found = load_index(layer).entries.get("/".join(parts))
        return None if found is None else (found[0], found[1], 0)
    path = layer.joinpath(*parts)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return st.st_mode, link, st.st_rdev


def _opaque(layer: Path, parts: Sequence[str]) -> bool:
    if _is_image(layer):
        return "/".join(parts) in load_index(layer).opaque_set
    try:
        return os.getxattr(layer.joinpath(*parts), OPAQUE_XATTR) == b"y"
    except OSError:
        return False
