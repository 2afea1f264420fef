"""A real registry on 127.0.0.1 and test images built by the test engine, for the image tests.

The registry is the CNCF distribution server (Debian's ``docker-registry`` package); the images
are built by ``podman build`` from the suite's test image and pushed with ``podman push``, as a
user's CI would. Everything needed is in ``.ci/images-packages.sh``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from requirements import TEST_IMAGE

INSTALL = (
    "bash .ci/images-packages.sh (apt-get install skopeo docker-registry apache2-utils podman)"
)
TOOLS = {"skopeo": "skopeo", "docker-registry": "docker-registry", "htpasswd": "apache2-utils",
         "podman": "podman", "unshare": "util-linux"}  # fmt: skip

LAYERED = f"""FROM {TEST_IMAGE}
RUN mkdir -p /data/dir /data/repl && echo one > /data/dir/a && echo del > /data/gone \\
    && echo orig > /data/repl/old && echo orig > /data/repl/old2
RUN rm /data/gone && rm -rf /data/repl && mkdir /data/repl && echo new > /data/repl/new \\
    && ln /data/dir/a /data/hl && ln -s l2 /data/l1 && ln -s /data/dir/a /data/l2
RUN head -c 33554432 /dev/urandom > /data/big && sha256sum /data/big > /data/big.sha256
"""
"""A multi-layer image: upper layers delete a file and replace a directory, hard-link across
layers, hold a symlink chain and a 32 MiB file (with its checksum, taken by the engine)."""

TINY = "FROM scratch\nCOPY payload /payload\n"
"""A one-layer image for the tests that pull many times."""


def tools_missing() -> str | None:
    """Why the registry tests cannot run here, or ``None``."""
    absent = [name for name in TOOLS if shutil.which(name) is None]
    if absent:
        return f"{', '.join(absent)} not installed: {INSTALL}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Registry:
    """A running registry: ``host`` is ``127.0.0.1:PORT``; ``storage`` its blob storage."""

    host: str
    storage: Path
    user: str | None = None
    password: str | None = None

    def blob_file(self, digest: str) -> Path:
        """The file the registry stores blob ``digest`` in (distribution's filesystem driver)."""
        hexpart = digest.split(":", 1)[1]
        return self.storage / f"docker/registry/v2/blobs/sha256/{hexpart[:2]}/{hexpart}/data"


@contextmanager
def running_registry(workdir: Path, *, user: str | None = None) -> Iterator[Registry]:
    """Serve a registry from ``workdir`` until the block ends; with ``user``, basic auth
    (password ``user + "-pw"``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    auth = ""
    password = None
    if user:
        password = user + "-pw"
        subprocess.run(["htpasswd", "-Bbc", str(workdir / "htpasswd"), user, password], check=True,
                       capture_output=True)  # fmt: skip
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {workdir / 'htpasswd'}\n"
    config = workdir / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
        f"{workdir / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "registry.log", "wb"),  # noqa: SIM115
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v2/", process)
        yield Registry(f"127.0.0.1:{port}", workdir / "storage", user, password)
    finally:
        process.terminate()
        process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    # Readiness, not timing: the loop ends as soon as it answers, or when the server died.
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except urllib.error.HTTPError:
            return  # 401: up, with auth
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"docker-registry did not answer at {url}")


def build_and_push(context: Path, containerfile: str, name: str, registry: Registry) -> str:
    """Build ``containerfile`` in ``context`` with podman, push it to ``registry`` as
    ``name``; return the pushed reference."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(containerfile)
    local = local_name(name)
    _podman("build", "-q", "-t", local, str(context))
    ref = f"{registry.host}/{name}"
    creds = [f"--creds={registry.user}:{registry.password}"] if registry.user else []
    _podman("push", "-q", "--tls-verify=false", *creds, local, ref)
    return ref


def local_name(name: str) -> str:
    """The engine's name of test image ``name`` (``FROM`` it to build on it)."""
    return f"localhost/sandlot-images-test/{name}"


def _podman(*args: str) -> None:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed: {done.stderr.strip()}")


@contextmanager
def dropping_proxy(upstream: str, drop_after: int) -> Iterator[tuple[str, list[str]]]:
    """A TCP proxy to ``upstream`` (``host:port``) that cuts the connection of the first blob
    download after ``drop_after`` bytes of its response, as a flaky network does; yields its
    ``host:port`` and the list of blob requests it cut."""
    listener = socket.create_server(("127.0.0.1", 0))
    cut: list[str] = []
    host, port = upstream.rsplit(":", 1)

    def pump(src: socket.socket, dst: socket.socket, watch: list[int] | None) -> None:
        try:
            while data := src.recv(65536):
                if watch is not None and watch[0] >= 0:
                    room = drop_after - watch[0]
                    if len(data) >= room:
                        dst.sendall(data[:room])
                        break  # cut mid-blob
                    watch[0] += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def requests(client: socket.socket, server: socket.socket, watch: list[int]) -> None:
        try:
            while data := client.recv(65536):
                line = data.split(b"\r\n", 1)[0].decode("latin-1")
                if not cut and line.startswith("GET ") and "/blobs/sha256:" in line:
                    cut.append(line)
                    watch[0] = 0  # count this response's bytes from here
                server.sendall(data)
        except OSError:
            pass

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection((host, int(port)))
            watch = [-1]
            threading.Thread(target=requests, args=(client, server, watch), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, watch), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", cut
    finally:
        listener.close()


def tiny_image(registry: Registry, tmp: Path, payload: bytes | None = None) -> str:
    """Push a new one-layer image (a unique payload unless given) and return its reference."""
    context = tmp / uuid.uuid4().hex
    context.mkdir()
    (context / "payload").write_bytes(payload if payload is not None else uuid.uuid4().bytes)
    return build_and_push(context, TINY, f"tiny-{uuid.uuid4().hex[:8]}:1", registry)


Entry = tuple[str, bytes, str]
"""A tar entry of :func:`push_layers`: name, type (``tarfile.REGTYPE``, ``DIRTYPE``,
``LNKTYPE``...), and its content (a regular file) or link target (a link)."""


def _tar(entries: Sequence[Entry]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, body in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, 0o755, 1_000_000
            data = body.encode()
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.linkname = body
                tar.addfile(info)
    return raw.getvalue()


def push_layers(registry: Registry, tmp: Path, layers: Sequence[Sequence[Entry]]) -> str:
    """Push a new image made of ``layers`` (bottom first; no engine involved: an OCI layout
    written here, copied by skopeo); return its reference. Small, so the tests that unpack
    many times stay fast."""
    return push_tars(registry, tmp, [_tar(entries) for entries in layers])


def push_tars(registry: Registry, tmp: Path, tars: Sequence[bytes]) -> str:
    """Push a new image whose layers are the uncompressed tars ``tars`` (bottom first, any
    content: the malicious layers of the unpack tests), gzipped deterministically (the same
    tar is the same blob, so two images share it); return its reference."""
    layout = tmp / uuid.uuid4().hex
    (layout / "blobs" / "sha256").mkdir(parents=True)

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in tars]
    config = {"architecture": arch, "os": "linux", "config": {},
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}  # fmt: skip
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [
            blob(gzip.compress(t, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
            for t in tars
        ],
    }
    top = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    ref = f"{registry.host}/layers-{uuid.uuid4().hex[:8]}:1"
    done = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                           f"oci:{layout}", f"docker://{ref}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"skopeo copy to {ref} failed: {done.stderr.strip()}")
    return ref


def concurrently(script: str, args: Sequence[str], one: Callable[[], None]) -> list[str]:
    """Run ``script`` (Python, with ``args``) in 2 processes while ``one`` runs in 8 threads
    of this one; the processes' standard outputs (each must exit 0)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                         env=env)
        for _ in range(2)
    ]  # fmt: skip
    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outputs = []
    for process in processes:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise AssertionError(f"the process running the script exited {process.returncode}")
        outputs.append(out)
    return outputs
