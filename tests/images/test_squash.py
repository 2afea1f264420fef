"""One layer tar into one squashfs image (``sandlot/images/squash.py``), read back with
Debian's ``sqfs2tar`` and ``rdsquashfs``: entries written back as read and entries rewritten
(GNU long names, ``./`` prefixes, owners, xattrs, sparse files) hold the same (no registry,
no FUSE)."""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from requirements import needs

from sandlot.images import ImageError
from sandlot.images.squash import Index, convert_layer


def _squashfs_missing() -> str | None:
    tools = ("tar2sqfs", "sqfs2tar", "rdsquashfs")
    if all(shutil.which(t) for t in tools):
        return None
    return "squashfs-tools-ng (tar2sqfs, sqfs2tar, rdsquashfs) is not installed"


pytestmark = needs(_squashfs_missing)


def _member(name: str, kind: bytes, data: bytes = b"", fmt: int = tarfile.PAX_FORMAT,
            **attrs: object) -> bytes:  # fmt: skip
    """One tar member in format ``fmt`` (members of several formats make one tar)."""
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.size = kind, 1_000_000, len(data)
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    pad = bytes(-len(data) % tarfile.BLOCKSIZE)
    return info.tobuf(fmt, "utf-8", "surrogateescape") + data + pad


def _convert(tmp: Path, tar: bytes) -> tuple[Path, Index]:
    blob = tmp / "layer.blob"
    blob.write_bytes(gzip.compress(tar))
    image = tmp / "layer.sqfs"
    _, index = convert_layer(blob, "sha256:" + hashlib.sha256(tar).hexdigest(), image)
    return image, index


def _read_back(image: Path) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    """What the image holds, as ``sqfs2tar`` writes it: name -> (member, content)."""
    raw = subprocess.run(["sqfs2tar", str(image)], capture_output=True, check=True).stdout
    found = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar:
            data = tar.extractfile(member).read() if member.isreg() else b""  # type: ignore[union-attr]
            found[member.name.rstrip("/")] = (member, data)
    return found


def test_entries_as_read_and_rewritten_hold_what_the_layer_says(tmp_path: Path) -> None:
    long_name = "usr/" + "a" * 150 + "/f"
    xattrs = {"SCHILY.xattr.security.capability": "x", "SCHILY.xattr.user.kept": "y"}
    tar = b"".join([
        _member("./etc/", tarfile.DIRTYPE, fmt=tarfile.GNU_FORMAT),  # GNU tar's "./" names
        _member("./etc/passwd", tarfile.REGTYPE, b"root:x:0:0::/root:/bin/sh\n",
                fmt=tarfile.GNU_FORMAT),
        _member(long_name, tarfile.REGTYPE, b"long", fmt=tarfile.GNU_FORMAT),  # a GNU long name
        _member("home/u/file", tarfile.REGTYPE, b"owned", mode=0o4750, uid=1000, gid=1000),
        _member("bin/tool", tarfile.REGTYPE, b"#!/bin/sh\n", mode=0o755, pax_headers=xattrs),
        _member("bin/plain", tarfile.REGTYPE, b"x" * 3000, mode=0o700),
        _member("bin/hl", tarfile.LNKTYPE, linkname="./bin/plain"),
        _member("lnk", tarfile.SYMTYPE, linkname="/etc/passwd"),
        _member("fifo", tarfile.FIFOTYPE),
        _member("old", tarfile.AREGTYPE, b"v7"),
        bytes(2 * tarfile.BLOCKSIZE),
    ])  # fmt: skip
    image, index = _convert(tmp_path, tar)
    found = _read_back(image)
    for name, (member, _) in found.items():
        assert (member.uid, member.gid) == (0, 0), name
    assert found["etc/passwd"][1] == b"root:x:0:0::/root:/bin/sh\n"
    assert found[long_name][1] == b"long"
    owned, data = found["home/u/file"]
    assert data == b"owned" and stat.S_IMODE(owned.mode) == 0o4750
    tool = found["bin/tool"][0]
    assert {k: v for k, v in tool.pax_headers.items() if "xattr" in k} == {
        "SCHILY.xattr.user.kept": "y"
    }
    (link, _), (file, content) = sorted((found["bin/hl"], found["bin/plain"]),
                                        key=lambda f: not f[0].islnk())  # fmt: skip
    assert content == b"x" * 3000  # one inode: sqfs2tar writes the other name as a link
    assert link.islnk() and link.linkname.lstrip("./") == file.name.lstrip("./")
    assert found["lnk"][0].linkname == "/etc/passwd"
    assert found["fifo"][0].isfifo()
    assert found["old"][1] == b"v7"
    written = {"etc", "etc/passwd", long_name, "home/u/file", "bin/tool", "bin/plain", "bin/hl",
               "lnk", "fifo", "old"}  # fmt: skip
    assert set(index.entries) == written and written <= set(found)  # parents made implicitly
    assert index.files == {"etc/passwd": "root:x:0:0::/root:/bin/sh\n"}


@pytest.mark.parametrize("fmt", ["gnu", "posix"])  # old GNU sparse headers; PAX 1.0 sparse
def test_a_sparse_file_under_the_cap_is_a_plain_file_with_its_zeros(
    tmp_path: Path, fmt: str
) -> None:
    work = tmp_path / "src"
    work.mkdir()
    with open(work / "sparse", "wb") as f:
        f.truncate(3 << 20)
        f.seek(1 << 20)
        f.write(b"data")
    tar = subprocess.run(
        ["tar", "--sparse", f"--format={fmt}", "-C", str(work), "-cf", "-", "sparse"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    image, _ = _convert(tmp_path, tar)
    content = subprocess.run(
        ["rdsquashfs", "--cat", "/sparse", str(image)], capture_output=True, check=True
    ).stdout
    assert content == bytes(1 << 20) + b"data" + bytes((2 << 20) - 4)


def test_a_truncated_layer_is_refused(tmp_path: Path) -> None:
    tar = _member("f", tarfile.REGTYPE, b"x" * 5000)[:3000]
    with pytest.raises(ImageError, match=r"layer\.blob"):
        _convert(tmp_path, tar)
    assert not (tmp_path / "layer.sqfs").exists()


def test_a_size_on_an_entry_without_data_cannot_make_file_data_headers(tmp_path: Path) -> None:
    # tarfile reads no data after a symlink, whatever its size field says; a reader that
    # skipped 512 bytes there would take the next file's content for a header: a device.
    # tar2sqfs 1.2 agrees with tarfile here (measured); the conversion does not rely on it:
    # such an entry is written anew, its size 0.
    forged = _member("evil", tarfile.CHRTYPE)
    tar = b"".join([
        _member("s", tarfile.SYMTYPE, linkname="t", fmt=tarfile.USTAR_FORMAT, size=512),
        _member("f", tarfile.REGTYPE, forged),
        bytes(2 * tarfile.BLOCKSIZE),
    ])  # fmt: skip
    symlink_header = tarfile.TarInfo.frombuf(tar[:512], "utf-8", "surrogateescape")
    assert symlink_header.size == 512  # the layer says so
    image, index = _convert(tmp_path, tar)
    found = _read_back(image)
    assert set(found) - {""} == {"s", "f"} == set(index.entries)
    assert found["s"][0].issym() and found["f"][1] == forged
