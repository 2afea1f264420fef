"""Fixtures of the image tests: a real registry with test images pushed by the engine."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from registry import LAYERED, Registry, build_and_push, running_registry, tools_missing
from requirements import missing

from sandlot.images.store import ImageStore


@pytest.fixture(autouse=True)
def image_layers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SANDLOT_IMAGE_LAYERS`` as the test module's ``IMAGE_LAYERS`` says (``unpack``: the
    modules that read unpacked layers on the host); else this machine's default."""
    mode = getattr(request.module, "IMAGE_LAYERS", None)
    if mode:
        monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", mode)


@pytest.fixture(params=["unpack", "mount"])
def layer_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each layer store in turn (``SANDLOT_IMAGE_LAYERS``): layers unpacked into directories,
    and converted into squashfs files (which needs ``tar2sqfs`` and ``rdsquashfs``, not FUSE:
    a test of the conversion reads the image files)."""
    if request.param == "mount" and not (shutil.which("tar2sqfs") and shutil.which("rdsquashfs")):
        missing("squashfs-tools-ng (tar2sqfs, rdsquashfs) is not installed")
    monkeypatch.setenv("SANDLOT_IMAGE_LAYERS", request.param)
    return str(request.param)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry without auth, on 127.0.0.1 (so reached over plain HTTP, as docker does)."""
    reason = tools_missing()
    if reason:
        missing(reason)
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def layered(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Reference of the multi-layer test image in :func:`registry`."""
    return build_and_push(tmp_path_factory.mktemp("layered"), LAYERED, "layered:1", registry)


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> ImageStore:
    """One cache for the tests that only read images (the base layers unpack once)."""
    return ImageStore(tmp_path_factory.mktemp("cache"))
