"""What a command of a ``local`` image sandbox sees of its runtime files (``/etc/hosts``,
``/etc/hostname``, ``/etc/resolv.conf``), its hostname and the image's ``WorkingDir``, as a
container of the engine sees them. The image is the contract suite's ``local-image`` one (the
test image, exported from the engine once)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from requirements import (
    TEST_IMAGE,
    archived_test_image,
    docker_engine,
    local_image_missing,
    needs,
)

import sandlot
from sandlot.sandboxes.base import Sandbox
from sandlot.sandboxes.local import LocalSandbox

pytestmark = needs(local_image_missing)

IMAGE = f"oci-archive:{archived_test_image()}"

# Every address /etc/hosts gives `localhost`: a server listens there, a client connects to
# `localhost` (what a test server of vitest or pytest does).
_SERVE_LOCALHOST = """
import socket
for family, kind, proto, _, address in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM):
    server = socket.socket(family, kind, proto)
    server.bind(address[:2])
    server.listen()
    port = server.getsockname()[1]
    socket.create_connection(("localhost", port), timeout=5).close()
    server.accept()[0].close()
    print(address[0])
"""

_NAMES = """python3 -c '
import socket
for name in ("localhost", socket.gethostname()):
    print(sorted({a[4][0] for a in socket.getaddrinfo(name, 0, socket.AF_INET)}))
'"""
"""The IPv4 addresses of ``localhost`` and of the hostname. (Podman's ``/etc/hosts`` starts
from the host's, which may have no ``::1`` record; Docker's and ours have one.)"""


def _host_resolv() -> str:
    return Path("/etc/resolv.conf").read_text()


async def _out(sb: Sandbox, command: str) -> str:
    r = await sb.exec(command, timeout=60)
    assert r.exit_code == 0, r.stderr
    return r.stdout


@pytest.mark.anyio
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_localhost_resolves_and_a_server_on_it_is_reached(zygote: bool) -> None:
    async with sandlot.open("local", image=IMAGE, zygote=zygote) as sb:
        assert "localhost" in await _out(sb, "getent hosts localhost")
        assert "127.0.0.1" in (await _out(sb, f"python3 -c '{_SERVE_LOCALHOST}'")).split()
        hostname = (await _out(sb, "hostname")).strip()
        assert hostname == sb.id.removeprefix("sandlot-")
        assert await _out(sb, "cat /etc/hostname") == f"{hostname}\n"
        assert (await _out(sb, f"getent hosts {hostname}")).split() == ["127.0.0.1", hostname]


@pytest.mark.anyio
async def test_resolv_conf_is_the_hosts_with_the_network_and_empty_without() -> None:
    async with sandlot.open("local", image=IMAGE, network=True) as sb:
        assert await _out(sb, "cat /etc/resolv.conf") == _host_resolv()
    async with sandlot.open("local", image=IMAGE) as sb:
        assert await _out(sb, "wc -c < /etc/resolv.conf") == "0\n"


@pytest.mark.anyio
async def test_the_files_are_the_sandboxs_own_not_the_layers() -> None:
    async with (
        sandlot.open("local", image=IMAGE) as first,
        sandlot.open("local", image=IMAGE) as second,
    ):
        await _out(first, "echo '10.0.0.1 mine' >> /etc/hosts")
        assert "mine" not in await _out(second, "cat /etc/hosts")
        assert await _out(first, "hostname") != await _out(second, "hostname")


@pytest.mark.anyio
async def test_a_restart_with_another_network_rewrites_resolv_conf() -> None:
    # What an environment recipe's install does: the jail restarted with the network, then
    # without it (LocalSandbox._install_online).
    async with sandlot.open("local", image=IMAGE) as sb:
        assert isinstance(sb, LocalSandbox) and sb._jail_config is not None
        config, hostname = sb._jail_config, await _out(sb, "hostname")
        await sb._restart_init(dataclasses.replace(config, network=True))
        assert await _out(sb, "cat /etc/resolv.conf; hostname") == _host_resolv() + hostname
        await sb._restart_init(config)
        assert await _out(sb, "wc -c < /etc/resolv.conf; hostname") == "0\n" + hostname


@pytest.mark.anyio
async def test_a_fork_has_a_hostname_and_files_of_its_own() -> None:
    async with sandlot.open("local", image=IMAGE) as sb:
        await _out(sb, "echo '10.0.0.1 parent' >> /etc/hosts")
        snapshot = await sb.snapshot()
        try:
            async with sandlot.open(snapshot=snapshot) as fork:
                hostname = (await _out(fork, "hostname")).strip()
                assert (
                    hostname == fork.id.removeprefix("sandlot-") != sb.id.removeprefix("sandlot-")
                )
                hosts = await _out(fork, "cat /etc/hosts")
                assert hosts.endswith(f"127.0.0.1\t{hostname}\n") and "parent" not in hosts
        finally:
            await snapshot.delete()


@pytest.fixture(scope="module")
def working_dir_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test image with ``WorkingDir: /app`` in its config, as an OCI layout (its layers
    are the archive's: cached already)."""
    layout = tmp_path_factory.mktemp("workdir-image")
    with tarfile.open(archived_test_image()) as archive:
        archive.extractall(layout, filter="data")

    def blob(digest: str) -> Any:
        return json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes())

    def put(document: Any, media_type: str) -> dict[str, Any]:
        data = json.dumps(document).encode()
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    index = json.loads((layout / "index.json").read_text())
    manifest = blob(index["manifests"][0]["digest"])
    config = blob(manifest["config"]["digest"])
    config.setdefault("config", {})["WorkingDir"] = "/app"
    manifest["config"] = put(config, manifest["config"]["mediaType"])
    index["manifests"] = [put(manifest, index["manifests"][0]["mediaType"])]
    (layout / "index.json").write_text(json.dumps(index))
    return f"oci:{layout}"


@pytest.mark.anyio
async def test_the_images_working_dir_is_the_default_workdir(working_dir_image: str) -> None:
    async with sandlot.open("local", image=working_dir_image) as sb:
        assert sb.spec.workdir == "/app"
        assert await _out(sb, "pwd; echo $SANDLOT_WORKDIR") == "/app\n/app\n"
        await sb.write_file("f", b"x")  # relative paths start there too
        assert await _out(sb, "cat /app/f") == "x"
        session = await sb.shell()
        assert (await session.run("pwd")).output.strip() == "/app"
        await session.close()
    # An explicit workdir wins, as `docker run -w` does.
    async with sandlot.open("local", image=working_dir_image, workdir="/testbed") as sb:
        assert await _out(sb, "pwd") == "/testbed\n"


@pytest.fixture(scope="module")
def working_dir_engine_image() -> str:
    """The test image with ``WORKDIR /app``, in the engine (``docker commit --change``)."""
    name = "localhost/sandlot-workdir-test:1"
    container = docker_engine().containers.create(TEST_IMAGE, ["true"])
    try:
        container.commit(*name.rsplit(":", 1), changes=["WORKDIR /app"])
    finally:
        container.remove()
    return name


@pytest.mark.anyio
async def test_the_working_dir_is_the_default_workdir_on_the_engine_too(
    working_dir_engine_image: str,
) -> None:
    image = working_dir_engine_image
    async with sandlot.open("docker", image=image, pull="never") as sb:
        assert sb.spec.workdir == "/app" and await _out(sb, "pwd") == "/app\n"
    async with sandlot.open("docker", image=image, pull="never", workdir="/testbed") as sb:
        assert await _out(sb, "pwd") == "/testbed\n"


@pytest.mark.anyio
async def test_localhost_and_the_hostname_resolve_as_on_the_engine() -> None:
    async with sandlot.open("docker", image=TEST_IMAGE, pull="never") as sb:
        engine = await _out(sb, _NAMES)
    async with sandlot.open("local", image=IMAGE) as sb:
        assert await _out(sb, _NAMES) == engine
    assert engine == "['127.0.0.1']\n['127.0.0.1']\n"
