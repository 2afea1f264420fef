"""Malicious images pushed to a real registry and pulled: nothing outside the cache changes,
no layer another image shares changes, a decompression bomb is refused with its layer named,
and only ``user.*`` xattrs are kept (issue #34; each of these changed the host before it).

Each attack runs against both layer stores (``layer_store``, ``tests/images/conftest.py``):
layers unpacked into directories, and layers converted into squashfs files (read here with
``rdsquashfs``, Debian's reader of what ``squashfuse`` serves, and the layer's index)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from registry import Registry, push_tars, tools_missing
from requirements import needs

from sandlot.cli.main import cli
from sandlot.images import ImageError, pull
from sandlot.images.squash import load_index
from sandlot.images.store import ImageStore, hex_of

pytestmark = [needs(tools_missing), pytest.mark.usefixtures("layer_store")]


def _tar(*entries: tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]) -> bytes:
    """A PAX tar of ``entries`` (a member, or a regular file and its content)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, b"")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return raw.getvalue()


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, **attrs: object
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, 1_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def _state(path: Path) -> tuple[int, int, int, bytes | None]:
    """What an attack would change: mode, mtime, ctime (changed by chmod even to the same
    mode), content."""
    st = os.lstat(path)
    return st.st_mode, st.st_mtime_ns, st.st_ctime_ns, None if path.is_dir() else path.read_bytes()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ImageStore:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    return ImageStore(tmp_path / "cache")


def _pulled(store: ImageStore, ref: str, layer_store: str) -> list[Path]:
    """Pull ``ref``; its layers' directories (``unpack``) or image files (``mount``), bottom
    first."""
    record = store.record(pull(ref, store).manifest)
    assert record is not None
    where = store.layer if layer_store == "unpack" else store.layer_image
    return [where(d) for d in record["diff_ids"]]


def _image_state(image: Path) -> tuple[str, int, int, str]:
    """What an attack on a layer image would change: its bytes' hash, mtime, ctime, index."""
    st = os.stat(image)
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    return digest, st.st_mtime_ns, st.st_ctime_ns, image.with_suffix(".idx").read_text()


def _rdsquashfs(*args: str) -> str:
    return subprocess.run(["rdsquashfs", *args], capture_output=True, text=True, check=True).stdout


def test_a_directory_replaced_by_a_symlink_does_not_remode_the_host(
    registry: Registry, store: ImageStore, tmp_path: Path, layer_store: str
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir(mode=0o700)
    (canary / "file").write_text("canary")
    os.chmod(canary / "file", 0o600)
    before = {p: _state(p) for p in (canary, canary / "file")}
    layer = _tar(
        _info("x", tarfile.DIRTYPE, mode=0o777, mtime=12345),
        _info("x", tarfile.SYMTYPE, linkname=str(canary)),
        _info("y", tarfile.DIRTYPE, mode=0o4777, mtime=12345),
        _info("y", tarfile.SYMTYPE, linkname=str(canary / "file")),
    )
    ref = push_tars(registry, tmp_path, [layer])
    (top,) = _pulled(store, ref, layer_store)
    assert {p: _state(p) for p in before} == before
    if layer_store == "unpack":
        assert os.readlink(top / "x") == str(canary)  # the symlinks are kept, never followed
    else:  # the image holds the symlinks, not the directories they replaced
        entries = load_index(top).entries
        assert entries["x"] == [stat.S_IFLNK | 0o777, str(canary)]
        assert entries["y"] == [stat.S_IFLNK | 0o777, str(canary / "file")]
        assert _rdsquashfs("--stat", "/x", str(top)).count(str(canary)) == 1


def test_a_hard_link_in_place_of_a_directory_leaves_the_shared_lower_layer_alone(
    registry: Registry, store: ImageStore, tmp_path: Path, layer_store: str
) -> None:
    base = _tar(_info("shared", tarfile.DIRTYPE, mode=0o755), (_info("shared/f"), b"lower"))
    other = push_tars(registry, tmp_path, [base])
    attack = _tar(
        _info("d", tarfile.DIRTYPE, mode=0o6777, mtime=12345),
        _info("d", tarfile.LNKTYPE, linkname="shared/f", mtime=99),
        _info("e", tarfile.LNKTYPE, linkname="shared/f", mtime=99, mode=0o6777),
    )
    (lower,) = _pulled(store, other, layer_store)  # another image that has the lower layer
    if layer_store == "mount":
        before_image = _image_state(lower)
        ref = push_tars(registry, tmp_path, [base, attack])
        _, top = _pulled(store, ref, layer_store)
        assert _image_state(lower) == before_image
        assert _rdsquashfs("--cat", "/d", str(top)) == "lower"  # the link's content, a copy
        assert stat.S_IMODE(load_index(top).entries["e"][0]) == 0o644  # the lower file's mode
        return
    before = _state(lower / "shared/f")
    ref = push_tars(registry, tmp_path, [base, attack])
    _, top = _pulled(store, ref, layer_store)
    assert _state(lower / "shared/f") == before
    assert (top / "d").read_bytes() == b"lower"  # the link's content is there, as a copy
    assert os.stat(top / "d").st_ino != os.stat(lower / "shared/f").st_ino


@pytest.mark.parametrize("size", ["2G", "1T"])
def test_a_sparse_file_bomb_is_refused_with_its_layer_named(
    registry: Registry, store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    size: str,
) -> None:  # fmt: skip
    work = tmp_path / "bomb"
    work.mkdir()
    subprocess.run(["truncate", "-s", size, str(work / "zeros")], check=True)
    bomb = subprocess.run(
        ["tar", "--sparse", "--format=gnu", "-C", str(work), "-cf", "-", "zeros"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    (work / "zeros").unlink()
    ref = push_tars(registry, tmp_path, [bomb])
    done = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (blob,) = json.loads(done.stdout)["layers"]
    assert blob["size"] < 1000  # 2 GiB (1 TiB) of file from a few hundred bytes
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(cli, ["image", "pull", ref])
    assert result.exit_code != 0, result.output
    assert hex_of(blob["digest"]) in result.output, result.output
    assert "SANDLOT_UNPACK_MAX_RATIO" in result.output
    assert not any(store.layers.iterdir()) and not any(store.tmp.iterdir())  # nothing kept


def test_only_user_xattrs_are_kept(
    registry: Registry, store: ImageStore, tmp_path: Path, layer_store: str
) -> None:
    # A valid VFS_CAP_REVISION_2 value (CAP_NET_RAW permitted and effective): the kernel sets it
    # for root, so nothing but the unpack's own rule keeps it out.
    capability = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0).decode("latin-1")
    xattrs = {
        "SCHILY.xattr.security.capability": capability,
        "SCHILY.xattr.trusted.sandlot": "x",
        "SCHILY.xattr.user.kept": "y",
    }
    layer = _tar(
        (_info("tool", mode=0o755, pax_headers=xattrs), b"#!/bin/sh\n"),
        _info("dir", tarfile.DIRTYPE, pax_headers={"SCHILY.xattr.trusted.sandlot": "x"}),
    )
    ref = push_tars(registry, tmp_path, [layer])
    (layer,) = _pulled(store, ref, layer_store)
    if layer_store == "unpack":
        assert os.listxattr(layer / "tool") == ["user.kept"]
        assert os.listxattr(layer / "dir") == []
    else:  # what squashfuse would serve
        assert _rdsquashfs("--xattr", "/tool", str(layer)).split() == ["user.kept=y"]
        assert _rdsquashfs("--xattr", "/dir", str(layer)).split() == []


def test_an_image_larger_than_the_image_cap_is_refused(
    registry: Registry, store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_UNPACK_MAX_IMAGE_GIB", str(300_000 / (1 << 30)))
    layers = [_tar((_info(name), os.urandom(200_000))) for name in ("a", "b")]
    ref = push_tars(registry, tmp_path, layers)
    with pytest.raises(ImageError, match="SANDLOT_UNPACK_MAX_IMAGE_GIB"):
        pull(ref, store)
    assert not any(store.tmp.iterdir())
