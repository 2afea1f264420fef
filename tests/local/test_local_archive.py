"""Extraction of archives coming out of a sandbox: hostile members must not escape."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandlot.sandboxes import archive as archive_module
from sandlot.sandboxes.archive import UnsafeArchiveError, build_archive, extract_archive


@pytest.fixture(autouse=True, params=["filters", "no-filters"])
def python_tarfile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test with and without tarfile extraction filters (Python < 3.10.12 has none)."""
    if request.param == "no-filters":
        monkeypatch.setattr(archive_module, "_HAS_FILTERS", False)


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("original")
    return path


def test_round_trip_renames_the_top(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "f").write_text("x")
    (source / "abs_link").symlink_to("/etc/passwd")
    build_archive(source, "src", tmp_path / "a.tar")
    extract_archive(tmp_path / "a.tar", "src", tmp_path / "out" / "renamed")
    assert (tmp_path / "out" / "renamed" / "d" / "f").read_text() == "x"
    # Links are kept as links, even absolute ones; they are inert by themselves.
    assert os.readlink(tmp_path / "out" / "renamed" / "abs_link") == "/etc/passwd"


@pytest.mark.parametrize(
    "name", ["/abs/evil", "top/../../evil", "other/evil", "top/a/../../../evil"]
)
def test_members_outside_top_are_refused(tmp_path: Path, name: str) -> None:
    archive = _tar(tmp_path / "a.tar", (_file(name), b"evil"))
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, "top", tmp_path / "out" / "top")
    assert not list(tmp_path.rglob("evil"))


def test_write_through_a_symlink_is_refused(tmp_path: Path, victim: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar",
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/link", tarfile.SYMTYPE, str(victim)), b""),
        (_file("top/link"), b"pwned"),
    )
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, "top", tmp_path / "out" / "top")
    assert victim.read_text() == "original"


def test_write_below_a_directory_symlink_is_refused(tmp_path: Path, victim: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar",
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/dir", tarfile.SYMTYPE, str(victim.parent)), b""),
        (_file("top/dir/victim.txt"), b"pwned"),
    )
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, "top", tmp_path / "out" / "top")
    assert victim.read_text() == "original"


def test_hard_link_to_a_host_file_is_refused(tmp_path: Path, victim: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar",
        (_entry("top", tarfile.DIRTYPE), b""),
        (_entry("top/hard", tarfile.LNKTYPE, str(victim)), b""),
    )
    with pytest.raises(UnsafeArchiveError):
        extract_archive(archive, "top", tmp_path / "out" / "top")


def test_hard_link_inside_the_tree_is_kept(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "a.tar",
        (_entry("top", tarfile.DIRTYPE), b""),
        (_file("top/a"), b"data"),
        (_entry("top/b", tarfile.LNKTYPE, "top/a"), b""),
    )
    extract_archive(archive, "top", tmp_path / "out" / "renamed")
    assert (tmp_path / "out" / "renamed" / "b").read_bytes() == b"data"


def test_device_files_are_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar", (_entry("top", tarfile.CHRTYPE), b""))
    with pytest.raises(UnsafeArchiveError, match="special"):
        extract_archive(archive, "top", tmp_path / "out" / "top")
