"""One OCI layer blob into one read-only squashfs image file, and its index.

The mounted design (``docs/images.md``): a layer is never unpacked on the host. Its blob is
decompressed and hashed (:mod:`sandlot.images.layer_stream`; the digest must be the config's
``diff_id``), its tar stream is rewritten into what overlayfs reads in a user namespace, and
piped into ``tar2sqfs`` (Debian ``squashfs-tools-ng``), which writes one image file; the
jail mounts it with ``squashfuse`` under its overlayfs stack
(:mod:`sandlot.sandboxes.local.jail`, :mod:`sandlot.sandboxes.local.zygote`).

The rewrite (OCI ``image-spec/layer.md`` -> ``Documentation/filesystems/overlayfs.rst``)
parses every header with :mod:`tarfile` (:mod:`sandlot.images.tar_members`); an entry that
needs no change is passed on as the header bytes it was read from, its data copied in 1 MiB
slices (nearly all entries of a real layer: the conversion of a 13.5k-entry layer went from
2.9-3.1 s to 2.0-2.3 s, the image byte-identical); the others are written anew:

* ``.wh.NAME`` becomes a character device 0/0 named ``NAME`` (a whiteout);
* ``.wh..wh..opq`` becomes the PAX xattr ``user.overlay.opaque=y`` on its directory, whose
  entry is written again (``tar2sqfs`` keeps the last attributes of a path; why measured:
  ``tests/images/test_mounted.py``);
* device nodes are left out (as rootless podman does), so no 0/0 device of the image can pose
  as a whiteout; FIFOs, symlinks, hard links within the layer are kept;
* ownership becomes 0:0 (the pulling user, root in the jail's user namespace, as unpacked);
* only ``user.*`` xattrs are kept, never ``*.overlay.*`` ones (they would forge overlay
  metadata); names with ``..`` are refused, a leading ``/`` or ``./`` dropped;
* a hard link to a file of a layer below (which one layer's image cannot express) becomes a
  copy of it, read from the image of the layer that has it (``rdsquashfs``), as docker and
  containers/storage resolve such links; the layers below are asked for only then;
* what a layer holds is capped as when it is unpacked (:mod:`sandlot.images.unpack_caps`),
  each entry charged before its data is read: a sparse file at its apparent size (written
  with its holes as zeros, as a plain file), so a bomb is refused without streaming them.

``lz4`` compresses the blocks: measured on a 128 MB (345 MB, 13,532 files) layer on 2 cores,
``tar2sqfs`` takes 0.8 s with lz4, 1.3 s with zstd level 1, 56 s with gzip and 87 s with the
default zstd level (``docs/images.md`` has the whole conversion's figures).

The index (``<hex>.json`` beside the image) is what host-side lookups read
(:class:`sandlot.images.root.ImageRoot`): every path's mode and link target, the opaque
directories, and the text of :data:`SMALL_FILES`.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sandlot.images.errors import ImageError
from sandlot.images.layer_stream import LayerStream
from sandlot.images.tar_members import BLOCK, CHUNK, TarMembers, end_of_archive, padding
from sandlot.images.tools import find_tool
from sandlot.images.unpack_caps import ENTRY_COST, Budget, charger
from sandlot.settings import settings

OPAQUE_XATTR = "user.overlay.opaque"
"""Marks an opaque directory for overlayfs mounted with ``userxattr``."""

SMALL_FILES = frozenset({"etc/passwd", "etc/group"})
"""Files whose text the index keeps (host-side lookups of ``User``)."""

SMALL_FILE_MAX = 1 << 20
"""Bytes of a :data:`SMALL_FILES` file kept at most."""

COMPRESSOR = "lz4"
"""``tar2sqfs --compressor`` (see the module docstring for the measurement)."""

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_XATTR = "SCHILY.xattr."


def mounting() -> bool:
    """Whether this machine keeps layers as mounted image files (else they are unpacked):
    ``SANDLOT_IMAGE_LAYERS`` says ``mount`` or ``unpack``, or ``auto`` (the default) decides
    once per process: ``/dev/fuse`` opens for reading and writing, and ``tar2sqfs`` and
    ``squashfuse`` are on ``PATH``. A kernel that then refuses a FUSE mount in a user namespace
    fails the sandbox's start, naming the mount: set ``SANDLOT_IMAGE_LAYERS=unpack`` there."""
    mode = settings().image_layers
    return mode == "mount" if mode != "auto" else _fuse_usable()


@functools.lru_cache(maxsize=1)
def _fuse_usable() -> bool:
    if shutil.which("tar2sqfs") is None or shutil.which("squashfuse") is None:
        return False
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError:
        return False
    return True


@dataclass
class Index:
    """What host-side lookups need of one layer (stored as JSON beside its image).

    Attributes:
        entries: path (relative, no leading ``/``) -> ``[mode, link target or None]``; a
            whiteout has mode ``S_IFCHR`` (0/0).
        opaque: opaque directories.
        files: path -> text of the :data:`SMALL_FILES` the layer holds.
    """

    entries: dict[str, list[Any]] = field(default_factory=dict)
    opaque: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @functools.cached_property
    def opaque_set(self) -> frozenset[str]:
        """:attr:`opaque` as a set."""
        return frozenset(self.opaque)


@functools.lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int) -> Index:
    document = json.loads(path.read_text())
    return Index(document["entries"], document["opaque"], document["files"])


def load_index(image: Path) -> Index:
    """The index of the layer image ``image`` (``<hex>.idx`` beside ``<hex>.sqfs``), read
    once per process while it is unchanged.

    Raises:
        ImageError: it is missing or unreadable (the layer is then converted again by the
            next pull; prune the image to force it).
    """
    path = image.with_suffix(".idx")
    try:
        return _load(path, path.stat().st_mtime_ns)
    except (OSError, ValueError, KeyError) as exc:
        raise ImageError(f"the index of layer {image.name} is unreadable: {exc}") from exc


@dataclass
class ConvertStats:
    """What one layer held: tar ``entries`` written, file ``bytes``, ``devices_skipped``,
    ``xattrs_skipped``, and the image's ``size`` in bytes."""

    entries: int = 0
    bytes: int = 0
    devices_skipped: int = 0
    xattrs_skipped: int = 0
    size: int = 0


class _Duplicate(Exception):
    """A path appears twice in the layer (the later entry wins, as when extracting):
    ``tar2sqfs`` refuses that, so the conversion is redone knowing the last of each."""


def convert_layer(
    blob: Path,
    diff_id: str,
    dest: Path,
    below: Callable[[], Iterable[Path]] = tuple,
    *,
    declared_size: int | None = None,
    image_budget: Budget | None = None,
) -> tuple[ConvertStats, Index]:
    """Write layer ``blob`` as the squashfs image ``dest`` (which must not exist; the caller
    renames it into place); its stats and index. A layer in which a path appears twice
    (rare: a file replaced within one layer) is read twice, first to find the entries that
    win. ``below``: the images of the layers under this one, topmost first, iterated only
    for a hard link whose target is not in this layer (an iterator that waits for each
    image waits for no more layers than the link needs).

    What the layer holds is capped as when it is unpacked (:mod:`sandlot.images.unpack_caps`):
    each entry's declared size (a sparse file's apparent size), copies from below and xattr
    values are charged to the layer's cap (a multiple of ``declared_size``, the blob's size
    as its manifest declares it; default: its size on disk) and to ``image_budget``, before
    the entry's data is read: a bomb is refused without streaming its zeros.

    Raises:
        ImageError: the blob is not a valid (gzip, zstd or plain) tar, its digest is not
            ``diff_id``, an entry is refused, a cap is passed, or ``tar2sqfs`` failed (not
            retryable). ``dest`` is removed.
        BackendUnavailableError: ``tar2sqfs`` is missing.
        OSError: the disk refused a write.
    """
    size = blob.stat().st_size if declared_size is None else declared_size
    first = charger(blob.name, size, image_budget)
    charged = 0

    def charge_first(n: int) -> None:
        nonlocal charged
        charged += n
        first(n)

    try:
        return _convert(blob, diff_id, dest, None, below, charge_first)
    except _Duplicate:
        dest.unlink(missing_ok=True)
        if image_budget is not None:
            image_budget.release(charged)  # charged again by the second pass
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    counts: dict[str, int] = {}
    charge = charger(blob.name, size, None)  # the layer's cap alone: the image's is charged once
    with LayerStream(blob) as stream:
        try:
            with tarfile.open(fileobj=stream, mode="r|", errorlevel=2) as tar:  # type: ignore[call-overload]
                for member in tar:
                    charge(ENTRY_COST + (member.size if member.isreg() else 0))  # before the data
                    name = _target_name(_clean(member.name, blob.name))
                    counts[name] = counts.get(name, 0) + 1
        except (tarfile.TarError, EOFError, ValueError) as exc:
            stream.check()  # a corrupt blob explains a truncated tar: say that
            raise ImageError(f"layer {blob.name} is not a valid tar: {exc}") from exc
    try:
        charge = charger(blob.name, size, image_budget)
        return _convert(blob, diff_id, dest, counts, below, charge)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def _target_name(name: str) -> str:
    parent, _, base = name.rpartition("/")
    if base.startswith(_WHITEOUT) and base != _OPAQUE:
        return f"{parent}/{base[len(_WHITEOUT) :]}".lstrip("/")
    return name


def _convert(
    blob: Path,
    diff_id: str,
    dest: Path,
    counts: dict[str, int] | None,
    below: Callable[[], Iterable[Path]],
    charge: Callable[[int], None],
) -> tuple[ConvertStats, Index]:
    argv = [find_tool("tar2sqfs"), "--quiet", "--no-skip", "--compressor", COMPRESSOR]
    argv += ["--num-jobs", str(len(os.sched_getaffinity(0))), str(dest)]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        bufsize=CHUNK,  # headers gathered into large writes
    )
    assert process.stdin is not None and process.stderr is not None
    with suppress(OSError):  # 1 MiB, the most an unprivileged user gets: fewer switches
        fcntl.fcntl(process.stdin.fileno(), fcntl.F_SETPIPE_SZ, CHUNK)
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.append(process.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    stats, index = ConvertStats(), Index()
    try:
        with LayerStream(blob) as stream:
            try:
                _rewrite(stream, process.stdin, stats, index, blob.name, counts, below, charge)
            except (BrokenPipeError, tarfile.TarError, EOFError, ValueError):
                stream.check()  # a corrupt blob explains a truncated tar: say that
                raise
            found = stream.digest()  # the zero blocks after the tar's end count too
        process.stdin.close()
    except (BrokenPipeError, tarfile.TarError, EOFError, ValueError) as exc:
        process.kill()
        process.wait()
        drain.join()
        detail = b"".join(stderr).decode(errors="replace").strip()[-500:]
        raise ImageError(f"layer {blob.name} cannot be converted: {exc} {detail}".strip()) from exc
    except BaseException:
        process.kill()
        process.wait()
        drain.join()
        raise
    returncode = process.wait()
    drain.join()
    if returncode != 0:
        detail = b"".join(stderr).decode(errors="replace").strip()[-500:]
        raise ImageError(f"tar2sqfs failed on layer {blob.name}: {detail}")
    if found != diff_id:
        raise ImageError(
            f"layer {blob.name} does not match its diff_id {diff_id} (got {found}); nothing "
            f"of it is cached"
        )
    stats.size = dest.stat().st_size
    return stats, index


def _clean(name: str, blob: str) -> str:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"layer {blob} has an entry outside its root: {name!r}")
    return "/".join(parts)


def _rewrite(
    source: LayerStream,
    sink: IO[bytes],
    stats: ConvertStats,
    index: Index,
    blob: str,
    counts: dict[str, int] | None,
    below: Callable[[], Iterable[Path]],
    charge: Callable[[int], None],
) -> None:
    """Copy the tar ``source`` to ``sink`` in overlayfs form (module docstring), filling
    ``stats`` and ``index``. Directories are written last, once their opaque marks are known
    (``tar2sqfs`` creates a parent met first with defaults, and the directory's own entry
    then sets its attributes; it refuses a path written twice). ``counts``: how often each
    path appears (then only the last is written), or ``None``, when a path seen twice
    raises :class:`_Duplicate`. ``charge`` counts what each entry holds before its data is
    read (raises past a cap)."""
    dirs: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}  # info, header kept as read
    opaque: list[str] = []
    seen: dict[str, int] = {}
    members = TarMembers(source)
    write = sink.write
    for member, header in members:
        charge(ENTRY_COST)
        name = _clean(member.name, blob)
        target = _target_name(name)
        seen[target] = seen.get(target, 0) + 1
        if counts is None and seen[target] > 1 and not member.isdir():
            raise _Duplicate(target)
        if counts is not None and seen[target] < counts.get(target, 0):
            continue  # a later entry of the same path wins
        parent, _, base = name.rpartition("/")
        if base == _OPAQUE:
            opaque.append(parent)
            continue
        if member.ischr() or member.isblk():
            stats.devices_skipped += 1
            continue
        if base.startswith(_WHITEOUT):
            info = tarfile.TarInfo(target)
            info.type, info.mode, info.mtime = tarfile.CHRTYPE, 0, member.mtime
            index.entries[target] = [stat.S_IFCHR, None]
            write(_header(info))
            stats.entries += 1
            continue
        kept = _kept_xattrs(member, stats)
        charge(sum(len(v.encode("utf-8", "surrogateescape")) for v in kept.values()))
        mode = stat.S_IMODE(member.mode)
        same = _unchanged(member, header, name, kept, members)
        if member.islnk():
            linkname = _clean(member.linkname, blob)
            linked = index.entries.get(linkname)
            if linked is None:  # in a layer below: a copy of it
                below_mode, content = _from_below(below, linkname, blob, name)
                charge(len(content))
                info = _fresh(member, name, kept)
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", len(content)
                info.mode = stat.S_IMODE(below_mode)
                index.entries[name] = [below_mode, None]
                write(_header(info) + content + padding(len(content)))
                stats.entries += 1
                stats.bytes += len(content)
                continue
            if not stat.S_ISREG(linked[0]):
                raise ImageError(
                    f"layer {blob} hard-links {name!r} to {member.linkname!r}, which is "
                    f"not a regular file"
                )
            index.entries[name] = list(linked)
            same = same and linkname == member.linkname
            member.linkname = linkname
        elif member.issym():
            index.entries[name] = [stat.S_IFLNK | 0o777, member.linkname]
        elif member.isdir():
            index.entries[name] = [stat.S_IFDIR | mode, None]
            dirs[name] = (_fresh(member, name, kept), header if same else None)
            continue  # written last
        elif member.isfifo():
            index.entries[name] = [stat.S_IFIFO | mode, None]
        elif member.isreg():  # a sparse file too: written with its holes as zeros
            charge(member.size)  # its apparent size, before a byte of it is read
            stats.bytes += member.size
            index.entries[name] = [stat.S_IFREG | mode, None]
            if name in SMALL_FILES and member.size <= SMALL_FILE_MAX:
                text = b"".join(members.content(member))
                index.files[name] = text.decode(errors="replace")
                write(_header(_fresh(member, name, kept)) + text + padding(len(text)))
                stats.entries += 1
                continue
        else:
            continue  # a type layers cannot hold
        stats.entries += 1
        if same:
            write(header)
            members.copy_data(write)
        else:
            write(_header(_fresh(member, name, kept)))
            if member.isreg():
                for piece in members.content(member):
                    write(piece)
                write(padding(member.size))
    for name in opaque:
        if not name:
            continue  # the layer's root itself cannot be opaque in a lower layer
        info, _ = dirs.get(name) or (tarfile.TarInfo(name), None)
        if name not in dirs:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            index.entries.setdefault(name, [stat.S_IFDIR | 0o755, None])
        info.pax_headers = {**info.pax_headers, _XATTR + OPAQUE_XATTR: "y"}
        dirs[name] = (info, None)
        index.opaque.append(name)
    for name, (info, kept_header) in dirs.items():
        if name:  # "." or "/": the image's root keeps tar2sqfs's defaults
            write(kept_header or _header(info))
            stats.entries += 1
    write(end_of_archive())


_PLAIN_PAX = frozenset(
    {"path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"}
)
"""PAX records an entry written back unchanged may carry (besides the xattrs kept)."""

_PLAIN_TYPES = frozenset(
    {tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE}
)


def _unchanged(
    member: tarfile.TarInfo, header: bytes, name: str, kept: dict[str, str], members: TarMembers
) -> bool:
    """Whether ``member``'s ``header``, as read, says what the rewrite would (most entries):
    owned by 0:0, named as cleaned (but for a leading ``./``), a plain type (not sparse), in
    ustar form or after one PAX header (no GNU long names) whose records are plain or kept
    xattrs, and no global PAX records in force (they would not reach ``tar2sqfs``); sizes in
    plain octal, none but a regular file's non-zero, none from a PAX record (a reader that
    skipped other bytes than :mod:`tarfile` did would take file data for headers); the
    ustar name prefix only where the POSIX magic says it is one (old GNU headers keep times
    there, which :mod:`tarfile` would read as a name). Such a header means the same to
    ``tar2sqfs`` as to :mod:`tarfile`: same name, type and size, so the data that follows
    is the same bytes to both, and no record that forges overlay metadata or a device."""
    return (
        member.uid == 0
        and member.gid == 0
        and member.name.removeprefix("./") == name  # tar2sqfs drops "./" as we do
        and member.type in _PLAIN_TYPES
        and member.sparse is None
        and (member.isreg() or member.size == 0)
        and "size" not in member.pax_headers
        and _octal(header[-BLOCK + 124 : -BLOCK + 136]) == member.size
        and (len(header) == BLOCK or _one_pax_header(header))
        and (
            header[-BLOCK + 257 : -BLOCK + 263] == b"ustar\0"
            or not header[-BLOCK + 345 :].strip(b"\0")
        )
        and not members.pax_headers
        and all(key in _PLAIN_PAX or key in kept for key in member.pax_headers)
    )


_OCTAL = re.compile(rb"([0-7]{1,11})[\0 ]*")


def _octal(field: bytes) -> int | None:
    """A size field's value when it is plain octal (digits, then NULs or spaces), else None:
    where readers could disagree (base-256, spaces first, junk), the entry is written anew."""
    found = _OCTAL.fullmatch(field)
    return int(found.group(1), 8) if found else None


def _one_pax_header(header: bytes) -> bool:
    """Whether ``header`` is one PAX header, its records and the entry's ustar header, sized
    in plain octal (so that any reader finds the entry where :mod:`tarfile` did)."""
    size = _octal(header[124:136])
    return (
        header[156:157] == tarfile.XHDTYPE
        and size is not None
        and len(header) == BLOCK + -(-size // BLOCK) * BLOCK + BLOCK
    )


def _fresh(member: tarfile.TarInfo, name: str, kept: dict[str, str]) -> tarfile.TarInfo:
    """``member`` as the rewrite writes it: named ``name``, owned by 0:0, with the xattrs
    ``kept`` and nothing else of its PAX records (a sparse file as a plain one)."""
    info = tarfile.TarInfo(name)
    info.mtime, info.mode, info.linkname = member.mtime, member.mode, member.linkname
    info.type = tarfile.REGTYPE if member.isreg() else member.type
    info.size = member.size if member.isreg() else 0
    info.pax_headers = kept
    return info


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _from_below(
    below: Callable[[], Iterable[Path]], target: str, blob: str, name: str
) -> tuple[int, bytes]:
    """(mode, content) of regular file ``target`` in the topmost layer image below that has
    it (``rdsquashfs -c``).

    Raises:
        ImageError: no layer below has it as a regular file.
    """
    for image in below():
        found = load_index(image).entries.get(target)
        if found is None:
            continue
        if stat.S_ISREG(found[0]):
            argv = [find_tool("rdsquashfs"), "--cat", target, str(image)]
            done = subprocess.run(argv, capture_output=True, check=False)
            if done.returncode == 0:
                return found[0], done.stdout
        break  # a whiteout, a directory, ...: what the link would name is no file
    raise ImageError(
        f"layer {blob} hard-links {name!r} to {target!r}, which is not a regular file of "
        f"this layer or one below"
    )


def _kept_xattrs(member: tarfile.TarInfo, stats: ConvertStats) -> dict[str, str]:
    kept: dict[str, str] = {}
    for key, value in member.pax_headers.items():
        if not key.startswith(_XATTR):
            continue
        name = key[len(_XATTR) :]
        if name.startswith("user.") and ".overlay." not in name:
            kept[key] = value
        else:
            stats.xattrs_skipped += 1
    return kept
