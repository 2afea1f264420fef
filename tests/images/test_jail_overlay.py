"""Who mounts an image's overlay: bwrap itself (0.9 and later) or ``unshare`` + ``mount``.

The choice is made from ``bwrap --version`` (a stand-in script here); the whole image suite
runs either way with the bwrap on ``PATH``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.sandboxes.local.hostdirs import HostDirs
from sandlot.sandboxes.local.jail import JailConfig, jail_argv


def _bwrap(tmp: Path, version: str) -> str:
    script = tmp / f"bwrap-{version}"
    script.write_text(f"#!/bin/sh\necho bubblewrap {version}\n")
    script.chmod(0o755)
    return str(script)


def _argv(
    tmp: Path, version: str, layers: tuple[Path, ...], user: tuple[int, int] | None = None
) -> list[str]:
    dirs = HostDirs(tmp / f"sandbox-{version}-{len(layers)}")
    dirs.root.mkdir()
    config = JailConfig(bwrap=_bwrap(tmp, version), rootfs=dirs.root / "rootfs", workdir="/testbed",
                        network=False, layers=layers, user=user)  # fmt: skip
    return jail_argv(config, dirs)


@pytest.mark.parametrize("version", ["0.9.0", "0.11.0"])
def test_a_bwrap_with_overlay_mounts_the_layers_itself(tmp_path: Path, version: str) -> None:
    top, base = tmp_path / "layers/top", tmp_path / "layers/base"
    argv = _argv(tmp_path, version, (top, base))
    assert argv[0].endswith(f"bwrap-{version}")  # no unshare + mount before it
    overlay = argv.index("--overlay")
    assert argv[1:overlay] == [
        "--overlay-src",
        str(base),
        "--overlay-src",
        str(top),
    ]  # lowest first
    assert argv[overlay + 3] == "/" and argv[overlay + 1].endswith("/upper")
    assert "--bind" not in argv[: overlay + 4]
    uid = argv.index("--uid")
    assert argv[uid - 1 : uid + 4] == ["--unshare-user", "--uid", "0", "--gid", "0"]


def test_an_image_user_is_mapped_once(tmp_path: Path) -> None:
    argv = _argv(tmp_path, "0.11.0", (tmp_path / "layer",), user=(1000, 50))
    assert argv.count("--unshare-user") == 1
    uid = argv.index("--uid")
    assert argv[uid : uid + 4] == ["--uid", "1000", "--gid", "50"]


def test_an_older_bwrap_or_too_many_layers_mount_with_unshare(tmp_path: Path) -> None:
    old = _argv(tmp_path, "0.8.0", (tmp_path / "layer",))
    assert old[0].endswith("unshare") and "--overlay" not in old
    assert "--uid" not in old  # root by unshare --map-root-user
    # mount(2) takes one page of options: 60 layers named in full would not fit.
    many = tuple(tmp_path / "layers" / ("x" * 64 + str(i)) for i in range(60))
    assert _argv(tmp_path, "0.11.0", many)[0].endswith("unshare")
