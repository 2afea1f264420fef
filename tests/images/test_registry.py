"""Pulls from a real registry on 127.0.0.1, and sandboxes of what they pulled."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from registry import (
    Registry,
    build_and_push,
    concurrently,
    dropping_proxy,
    local_name,
    running_registry,
    tiny_image,
    tools_missing,
)
from requirements import TEST_IMAGE, needs

import sandlot
import sandlot.images.unpacking as unpacking
from sandlot.images import ImageError, pull
from sandlot.images.store import ImageStore

pytestmark = needs(tools_missing)

IMAGE_LAYERS = "unpack"
"""This module reads layers unpacked on the host (the fallback where FUSE is unusable)."""


def _layer_digests(ref: str) -> list[str]:
    done = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    layers: list[str] = json.loads(done.stdout)["Layers"]
    return layers


@pytest.mark.anyio
async def test_a_layered_image_runs_with_deletes_links_and_private_writes(
    layered: str, shared_store: ImageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    async with (
        sandlot.open("local", image=layered) as sb,
        sandlot.open("local", image=layered) as other,
    ):
        checks = {
            "test ! -e /data/gone && echo deleted": "deleted",
            "ls /data/repl": "new",  # the directory replaced: none of its old entries remain
            "cat /data/hl": "one",  # a hard link to a file of a lower layer
            "cat /data/l1": "one",  # l1 -> l2 -> /data/dir/a
            "sha256sum -c /data/big.sha256": "/data/big: OK",  # 32 MiB, checked by the engine
            "echo mine > /usr/local/x && cat /usr/local/x": "mine",  # the root is writable
        }
        for command, expected in checks.items():
            r = await sb.exec(command)
            assert (r.exit_code, r.stdout.strip()) == (0, expected), command
        r = await other.exec("test -e /usr/local/x || echo private")
        assert r.stdout == "private\n"
    assert not any(shared_store.layers.glob("*/usr/local/x"))


def test_a_second_image_transfers_only_its_top_layer(
    registry: Registry, layered: str, shared_store: ImageStore, tmp_path: Path
) -> None:
    pull(layered, shared_store)
    containerfile = f"FROM {local_name('layered:1')}\nRUN echo plus > /data/plus\n"
    plus = build_and_push(tmp_path, containerfile, "plus:1", registry)
    result = pull(plus, shared_store)
    assert (result.cached, result.layers_transferred, result.layers_unpacked) == (False, 1, 1)
    assert pull(plus, shared_store).cached


def test_a_corrupted_blob_is_refused_and_nothing_is_cached(
    registry: Registry, tmp_path: Path
) -> None:
    ref = tiny_image(registry, tmp_path)
    (digest,) = _layer_digests(ref)
    blob = registry.blob_file(digest)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    store = ImageStore(tmp_path / "cache")
    with pytest.raises(ImageError, match="cannot pull") as caught:
        pull(ref, store)
    assert not caught.value.retryable
    assert store.entries() == [] and not any(store.layers.iterdir())
    assert not store.blob(digest).exists() and not any(store.tmp.iterdir())


def test_basic_auth_from_the_auth_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_registry(tmp_path / "reg", user="alice") as reg:
        ref = tiny_image(reg, tmp_path)
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "none.json"))
        with pytest.raises(ImageError, match=r"(?i)unauthorized|authentication"):
            pull(ref, ImageStore(tmp_path / "c1"))
        token = base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps({"auths": {reg.host: {"auth": token}}}))
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
        assert not pull(ref, ImageStore(tmp_path / "c2")).cached


_PULL_IN_A_PROCESS = """
import json, sys
from sandlot.images import pull
from sandlot.images.store import ImageStore
print(json.dumps(pull(sys.argv[1], ImageStore(__import__("pathlib").Path(sys.argv[2]))).cached))
"""


def test_concurrent_pulls_of_one_image_download_it_once(registry: Registry, tmp_path: Path) -> None:
    ref = tiny_image(registry, tmp_path)
    store = ImageStore(tmp_path / "cache")
    cached: list[bool] = []
    outputs = concurrently(
        _PULL_IN_A_PROCESS, [ref, str(store.root)], lambda: cached.append(pull(ref, store).cached)
    )
    cached += [json.loads(out) for out in outputs]
    assert sorted(cached) == [False] + [True] * 9


def test_an_interrupted_pull_leaves_nothing_a_later_pull_uses(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = tiny_image(registry, tmp_path, payload=b"x" * 100_000)
    store = ImageStore(tmp_path / "cache")
    real = unpacking.unpack_layer

    def interrupted(
        blob: Path, diff_id: str, dest: Path, below: Callable[[], list[Path]], **kw: Any
    ) -> None:
        real(blob, diff_id, dest, below, **kw)
        raise KeyboardInterrupt  # after the layer was written, before it was renamed into place

    monkeypatch.setattr(unpacking, "unpack_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull(ref, store)
    (fetched,) = store.entries()  # the fetch completed: its blobs are used, no layer is
    assert not fetched.unpacked
    assert not any(store.layers.iterdir()) and not any(store.tmp.iterdir())
    monkeypatch.setattr(unpacking, "unpack_layer", real)
    result = pull(ref, store)
    assert result.cached and result.layers_unpacked == 1


@pytest.mark.e2e
def test_a_connection_dropped_mid_blob_is_retried(registry: Registry, tmp_path: Path) -> None:
    ref = tiny_image(registry, tmp_path, payload=os.urandom(2 << 20))
    with dropping_proxy(registry.host, drop_after=256 << 10) as (proxy, cut):
        result = pull(ref.replace(registry.host, proxy), ImageStore(tmp_path / "cache"))
    assert len(cut) == 1 and "/blobs/sha256:" in cut[0]
    assert not result.cached and result.layers_unpacked == 1


@pytest.mark.anyio
async def test_the_image_user_runs_the_commands(
    registry: Registry, shared_store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    containerfile = f"FROM {TEST_IMAGE}\nRUN useradd -u 1234 -m alice\nUSER alice\n"
    ref = build_and_push(tmp_path, containerfile, "user:1", registry)
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(shared_store.root))
    for zygote in (True, False):  # forked by a zygote (its own user namespace), or own bwrap
        async with sandlot.open("local", image=ref, zygote=zygote) as sb:
            r = await sb.exec(
                "id -un; id -u; id -g; touch /usr/local/mine && echo wrote; "
                "grep -c 'CapEff:.0000000000000000' /proc/self/status"
            )
            assert r.stdout.split() == ["alice", "1234", "1234", "wrote", "1"], (zygote, r)
