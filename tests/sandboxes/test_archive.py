"""Extraction of archives coming out of a sandbox (``sandlot.sandboxes.archive``), used by every
backend's ``download``: hostile members must not escape, links must stay inside the tree, and
sizes are capped before anything is written."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandlot.errors import SandboxFileError
from sandlot.sandboxes.archive import (
    DownloadLimitError,
    UnsafeArchiveError,
    build_archive,
    extract_archive,
    link_stays_inside,
    read_single_file,
)

MiB = 1024 * 1024


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buf.seek(0)
    return buf


def _entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


class _Zeros(io.RawIOBase):
    """An endless stream: what a sandbox streaming a sparse file looks like past its header."""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        b[:] = bytes(len(b))
        return len(b)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("original")
    return path


def test_round_trip_renames_the_top_and_keeps_inner_links(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "f").write_text("x")
    (source / "d" / "up").symlink_to("../top.txt")
    (source / "top.txt").write_text("t")
    archive = tmp_path / "a.tar"
    build_archive(source, "src", archive)
    with archive.open("rb") as stream:
        report = extract_archive(stream, tmp_path / "out" / "renamed")
    out = tmp_path / "out" / "renamed"
    assert (out / "d" / "f").read_text() == "x"
    assert os.readlink(out / "d" / "up") == "../top.txt"
    assert (out / "d" / "up").read_text() == "t"
    assert (report.files, report.bytes, report.skipped) == (2, 2, [])


@pytest.mark.parametrize(
    ("target", "reason"),
    [("/etc/passwd", "absolute"), ("../../etc", "climbs out"), ("d/../..", "name then ..")],
)
def test_links_leading_outside_are_skipped_and_reported(
    tmp_path: Path, target: str, reason: str
) -> None:
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/d", tarfile.DIRTYPE), b""),
        (_entry("top/bad", tarfile.SYMTYPE, target), b""),
        (_entry("top/ok"), b"fine"),
    )
    report = extract_archive(archive, tmp_path / "out")
    assert not os.path.lexists(tmp_path / "out" / "bad"), reason
    assert (tmp_path / "out" / "ok").read_bytes() == b"fine"
    assert [path for path, _ in report.skipped] == ["out/bad"]
    assert target in report.skipped[0][1]


def test_link_rule() -> None:
    assert link_stays_inside("a/b", 0) and link_stays_inside("../x", 1)
    assert link_stays_inside("./../x/./y", 1) and link_stays_inside("..", 1)
    assert not link_stays_inside("..", 0) and not link_stays_inside("../../x", 1)
    assert not link_stays_inside("/abs", 5) and not link_stays_inside("", 1)
    assert not link_stays_inside("d/..", 3)  # d may itself be a link to "."


@pytest.mark.parametrize(
    "name", ["/abs/evil", "top/../../evil", "other/evil", "top/a/../../../evil"]
)
def test_members_outside_top_are_refused(tmp_path: Path, name: str) -> None:
    archive = _tar((_entry("top", tarfile.DIRTYPE), b""), (_entry(name), b"evil"))
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, tmp_path / "out" / "top")
    assert not list(tmp_path.rglob("evil"))


def test_a_later_member_never_writes_through_an_earlier_link(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/sub", tarfile.DIRTYPE), b""),
        (_entry("top/dir", tarfile.SYMTYPE, "sub"), b""),  # inside: kept
        (_entry("top/dir/f"), b"through"),
    )
    with pytest.raises(UnsafeArchiveError, match="symbolic link"):
        extract_archive(archive, tmp_path / "out" / "top")
    assert not (tmp_path / "out" / "top" / "sub" / "f").exists()


def test_existing_host_links_in_the_destination_are_replaced_not_followed(
    tmp_path: Path, victim: Path
) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "f").symlink_to(victim)
    (dest / "d").symlink_to(tmp_path)
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/f"), b"pwned"),
    )
    extract_archive(archive, dest)
    assert victim.read_text() == "original"
    assert not (dest / "f").is_symlink() and (dest / "f").read_bytes() == b"pwned"
    below = _tar((_entry("top", tarfile.DIRTYPE), b""), (_entry("top/d/victim.txt"), b"pwned"))
    with pytest.raises(UnsafeArchiveError):
        extract_archive(below, dest)
    assert victim.read_text() == "original"


def test_a_single_file_download_replaces_a_link_at_the_destination(
    tmp_path: Path, victim: Path
) -> None:
    (tmp_path / "dest").symlink_to(victim)
    extract_archive(_tar((_entry("r.txt"), b"result")), tmp_path / "dest")
    assert victim.read_text() == "original"
    assert (tmp_path / "dest").read_bytes() == b"result"


def test_hard_link_to_a_host_file_is_refused(tmp_path: Path, victim: Path) -> None:
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/hard", tarfile.LNKTYPE, str(victim)), b""),
    )
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, tmp_path / "out" / "top")


def test_hard_link_inside_the_tree_is_kept(tmp_path: Path) -> None:
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/a"), b"data"),
        (_entry("top/b", tarfile.LNKTYPE, "top/a"), b""),
    )
    extract_archive(archive, tmp_path / "out" / "renamed")
    assert (tmp_path / "out" / "renamed" / "b").read_bytes() == b"data"
    assert os.stat(tmp_path / "out" / "renamed" / "b").st_nlink == 2


def test_special_files_are_skipped_and_reported(tmp_path: Path) -> None:
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/dev", tarfile.CHRTYPE), b""),
        (_entry("top/fifo", tarfile.FIFOTYPE), b""),
    )
    report = extract_archive(archive, tmp_path / "top")
    assert sorted(path for path, _ in report.skipped) == ["top/dev", "top/fifo"]
    assert os.listdir(tmp_path / "top") == []


def test_setuid_bits_are_dropped(tmp_path: Path) -> None:
    info = _entry("f")
    info.mode = 0o4755
    extract_archive(_tar((info, b"#!/bin/sh\n")), tmp_path / "f")
    assert (tmp_path / "f").stat().st_mode & 0o7777 == 0o755


def test_per_file_cap_is_checked_from_the_header_before_writing(tmp_path: Path) -> None:
    # A header announcing 1 GiB followed by zeros forever: a sparse file as a sandbox streams it.
    header = _entry("top/huge")
    header.size = 1024 * MiB
    stream = io.BufferedReader(_Zeros())
    prefix = _tar((_entry("top", tarfile.DIRTYPE), b"")).getvalue()[:512]
    raw = io.BytesIO(prefix + header.tobuf(tarfile.PAX_FORMAT))

    class Chained(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            data = raw.read(len(b)) or stream.read(len(b))
            b[: len(data)] = data
            return len(data)

    with pytest.raises(DownloadLimitError, match="max_file_bytes"):
        extract_archive(io.BufferedReader(Chained()), tmp_path / "top", max_file_bytes=MiB)
    assert not (tmp_path / "top" / "huge").exists()


def test_total_cap_stops_before_the_file_that_crosses_it(tmp_path: Path) -> None:
    archive = _tar(
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/a"), b"x" * 600),
        (_entry("top/b"), b"y" * 600),
    )
    with pytest.raises(DownloadLimitError, match="max_bytes=1000"):
        extract_archive(archive, tmp_path / "top", max_bytes=1000)
    assert (tmp_path / "top" / "a").stat().st_size == 600
    assert not (tmp_path / "top" / "b").exists()


def test_archive_bytes_are_capped_too(tmp_path: Path) -> None:
    # Many empty files cost no content bytes but endless headers.
    class Headers(io.RawIOBase):
        n = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            Headers.n += 1
            block = _entry(f"top/e{Headers.n}").tobuf(tarfile.USTAR_FORMAT)
            b[: len(block)] = block
            return len(block)

    from sandlot.sandboxes import archive as archive_module

    original = archive_module.ARCHIVE_OVERHEAD_BYTES
    archive_module.ARCHIVE_OVERHEAD_BYTES = 64 * 1024
    try:
        with pytest.raises(DownloadLimitError, match="archive is larger"):
            extract_archive(io.BufferedReader(Headers()), tmp_path / "top", max_bytes=1024)
    finally:
        archive_module.ARCHIVE_OVERHEAD_BYTES = original


def test_empty_archive_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxFileError, match="empty"):
        extract_archive(_tar(), tmp_path / "x")


def test_read_single_file_caps_from_the_header(tmp_path: Path) -> None:
    assert read_single_file(_tar((_entry("f"), b"abc")), "/f", 3) == b"abc"
    with pytest.raises(DownloadLimitError, match="max_bytes=2"):
        read_single_file(_tar((_entry("f"), b"abc")), "/f", 2)
    with pytest.raises(SandboxFileError, match="directory"):
        read_single_file(_tar((_entry("d", tarfile.DIRTYPE), b"")), "/d", 2)
