"""One OCI layer into overlayfs format, and lookups through a stack of them (no registry)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandlot.images import ImageConfig, ImageError, ImageRoot, unpack_caps
from sandlot.images.unpack import OPAQUE_XATTR, unpack_layer

IMAGE_LAYERS = "unpack"
"""This module reads layers unpacked on the host (the fallback where FUSE is unusable)."""


def _entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: object) -> tuple:
    return name, kind, data, attrs


def _layer(tmp: Path, name: str, entries: list[tuple], compress: bool = True) -> tuple[Path, str]:
    """A layer blob from ``entries`` (name, tar type, content, TarInfo attributes) and its
    diff_id."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, data, attrs in entries:
            info = tarfile.TarInfo(path)
            info.type = kind
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            info.mtime = 1_000_000
            for key, value in attrs.items():
                setattr(info, key, value)
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    tar_bytes = raw.getvalue()
    blob = tmp / f"{name}.blob"
    blob.write_bytes(gzip.compress(tar_bytes) if compress else tar_bytes)
    return blob, "sha256:" + hashlib.sha256(tar_bytes).hexdigest()


def _unpack(tmp: Path, name: str, entries: list[tuple], below: list[Path] | None = None) -> Path:
    blob, diff_id = _layer(tmp, name, entries)
    dest = tmp / name
    unpack_layer(blob, diff_id, dest, lambda: below or [])
    return dest


def test_whiteouts_opaque_dirs_links_modes(tmp_path: Path) -> None:
    base = _unpack(
        tmp_path,
        "base",
        [
            _entry("etc", tarfile.DIRTYPE),
            _entry("etc/gone", data=b"x"),
            _entry("etc/kept", data=b"kept", mode=0o4750),
            _entry("data", tarfile.DIRTYPE),
            _entry("data/old", data=b"old"),
            _entry("bin", tarfile.SYMTYPE, linkname="usr/bin"),
            _entry("usr/bin/tool", data=b"#!/bin/sh\n", mode=0o755),
            _entry("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3),
            _entry("ro", tarfile.DIRTYPE, mode=0o555),
            _entry("ro/f", data=b"f"),
        ],
    )
    top = _unpack(
        tmp_path,
        "top",
        [
            _entry("etc/.wh.gone"),
            _entry("data", tarfile.DIRTYPE),
            _entry("data/.wh..wh..opq"),
            _entry("data/new", data=b"new"),
            _entry("etc/hard", tarfile.LNKTYPE, linkname="etc/kept"),
        ],
        below=[base],
    )
    whiteout = os.lstat(top / "etc/gone")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0
    assert os.getxattr(top / "data", OPAQUE_XATTR) == b"y"
    # A hard link to a file of a lower layer: the same content, here a link to it.
    assert (top / "etc/hard").read_bytes() == b"kept"
    assert stat.S_IMODE(os.lstat(base / "etc/kept").st_mode) == 0o4750
    assert os.readlink(base / "bin") == "usr/bin"
    assert not (base / "dev/null").exists()  # device nodes are skipped rootless
    assert stat.S_IMODE(os.lstat(base / "ro").st_mode) == 0o555
    assert os.lstat(base / "data/old").st_mtime == 1_000_000

    root = ImageRoot("test", "sha256:" + "0" * 64, (top, base), ImageConfig())
    assert root.lookup("/etc/gone") is None
    assert root.lookup("/data/old") is None  # hidden by the opaque directory
    assert root.lookup("/data/new") == top / "data/new"
    assert root.lookup("/bin/tool") == base / "usr/bin/tool"  # through the symlink
    assert root.executable("/bin/tool")


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([_entry("../escape", data=b"x")], "leaves the layer"),
        (
            [_entry("link", tarfile.SYMTYPE, linkname="/etc"), _entry("link/passwd", data=b"x")],
            "not a directory",
        ),
        ([_entry("h", tarfile.LNKTYPE, linkname="nowhere")], "no layer has"),
        (
            [_entry("f", data=b"x", pax_headers={"SCHILY.xattr.user.overlay.opaque": "y"})],
            "overlayfs xattr",
        ),
    ],
)
def test_entries_that_would_escape_or_forge_are_refused(
    tmp_path: Path, entries: list, why: str
) -> None:
    with pytest.raises(ImageError, match=why):
        _unpack(tmp_path, "bad", entries)


def test_a_layer_that_is_not_its_diff_id_is_refused(tmp_path: Path) -> None:
    blob, _ = _layer(tmp_path, "l", [_entry("f", data=b"x")])
    with pytest.raises(ImageError, match="not the diff_id"):
        unpack_layer(blob, "sha256:" + "1" * 64, tmp_path / "out", list)


def test_plain_tar_and_trailing_bytes_are_hashed(tmp_path: Path) -> None:
    blob, diff_id = _layer(tmp_path, "plain", [_entry("f", data=b"x" * 5000)], compress=False)
    unpack_layer(blob, diff_id, tmp_path / "out", list)
    assert (tmp_path / "out/f").read_bytes() == b"x" * 5000


def test_gzip_of_several_members_with_padding_is_one_layer(tmp_path: Path) -> None:
    blob, diff_id = _layer(tmp_path, "l", [_entry("f", data=b"y" * 300_000)], compress=False)
    tar_bytes = blob.read_bytes()
    # Two gzip members and zero padding, as concatenating compressors write.
    blob.write_bytes(
        gzip.compress(tar_bytes[:70_000]) + gzip.compress(tar_bytes[70_000:]) + b"\0" * 9
    )
    unpack_layer(blob, diff_id, tmp_path / "out", list)
    assert (tmp_path / "out/f").read_bytes() == b"y" * 300_000


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda b: b[: len(b) // 2], "ends before its end marker"),
        (lambda b: b + b"garbage", "not a gzip member"),
        (lambda b: b[:40] + bytes(64) + b[104:], "not a valid compressed tar"),
    ],
)
def test_a_corrupt_gzip_blob_is_refused(tmp_path: Path, damage: object, why: str) -> None:
    blob, diff_id = _layer(tmp_path, "l", [_entry("f", data=os.urandom(200_000))])
    blob.write_bytes(damage(blob.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ImageError, match=why):
        unpack_layer(blob, diff_id, tmp_path / "out", list)


def test_a_refused_entry_before_megabytes_of_data_stops_the_unpack(tmp_path: Path) -> None:
    # The blob is decompressed in a thread into a pipe: a refusal while that thread waits on
    # the full pipe must end it (the unpack returns its error, it does not hang).
    entries = [_entry("link", tarfile.SYMTYPE, linkname="/etc"), _entry("link/x", data=b"x")]
    entries += [_entry(f"f{i}", data=os.urandom(1 << 20)) for i in range(4)]
    with pytest.raises(ImageError, match="not a directory"):
        _unpack(tmp_path, "bad", entries)


def test_image_config_and_user_lookup(tmp_path: Path) -> None:
    layer = _unpack(
        tmp_path,
        "etc",
        [
            _entry("etc/passwd", data=b"root:x:0:0::/root:/bin/sh\nalice:x:1234:99::/h:/bin/sh\n"),
            _entry("etc/group", data=b"root:x:0:\nstaff:x:50:\n"),
        ],
    )
    document = {"config": {"Env": ["A=1", "B=x=y", "A=2"], "User": "alice", "WorkingDir": "/w",
                           "Entrypoint": ["/bin/sh"], "Cmd": ["-c", "true"]}}  # fmt: skip
    config = ImageConfig.from_oci(document)
    assert config.env == {"A": "2", "B": "x=y"} and config.working_dir == "/w"
    assert (config.entrypoint, config.cmd) == (("/bin/sh",), ("-c", "true"))

    def ids(user: str) -> tuple[int, int] | None:
        root = ImageRoot("t", "sha256:" + "0" * 64, (layer,), ImageConfig(user=user))
        return root.user_ids()

    assert ids("alice") == (1234, 99) and ids("alice:staff") == (1234, 50)
    assert ids("7:8") == (7, 8) and ids("7") == (7, 7) and ids("root") is None and ids("") is None
    with pytest.raises(ImageError, match="has no 'bob'"):
        ids("bob")


# Tricks of an attacker who has read the unpack (issue #34); each is refused or stays inside
# the layer, and none changes the canary, a host directory the layer's symlinks point at.


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "canary"
    path.mkdir(mode=0o700)
    (path / "file").write_text("canary")
    return path


def _states(root: Path) -> dict[str, tuple[int, int, int, bytes | None, list[str]]]:
    """Mode, mtime, ctime, content and xattrs of ``root`` and what it holds."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        data = path.read_bytes() if path.is_file() else None
        found[str(path)] = (st.st_mode, st.st_mtime_ns, st.st_ctime_ns, data, os.listxattr(path))
    return found


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([_entry("h", tarfile.LNKTYPE, linkname="../../etc/passwd")], "leaves the layer"),
        ([_entry("h", tarfile.LNKTYPE, linkname="a/../../../x")], "leaves the layer"),
        (  # a hard link through a symlink of this layer
            [_entry("l", tarfile.SYMTYPE, linkname="{canary}"),
             _entry("h", tarfile.LNKTYPE, linkname="l/file")],
            "not a directory",
        ),
        (  # a directory replaced by a file, then an entry under it
            [_entry("d", tarfile.DIRTYPE, mode=0o777), _entry("d", data=b"f"),
             _entry("d/x", data=b"x")],
            "not a directory",
        ),
        (  # a whiteout, and an opaque marker, through a symlink
            [_entry("l", tarfile.SYMTYPE, linkname="{canary}"), _entry("l/.wh.file")],
            "not a directory",
        ),
        (
            [_entry("l", tarfile.SYMTYPE, linkname="{canary}"), _entry("l/.wh..wh..opq")],
            "not a directory",
        ),
        ([_entry("a", tarfile.DIRTYPE), _entry("a/.wh...")], "whiteout of no name"),
        ([_entry(".wh..")], "whiteout of no name"),
        ([_entry("n" * 300, data=b"x")], "cannot hold"),
        ([_entry("d/" * 300 + "f", data=b"x")], "directories deep"),
        (  # hard links only to regular files: not a FIFO, a directory, a symlink
            [_entry("p", tarfile.FIFOTYPE), _entry("h", tarfile.LNKTYPE, linkname="p")],
            "not a regular file",
        ),
        (
            [_entry("d", tarfile.DIRTYPE), _entry("h", tarfile.LNKTYPE, linkname="d")],
            "not a regular file",
        ),
        (
            [_entry("l", tarfile.SYMTYPE, linkname="{canary}/file"),
             _entry("h", tarfile.LNKTYPE, linkname="l")],
            "not a regular file",
        ),
    ],
)  # fmt: skip
def test_tricks_are_refused_and_leave_the_host_alone(
    tmp_path: Path, canary: Path, entries: list, why: str
) -> None:
    entries = [
        (name, kind, data, {k: str(v).format(canary=canary) for k, v in attrs.items()}
         if "linkname" in attrs else attrs)
        for name, kind, data, attrs in entries
    ]  # fmt: skip
    before = _states(canary)
    with pytest.raises(ImageError, match=why):
        _unpack(tmp_path, "bad", entries)
    assert not (tmp_path / "bad").exists()  # nothing of a refused layer is left
    assert _states(canary) == before


def test_a_directory_replaced_keeps_none_of_its_attributes(tmp_path: Path) -> None:
    layer = _unpack(
        tmp_path,
        "l",
        [
            _entry("d", tarfile.DIRTYPE, mode=0o777),
            _entry("d/sub", tarfile.DIRTYPE, mode=0o777),
            _entry("d", data=b"now a file", mode=0o600),
            _entry("e", tarfile.DIRTYPE, mode=0o711, mtime=5),
            _entry("e", tarfile.DIRTYPE, mode=0o750, mtime=7),  # a duplicate merges: the last wins
            _entry("e/f", data=b"f"),
        ],
    )
    assert stat.S_IMODE(os.lstat(layer / "d").st_mode) == 0o600
    st = os.lstat(layer / "e")
    assert (stat.S_IMODE(st.st_mode), st.st_mtime) == (0o750, 7)


def test_duplicated_entries_replace_and_a_hard_link_keeps_what_it_pointed_at(
    tmp_path: Path,
) -> None:
    layer = _unpack(
        tmp_path,
        "l",
        [
            _entry("f", data=b"first", mode=0o600),
            _entry("g", tarfile.LNKTYPE, linkname="f", mode=0o4777, mtime=1),
            _entry("f", data=b"second", mode=0o4755),
        ],
    )
    assert (layer / "g").read_bytes() == b"first"
    st = os.lstat(layer / "g")  # the link entry's own mode and time are not applied
    assert (stat.S_IMODE(st.st_mode), st.st_mtime) == (0o600, 1_000_000)
    assert stat.S_IMODE(os.lstat(layer / "f").st_mode) == 0o4755


def test_a_hard_link_to_a_fifo_below_is_refused_without_opening_it(tmp_path: Path) -> None:
    base = _unpack(tmp_path, "base", [_entry("p", tarfile.FIFOTYPE)])
    with pytest.raises(ImageError, match="not a regular file"):  # and no hang on the FIFO
        _unpack(tmp_path, "top", [_entry("h", tarfile.LNKTYPE, linkname="p")], below=[base])


def test_a_layer_past_its_ratio_is_refused_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 80 MiB of zeros gzip to 80 KiB (1000x): past 32x and the 64 MiB floor.
    blob, diff_id = _layer(tmp_path, "zeros", [_entry("z", data=bytes(80 << 20))])
    with pytest.raises(ImageError, match=rf"layer {blob.name} unpacks to more than 64.0 MiB"):
        unpack_layer(blob, diff_id, tmp_path / "out", list)
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("SANDLOT_UNPACK_MAX_RATIO", "0")  # no cap
    unpack_layer(blob, diff_id, tmp_path / "out", list)
    assert (tmp_path / "out/z").stat().st_size == 80 << 20


def test_a_layer_of_many_empty_entries_is_a_bomb_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each entry counts 128 bytes: 3000 empty files (a 19 KB blob) at a ratio of 4 and no
    # floor are refused.
    monkeypatch.setattr(unpack_caps, "LAYER_FLOOR", 0)
    monkeypatch.setenv("SANDLOT_UNPACK_MAX_RATIO", "4")
    blob, diff_id = _layer(tmp_path, "many", [_entry(f"e{i}") for i in range(3000)])
    with pytest.raises(ImageError, match="SANDLOT_UNPACK_MAX_RATIO"):
        unpack_layer(blob, diff_id, tmp_path / "out", list)
    assert not (tmp_path / "out").exists()
