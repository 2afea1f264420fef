"""Finding a container engine for the docker backend's tests.

Outside CI a missing engine skips those tests with instructions; with ``CI=true`` it fails them,
so CI cannot go green without ever reaching an engine.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest

START_HINT = 'eval "$(bash ../shared/ci/container-engine.sh)"'
TEST_IMAGE = os.environ.get("SANDLOT_TEST_IMAGE", "localhost/sandlot-base:bookworm")


@functools.cache
def _engine_problem() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'sandlot[docker]')"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        where = os.environ.get("DOCKER_HOST", "unset")
        return f"no container engine answers at DOCKER_HOST={where} ({exc})"
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        return f"the engine lacks the test image {TEST_IMAGE} (SANDLOT_TEST_IMAGE)"
    return None


def require_engine() -> Any:
    """A ``docker.DockerClient`` for ``DOCKER_HOST``; skips (fails with ``CI=true``) if none."""
    problem = _engine_problem()
    if problem is not None:
        message = f"{problem}. Start one with: {START_HINT}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {message}", pytrace=False)
        pytest.skip(message)
    import docker

    return docker.from_env()
