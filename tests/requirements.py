"""What a test needs beyond ``pip install -e '.[test]'``, and what happens when it is missing.

A test that needs an optional part (an SDK extra, bubblewrap, a container engine, ...) is
skipped when the part is missing, with a one-line reason naming what to install. With
``CI=true`` it fails instead: CI installs every part (``.ci/run``), so a skip there would be a
part that silently stopped being tested.

In a test, a fixture or at module level (a module-level miss skips the whole module; under CI it
is a collection error, and ``tests/conftest.py`` lets the other modules run on)::

    from requirements import need, need_module

    swebench = need_module("swebench", EVAL)                      # returns the module
    need(shutil.which("uv") is not None, "uv is not installed (pip install uv)")

As a mark, checked when each test is set up (``tests/conftest.py`` runs the checks)::

    from requirements import bwrap_missing, needs

    pytestmark = needs(bwrap_missing)        # or @needs(bwrap_missing) on one test

A check is a callable returning why the part is missing, or ``None``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

IN_CI = os.environ.get("CI") == "true"

# What to install, for the reasons below (run from the checkout).
EVAL = "pip install -e '.[eval]'"
DOCKER = "pip install -e '.[docker]'"
MODAL = "pip install -e '.[modal]'"
VEFAAS = "pip install -e '.[vefaas]'"
KUBERNETES = "pip install -e '.[kubernetes]'"
SWEREX = "pip install -e '.[bench]'"
TEST = "pip install -e '.[test]'"
TRAIN = "pip install torch, then pip install -e '.[train]' (see .ci/run)"
BWRAP = "apt-get install bubblewrap"
ENGINE = (
    "a Docker API engine (Docker, or `podman system service`) with the test image: see "
    '"Tests and benchmark" in docs/docker.md'
)

TEST_IMAGE = os.environ.get("SANDLOT_TEST_IMAGE", "localhost/sandlot-base:bookworm")

Check = Callable[[], str | None]


def missing(reason: str) -> NoReturn:
    """Skip the current test (or module) because of ``reason``; fail instead with ``CI=true``."""
    __tracebackhide__ = True  # a module-level skip is reported at the line that needed the part
    if IN_CI:
        pytest.fail(f"CI=true, so this cannot be skipped: {reason}", pytrace=False)
    # A test's skip is reported at the test, not at this line.
    raise pytest.skip.Exception(reason, allow_module_level=True, _use_item_location=True)


def need(condition: object, reason: str) -> None:
    """:func:`missing` with ``reason`` unless ``condition`` holds."""
    __tracebackhide__ = True
    if not condition:
        missing(reason)


def module_missing(name: str, install: str) -> str | None:
    """Why ``import name`` fails (naming ``install``, the command that fixes it), or ``None``."""
    try:
        importlib.import_module(name)
    except ImportError as exc:
        return f"{name} is not importable ({exc}); install it with: {install}"
    return None


def importable(name: str, install: str) -> Check:
    """A check for :func:`needs`: ``import name`` works (else the reason names ``install``)."""
    return functools.partial(module_missing, name, install)


def need_module(name: str, install: str) -> Any:
    """``import name`` and return the module, or :func:`missing` naming ``install``."""
    __tracebackhide__ = True
    reason = module_missing(name, install)
    if reason is not None:
        missing(reason)
    module: ModuleType = importlib.import_module(name)
    return module


def needs(*checks: Check) -> pytest.MarkDecorator:
    """A mark that runs ``checks`` when each test it marks is set up (see :func:`check_marks`)."""
    return pytest.mark.needs.with_args(*checks)  # with_args: one callable is not the test


def check_marks(item: pytest.Item) -> None:
    """Run the checks of every ``needs`` mark of ``item``; the first miss skips (or fails) it."""
    for mark in item.iter_markers("needs"):
        for check in mark.args:
            reason = check()
            if reason is not None:
                missing(reason)


# ----------------------------------------------------------------------------- parts


def bwrap_missing() -> str | None:
    """Why bubblewrap cannot be used here, or ``None``."""
    return None if shutil.which("bwrap") else f"bubblewrap (bwrap) is not installed ({BWRAP})"


@functools.cache
def docker_engine_missing() -> str | None:
    """Why the docker backend's tests cannot run here (SDK, engine or test image), or ``None``."""
    if (reason := module_missing("docker", DOCKER)) is not None:
        return reason
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        where = os.environ.get("DOCKER_HOST", "unset")
        return f"no container engine answers at DOCKER_HOST={where} ({exc}); start one: {ENGINE}"
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        return f"the engine lacks the test image {TEST_IMAGE} (SANDLOT_TEST_IMAGE); see {ENGINE}"
    return None


def docker_engine() -> Any:
    """A ``docker.DockerClient`` for ``DOCKER_HOST`` whose engine has :data:`TEST_IMAGE`."""
    reason = docker_engine_missing()
    if reason is not None:
        missing(reason)
    import docker

    return docker.from_env()


def archived_test_image() -> Path:
    """Where :func:`local_image_missing` exports :data:`TEST_IMAGE` (an OCI archive), for
    ``local`` to run it as a container image (``image=f"oci-archive:{path}"``)."""
    name = hashlib.sha256(TEST_IMAGE.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"sandlot-contract-{os.getuid()}-{name}.tar"


@functools.cache
def local_image_missing() -> str | None:
    """Why ``local`` cannot run the test image as a container image here, or ``None``; exports
    the test image from the engine into an OCI archive once (skopeo's docker-daemon source)."""
    reason = bwrap_missing() or docker_engine_missing()
    if reason or archived_test_image().exists():
        return reason
    if shutil.which("skopeo") is None:
        return "skopeo is not installed (bash .ci/images-packages.sh)"
    staging = archived_test_image().with_suffix(".partial")
    daemon = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    done = subprocess.run(
        ["skopeo", "copy", "--quiet", "--src-daemon-host", daemon,
         f"docker-daemon:{TEST_IMAGE}", f"oci-archive:{staging}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"cannot export {TEST_IMAGE} from the engine: {done.stderr.strip()}"
    staging.rename(archived_test_image())
    return None
