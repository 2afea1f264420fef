"""A fake veFaaS on loopback: the control-plane JSON API and an instance-routing gateway.

* Control plane: ``POST /?Action=<X>&Version=2024-06-06`` with the Volcengine SDK's JSON body
  and ``HMAC-SHA256 Credential=<ak>/...`` signature header, answering
  ``{"ResponseMetadata": {...}, "Result": {...}}`` or an ``Error`` with an HTTP status, for
  CreateSandbox, DescribeSandbox, ListSandboxes and KillSandbox.
* Instances: ``CreateSandbox`` runs ``InstanceImageInfo.Command`` with ``/bin/sh -c`` in a
  bubblewrap jail of its own (private root, own PID namespace, ``Envs`` as environment,
  ``SANDLOT_SWEREX_PORT`` set to a free loopback port): with sandlot's bootstrap that is a real
  ``swerex.server`` process, run by the interpreter running the tests. ``KillSandbox`` kills the
  jail (everything in it dies). An instance whose command exits is ``Failed`` with ErrorCode
  ``StartCommandExited`` and an ErrorMessage with the exit status and the last output, which
  the backend does not retry (the same command exits again).
* Gateway: an HTTP proxy that requires ``x-faas-instance-name`` and forwards to that
  instance's server; unknown or dead instances get 502, as a gateway without a backend would.

``peak_starting`` is the most CreateSandbox calls seen in flight at once.

Fault knobs: ``throttle_rate`` (fraction of creates refused with 429 ``Throttling``),
``create_latency_s``, ``known_images`` (others: 400 ``InvalidImage``), ``kill_failures``
(KillSandbox answers 500 that many times first), ``gateway_failures`` (the next N proxied
requests answer 503).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from fakes.jail import jail_argv, make_root

AK, SK = "fake-ak", "fake-sk"
FUNCTION_ID = "fn-sandlot-test"
VERSION = "2024-06-06"


_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port that is free now and stays free until the instance binds it.

    Ports are drawn below the kernel's ephemeral range: an ephemeral port can be taken by any
    outgoing connection of the test run in the moment between this check and the bind of the
    SWE-ReX server, which made instances fail to start at random.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randint(max(1024, low - 12000), low - 1)
        with _PORTS_LOCK:
            # Concurrent creates must not both pick a port that none of them has bound yet.
            if port in _HANDED_OUT:
                continue
            _HANDED_OUT.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


@dataclass
class Instance:
    id: str
    function_id: str
    image: str
    metadata: dict[str, str]
    port: int
    root: Path
    process: subprocess.Popen[bytes]
    created_at: float = field(default_factory=time.time)
    killed: bool = False

    log: Path | None = None

    @property
    def status(self) -> str:
        if self.killed:
            return "Terminated"
        return "Running" if self.process.poll() is None else "Failed"

    def failure(self) -> dict[str, str]:
        """``ErrorCode``/``ErrorMessage`` of a ``Failed`` instance (its command exited), else {}."""
        if self.status != "Failed":
            return {}
        tail = ""
        if self.log is not None:
            with contextlib.suppress(OSError):
                tail = self.log.read_bytes()[-600:].decode(errors="replace").strip()
        message = f"the start command exited with status {self.process.returncode}"
        return {
            "ErrorCode": "StartCommandExited",
            "ErrorMessage": f"{message}; last output: {tail}" if tail else message,
        }


class FakeVefaas:
    """Both servers, started by :meth:`start`, stopped (every instance killed) by :meth:`stop`."""

    def __init__(self, known_images: set[str] | None = None) -> None:
        self.known_images = known_images
        self.throttle_rate = 0.0
        self.create_latency_s = 0.0
        self.kill_failures = 0
        self.gateway_failures = 0
        self.rng = random.Random(4)
        self.starting = 0
        self.peak_starting = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.instances: dict[str, Instance] = {}
        self.lock = threading.Lock()
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-vefaas-"))
        self._servers: list[ThreadingHTTPServer] = []

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeVefaas:
        self.api_port = self._serve(_ApiHandler)
        self.gateway_port = self._serve(_GatewayHandler)
        return self

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> int:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.fake = self  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return int(server.server_address[1])

    def stop(self) -> None:
        for inst in list(self.instances.values()):
            self._kill_instance(inst)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.api_port}"

    @property
    def route(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def options(self) -> dict[str, Any]:
        """``VefaasOptions`` fields pointing the backend at this fake."""
        return {
            "access_key": AK,
            "secret_key": SK,
            "function_id": FUNCTION_ID,
            "function_route": self.route,
            "endpoint": self.endpoint,
            "scheme": "http",
            "ready_timeout_s": 60.0,
        }

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.status == "Running"]

    def actions(self, name: str) -> list[dict[str, Any]]:
        return [body for action, body in self.calls if action == name]

    # ----------------------------------------------------------------- control plane

    def handle(self, action: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((action, body))
        handler = getattr(self, f"_{action}", None)
        if handler is None:
            return 400, _error("InvalidAction", f"unknown action {action}")
        result: tuple[int, dict[str, Any]] = handler(body)
        return result

    def _CreateSandbox(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.starting += 1
            self.peak_starting = max(self.peak_starting, self.starting)
        try:
            return self._create(body)
        finally:
            with self.lock:
                self.starting -= 1

    def _create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        time.sleep(self.create_latency_s)
        with self.lock:
            throttled = self.rng.random() < self.throttle_rate
        if throttled:
            return 429, _error("Throttling", "request rate exceeded, slow down")
        if body.get("FunctionId") != FUNCTION_ID:
            return 404, _error("ResourceNotFound.Function", f"function {body.get('FunctionId')}")
        info = body["InstanceImageInfo"]
        if self.known_images is not None and info["Image"] not in self.known_images:
            return 400, _error("InvalidImage", f"image {info['Image']} not found")
        sandbox_id = f"sb-{uuid.uuid4().hex[:16]}"
        port = free_port()
        root = make_root(self.workdir, sandbox_id)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "SANDLOT_SWEREX_PORT": str(port),
            **{e["Key"]: e["Value"] for e in body.get("Envs") or []},
        }
        argv = jail_argv(root, network=True, own_pids=True, env=env)
        log_path = self.workdir / f"{sandbox_id}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*argv, "/bin/sh", "-c", info["Command"]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        inst = Instance(
            sandbox_id, FUNCTION_ID, info["Image"], body.get("Metadata") or {}, port, root, process
        )
        inst.log = log_path
        with self.lock:
            self.instances[sandbox_id] = inst
        return 200, {"SandboxId": sandbox_id}

    def _DescribeSandbox(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        inst = self.instances.get(body.get("SandboxId", ""))
        if inst is None:
            return 404, _error("ResourceNotFound.Sandbox", "no such sandbox")
        metadata = [{"MetaKey": k, "MetaValue": v} for k, v in inst.metadata.items()]
        return 200, {
            "Id": inst.id,
            "Status": inst.status,
            "MetadataList": metadata,
            **inst.failure(),
        }

    def _ListSandboxes(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        wanted = body.get("Metadata") or {}
        rows = [
            {
                "Id": i.id,
                "Status": i.status,
                "Metadata": i.metadata,
                "FunctionId": i.function_id,
                **i.failure(),
            }
            for i in self.instances.values()
            if i.function_id == body.get("FunctionId")
            and all(i.metadata.get(k) == v for k, v in wanted.items())
        ]
        size, page = int(body.get("PageSize") or 10), int(body.get("PageNumber") or 1)
        return 200, {"Sandboxes": rows[(page - 1) * size : page * size], "Total": len(rows)}

    def _KillSandbox(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.kill_failures > 0:
                self.kill_failures -= 1
                return 500, _error("InternalError", "kill failed, try again")
        inst = self.instances.get(body.get("SandboxId", ""))
        if inst is None:
            return 404, _error("ResourceNotFound.Sandbox", "no such sandbox")
        self._kill_instance(inst)
        return 200, {}

    def _kill_instance(self, inst: Instance) -> None:
        inst.killed = True
        if inst.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(inst.process.pid, signal.SIGKILL)
            inst.process.wait()
        shutil.rmtree(inst.root, ignore_errors=True)

    # ----------------------------------------------------------------- gateway

    def target_port(self, instance: str | None) -> int | None:
        inst = self.instances.get(instance or "")
        return inst.port if inst is not None and inst.status == "Running" else None

    def take_gateway_failure(self) -> bool:
        with self.lock:
            if self.gateway_failures > 0:
                self.gateway_failures -= 1
                return True
        return False


def _error(code: str, message: str) -> dict[str, Any]:
    return {"Error": {"Code": code, "Message": message}}


class _ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake: FakeVefaas = self.server.fake  # type: ignore[attr-defined]
        query = parse_qs(urlparse(self.path).query)
        action = query.get("Action", [""])[0]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        auth = self.headers.get("Authorization", "")
        if query.get("Version", [""])[0] != VERSION:
            status, result = 400, _error("InvalidVersion", "unsupported version")
        elif not auth.startswith(f"HMAC-SHA256 Credential={AK}/"):
            status, result = 401, _error("InvalidAccessKey", "bad signature")
        else:
            status, result = fake.handle(action, body)
        meta: dict[str, Any] = {"RequestId": uuid.uuid4().hex, "Action": action, "Version": VERSION}
        if "Error" in result:
            meta["Error"] = result["Error"]
            payload = {"ResponseMetadata": meta}
        else:
            payload = {"ResponseMetadata": meta, "Result": result}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _forward(self) -> None:
        fake: FakeVefaas = self.server.fake  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        instance = self.headers.get("x-faas-instance-name")
        if not instance:
            self._reply(400, "missing x-faas-instance-name header")
            return
        if fake.take_gateway_failure():
            self._reply(503, "injected gateway failure")
            return
        port = fake.target_port(instance)
        if port is None:
            self._reply(502, f"no running instance {instance}")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            upstream = conn.getresponse()
            data = upstream.read()
        except OSError as exc:
            self._reply(502, f"instance {instance} unreachable: {exc}")
            return
        finally:
            conn.close()
        self.send_response(upstream.status)
        for key, value in upstream.getheaders():
            if key.lower() not in (
                "content-length",
                "transfer-encoding",
                "connection",
                "date",
                "server",
            ):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _forward
    do_POST = _forward
