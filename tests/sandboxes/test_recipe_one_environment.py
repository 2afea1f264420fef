"""One recipe, one environment: the same distributions on ``local`` (host and a container
image), ``docker`` and ``modal`` (its fake); the install has the network, the agent's sandbox
does not.

The recipe's package is a wheel from PyPI (``iniconfig==2.0.0``), downloaded here by this
machine's pip and served by a package index on this machine: the install reaches it over the
network, and the test then checks that the sandbox cannot. (``local`` with ``image="host"``
builds its environment outside the jail, from this machine's index settings.) The test image
(Debian bookworm) has its own ``iniconfig`` 1.1.1 and ``pytest`` 7.2.1, which an isolated
environment must not show.
"""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import pytest
from fakes.shared import modal_fake_unavailable
from requirements import (
    TEST_IMAGE,
    archived_test_image,
    bwrap_missing,
    docker_engine,
    docker_engine_missing,
    local_image_missing,
    missing,
)

import sandlot
from sandlot.sandboxes.environment import EnvironmentRecipe

PACKAGE = ("iniconfig", "2.0.0")
SEED_TOOLS = {"pip", "setuptools", "wheel", "packaging"}
"""What a new virtual environment may hold before the recipe: ``python -m venv`` seeds pip
(and setuptools before Python 3.12), ``uv venv --seed`` pip, setuptools and wheel (whose
dependency is packaging)."""

DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({(d.metadata['Name'].lower(), d.version) "
    "for d in m.distributions()})))"
)


@dataclass(frozen=True)
class Target:
    id: str
    backend: str
    fields: dict[str, object]
    unavailable: Callable[[], str | None]
    container: bool  # the sandbox runs the test image


TARGETS = [
    Target("local-host", "local", {"isolation": "bwrap"}, bwrap_missing, False),
    Target(
        "local-image",
        "local",
        {"isolation": "bwrap", "image": f"oci-archive:{archived_test_image()}"},
        local_image_missing,
        True,
    ),
    Target(
        "docker",
        "docker",
        {"image": TEST_IMAGE, "pull": "never"},
        docker_engine_missing,
        True,
    ),
    # The fake's "image" is this machine's system directories; its build steps share the
    # host's network (tests/fakes/fake_modal.py).
    Target("modal-fake", "modal-fake", {"image": "python:3.12"}, modal_fake_unavailable, False),
]


@pytest.fixture(params=TARGETS, ids=[t.id for t in TARGETS])
def target(request: pytest.FixtureRequest) -> Target:
    chosen: Target = request.param
    if reason := chosen.unavailable():
        missing(reason)
    return chosen


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Port of a package index (``/simple/``) on every address of this machine, holding the
    recipe's wheel from PyPI."""
    root = tmp_path_factory.mktemp("index")
    name, version = PACKAGE
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run(
        [*download, "-d", str(root / "simple" / name), f"{name}=={version}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        missing(f"pip cannot download {name}=={version} from the package index: {done.stderr}")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def index_host(target: Target) -> str:
    """This machine as the target's sandbox reaches it: ``local`` shares its network
    namespace while the install runs; a container goes through the engine's bridge gateway."""
    if target.backend != "docker":
        return "127.0.0.1"
    bridge = docker_engine().api.inspect_network("bridge")
    return str(bridge["IPAM"]["Config"][0]["Gateway"])


async def distributions(sb: sandlot.Sandbox) -> set[tuple[str, str]]:
    r = await sb.exec(["python", "-c", DISTRIBUTIONS], timeout=60)
    assert r.ok, r.stderr
    return {(name, version) for name, version in json.loads(r.stdout)}


async def reaches(sb: sandlot.Sandbox, host: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=5)"
    return (await sb.exec(["python3", "-c", probe], timeout=30)).ok


@pytest.mark.slow
def test_one_recipe_gives_the_same_packages_and_no_network(target: Target, index: int) -> None:
    host = index_host(target)
    env = {"PIP_INDEX_URL": f"http://{host}:{index}/simple", "PIP_TRUSTED_HOST": host}
    recipe = EnvironmentRecipe(python="3.11", pip_packages=["==".join(PACKAGE)])

    async def main() -> tuple[set[tuple[str, str]], bool]:
        async with sandlot.open(target.backend, environment=recipe, env=env, **target.fields) as sb:
            assert sb.spec.network is False
            return await distributions(sb), await reaches(sb, host, index)

    installed, online = anyio.run(main)
    assert PACKAGE in installed
    assert {name for name, _ in installed} - SEED_TOOLS == {PACKAGE[0]}  # none of the image's
    assert not online, "the agent's sandbox reaches the index the install used"


@pytest.mark.slow
@pytest.mark.parametrize(
    "target", [t for t in TARGETS if t.container], ids=lambda t: t.id, indirect=True
)
def test_the_image_packages_only_when_the_recipe_says_so(target: Target) -> None:
    shared = EnvironmentRecipe(pip_packages=["pytest"], system_site_packages=True)

    async def main() -> str:
        async with sandlot.open(target.backend, environment=shared, **target.fields) as sb:
            r = await sb.exec("python3 -c 'import pytest; print(pytest.__version__)'")
            assert r.ok, r.stderr
            return r.stdout.strip()

    assert anyio.run(main) == "7.2.1"  # Debian's, used as it is: nothing is installed
