"""A fake veFaaS on loopback: the control-plane JSON API and an instance-routing gateway.

* Control plane: ``POST /?Action=<X>&Version=2024-06-06`` with the Volcengine SDK's JSON body,
  answering ``{"ResponseMetadata": {...}, "Result": {...}}`` or an ``Error`` with an HTTP status,
  for CreateSandbox, DescribeSandbox, ListSandboxes and KillSandbox. The request's signature is
  checked the way the service checks it (Volcengine's HMAC-SHA256 V4 scheme: canonical request
  over method, path, sorted query, the signed headers and the body's SHA-256; key derived from
  the secret key, date, region, service ``vefaas``): a wrong secret key, a changed body or a
  changed signed header is refused with 401 ``SignatureDoesNotMatch``. Implemented here from
  the scheme (https://www.volcengine.com/docs/6369/67269), not with the SDK's signer. Temporary
  (STS) credentials :data:`STS_AK`/:data:`STS_SK` are accepted only with their session token
  :data:`STS_TOKEN` in a signed ``X-Security-Token`` header (where volcenginesdkcore 5.0.54's
  ``SignerV4.sign`` puts ``Configuration.session_token``), else 401 ``InvalidSecurityToken``.
* Instances: ``CreateSandbox`` runs ``InstanceImageInfo.Command`` with ``/bin/sh -c`` in a
  bubblewrap jail of its own (private root, own PID namespace, ``Envs`` as environment,
  ``SANDLOT_SWEREX_PORT`` set to a free loopback port): with sandlot's bootstrap that is a real
  ``swerex.server`` process. The test interpreter is visible in the jail at its own path,
  read-only, but *not* on ``PATH`` (as ``local`` binds it): the image's ``python3`` has no
  swe-rex, so the bootstrap must be told where a server is (``swerex_python``, which
  :meth:`FakeVefaas.options` sets) or install one. ``KillSandbox`` is asynchronous, as on the
  service: the instance is ``Terminating`` until the jail is killed ``kill_delay_s`` later
  (everything in it dies), then ``Terminated``. An instance whose command exits is ``Failed``
  with ErrorCode ``StartCommandExited`` and an ErrorMessage with the exit status and the last
  output, which the backend does not retry (the same command exits again).
* Gateway: an HTTP proxy that requires ``x-faas-instance-name`` and forwards to that
  instance's server; unknown or dead instances get 502, as a gateway without a backend would,
  and so does an instance whose server is down (:meth:`FakeVefaas.server_down`: a restart of
  the SWE-ReX server, or its death while the control plane still says ``Running``). Only the
  server's answering stops: the instance's processes (its detached jobs) run on, as they do
  when a server that is not the instance's last process restarts.

``peak_starting`` is the most CreateSandbox calls seen in flight at once.

Fault knobs: ``throttle_rate`` (fraction of creates refused with 429 ``Throttling``),
``create_latency_s``, ``known_images`` (others: 400 ``InvalidImage``), ``kill_failures``
(KillSandbox answers 500 that many times first), ``gateway_failures`` (the next N proxied
requests answer 503), ``gateway_hangs`` (the next N proxied requests answer 504 after
``hang_s``, a hung gateway), ``page_cap`` (the service's maximum page size: ListSandboxes
pages hold at most this many rows, whatever ``PageSize`` asks), and per action,
:meth:`FakeVefaas.inject` (queued faults) and ``fault_rate`` (a random fault from
:data:`FAULTS` on that fraction of calls; :meth:`FakeVefaas.chaos` sets it for every action).
Faults:

* ``refused``: the connection is closed without an answer before the call is handled
  (nothing happens);
* ``timeout``: the call takes effect, then the answer comes after ``hang_s`` (past the
  client's read timeout);
* ``stall``: (CreateSandbox) the call waits ``hang_s`` *before* taking effect, then answers:
  the instance appears after the client gave up on the answer;
* ``blackhole``: the call is accepted and never answered (until :meth:`FakeVefaas.stop`), and
  takes no effect;
* ``dropped``: the call takes effect, then the connection is closed without an answer;
* ``429``: HTTP 429 ``Throttling``; ``500``: HTTP 500 ``InternalError``;
* ``error_body``: HTTP 200 whose ``ResponseMetadata.Error`` is ``RequestLimitExceeded``;
* ``no_id``: (CreateSandbox) the instance is created, the 200 carries no ``SandboxId``.

``ignore_filters``: ListSandboxes returns every sandbox of the function whatever ``Metadata``
asks for (a service whose filter is broken or unsupported must not make sandlot kill what is
not its own). ``gateway_blackholes``: the next N proxied requests are never answered.

:meth:`FakeVefaas.api_down` closes the control plane's listening socket (connection refused for
real) until :meth:`FakeVefaas.api_up`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import hmac
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
from urllib.parse import parse_qs, quote, urlparse

from fakes.jail import default_start, jail_argv, make_root

AK, SK = "fake-ak", "fake-sk"
STS_AK, STS_SK, STS_TOKEN = "fake-sts-ak", "fake-sts-sk", "fake-sts-session-token"
_SECRETS = {AK: SK, STS_AK: STS_SK}
FUNCTION_ID = "fn-sandlot-test"
VERSION = "2024-06-06"
SERVICE = "vefaas"
ACTIONS = ("CreateSandbox", "DescribeSandbox", "ListSandboxes", "KillSandbox")
_COMMON_FAULTS = ("refused", "timeout", "dropped", "429", "500", "error_body", "blackhole")
FAULTS: dict[str, tuple[str, ...]] = {
    "CreateSandbox": (*_COMMON_FAULTS, "no_id", "stall"),
    **{a: _COMMON_FAULTS for a in ("DescribeSandbox", "ListSandboxes", "KillSandbox")},
}
# The image's own PATH: the test interpreter is not on it.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Drop(Exception):
    """Close the connection without answering."""


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
    kill_requested: bool = False

    log: Path | None = None

    @property
    def status(self) -> str:
        if self.killed:
            return "Terminated"
        if self.kill_requested:
            return "Terminating"
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
        self.gateway_hangs = 0
        self.gateway_blackholes = 0
        self.ignore_filters = False
        # instance id -> monotonic time until which its SWE-ReX server does not answer
        self.server_down_until: dict[str, float] = {}
        self.gateway_requests: list[tuple[str, str]] = []  # (instance, path) of each request
        self._stopping = threading.Event()
        self.kill_delay_s = 0.05
        self.hang_s = 1.0
        self.page_cap: int | None = None
        self.faults: dict[str, list[str]] = {a: [] for a in ACTIONS}
        self.fault_rate: dict[str, float] = dict.fromkeys(ACTIONS, 0.0)
        self.faults_served: list[tuple[str, str]] = []
        self.rng = random.Random(4)
        self.starting = 0
        self.peak_starting = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.instances: dict[str, Instance] = {}
        self.lock = threading.Lock()
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-vefaas-"))
        self._servers: list[ThreadingHTTPServer] = []
        # Instances are spawned by one long-lived thread: bwrap's --die-with-parent is tied to
        # the spawning *thread*, and a request thread ends with its connection.
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spawner")

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeVefaas:
        self._api_server = self._serve(_ApiHandler, 0)
        self.api_port = int(self._api_server.server_address[1])
        self.gateway_port = int(self._serve(_GatewayHandler, 0).server_address[1])
        return self

    def _serve(self, handler: type[BaseHTTPRequestHandler], port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        server.daemon_threads = True
        server.fake = self  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return server

    def api_down(self) -> None:
        """Close the control plane's listening socket: connections are refused."""
        self._api_server.shutdown()
        self._api_server.server_close()
        self._servers.remove(self._api_server)

    def api_up(self) -> None:
        """Listen again on the same port."""
        self._api_server = self._serve(_ApiHandler, self.api_port)

    def stop(self) -> None:
        self._stopping.set()  # black-holed calls end
        for inst in self._instances():
            self._kill_instance(inst)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._spawner.shutdown()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def inject(self, action: str, *faults: str) -> None:
        """Queue ``faults`` (see the module docstring) for the next calls of ``action``."""
        assert action in ACTIONS and all(f in FAULTS[action] for f in faults), faults
        with self.lock:
            self.faults[action] += faults

    def server_down(self, sandbox_id: str, seconds: float = float("inf")) -> None:
        """The instance's SWE-ReX server stops answering for ``seconds`` (a restart), or for
        good (it died; the control plane still says ``Running``): the gateway answers 502."""
        with self.lock:
            self.server_down_until[sandbox_id] = time.monotonic() + seconds

    def black_hole(self) -> None:
        """Hold a request unanswered until the fake stops."""
        self._stopping.wait()
        raise _Drop

    def chaos(self, rate: float) -> None:
        """Let every action fail at random with probability ``rate``."""
        self.fault_rate = dict.fromkeys(ACTIONS, rate)

    def take_fault(self, action: str) -> str | None:
        with self.lock:
            if self.faults.get(action):
                fault = self.faults[action].pop(0)
            elif self.rng.random() < self.fault_rate.get(action, 0.0):
                fault = self.rng.choice(FAULTS[action])
            else:
                return None
            self.faults_served.append((action, fault))
            return fault

    def _instances(self) -> list[Instance]:
        """A snapshot: request threads insert while others iterate."""
        with self.lock:
            return list(self.instances.values())

    def leaked(self) -> list[Instance]:
        """Instances nobody asked to kill (an instance whose command exited counts too)."""
        return [i for i in self._instances() if not i.kill_requested]

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
            # The interpreter running the tests has swe-rex; it is not on the image's PATH.
            "swerex_python": sys.executable,
        }

    def live(self) -> list[Instance]:
        return [i for i in self._instances() if i.status == "Running"]

    def actions(self, name: str) -> list[dict[str, Any]]:
        return [body for action, body in self.calls if action == name]

    # ----------------------------------------------------------------- control plane

    def handle(self, action: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer one call, faults included; raises :class:`_Drop` to close without answer."""
        with self.lock:
            self.calls.append((action, body))
        handler = getattr(self, f"_{action}", None)
        if handler is None:
            return 400, _error("InvalidAction", f"unknown action {action}")
        fault = self.take_fault(action)
        if fault == "refused":
            raise _Drop
        if fault == "blackhole":
            self.black_hole()
        if fault == "stall":
            time.sleep(self.hang_s)
        if fault == "429":
            return 429, _error("Throttling", "request rate exceeded, slow down")
        if fault == "500":
            return 500, _error("InternalError", "internal error, try again")
        if fault == "error_body":
            return 200, _error("RequestLimitExceeded", "request limit exceeded")
        result: tuple[int, dict[str, Any]] = handler(body)
        if fault == "dropped":
            raise _Drop
        if fault == "timeout":
            time.sleep(self.hang_s)
        if fault == "no_id" and result[0] == 200:
            return 200, {}
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
            "PATH": IMAGE_PATH,
            "HOME": "/tmp",
            "SANDLOT_SWEREX_PORT": str(port),
            **{e["Key"]: e["Value"] for e in body.get("Envs") or []},
        }
        argv = jail_argv(root, network=True, own_pids=True, env=env)
        log_path = self.workdir / f"{sandbox_id}.log"
        with log_path.open("wb") as log:
            prefix, setup = default_start()
            process = self._spawner.submit(
                subprocess.Popen,
                [*prefix, *argv, "/bin/sh", "-c", info["Command"]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=setup,
            ).result()
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
        instances = self._instances()
        rows = [
            {
                "Id": i.id,
                "Status": i.status,
                "Metadata": i.metadata,
                "FunctionId": i.function_id,
                **i.failure(),
            }
            for i in instances
            if i.function_id == body.get("FunctionId")
            and (self.ignore_filters or all(i.metadata.get(k) == v for k, v in wanted.items()))
        ]
        size, page = int(body.get("PageSize") or 10), int(body.get("PageNumber") or 1)
        if self.page_cap is not None:  # the service's own maximum page size
            size = min(size, self.page_cap)
        return 200, {"Sandboxes": rows[(page - 1) * size : page * size], "Total": len(rows)}

    def _KillSandbox(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.take("kill_failures"):
            return 500, _error("InternalError", "kill failed, try again")
        inst = self.instances.get(body.get("SandboxId", ""))
        if inst is None or inst.killed:
            # An expired or killed sandbox is forgotten by the service.
            return 404, _error("ResourceNotFound.Sandbox", "no such sandbox")
        if not inst.kill_requested:
            inst.kill_requested = True
            timer = threading.Timer(self.kill_delay_s, self._kill_instance, (inst,))
            timer.daemon = True
            timer.start()
        return 200, {}

    def expire(self, inst: Instance) -> None:
        """The instance's lifetime ends: killed, then unknown to the service."""
        self._kill_instance(inst)

    def _kill_instance(self, inst: Instance) -> None:
        inst.kill_requested = True
        inst.killed = True
        if inst.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(inst.process.pid, signal.SIGKILL)
            inst.process.wait()
        shutil.rmtree(inst.root, ignore_errors=True)

    # ----------------------------------------------------------------- gateway

    def target_port(self, instance: str | None, path: str) -> int | None:
        """The port of ``instance``'s server, ``None`` while it cannot answer."""
        inst = self.instances.get(instance or "")
        with self.lock:
            self.gateway_requests.append((instance or "", path))
            down = time.monotonic() < self.server_down_until.get(instance or "", 0.0)
        return inst.port if inst is not None and inst.status == "Running" and not down else None

    def take(self, counter: str) -> bool:
        """Whether the counter attribute ``counter`` (``gateway_failures``, ...) was above 0;
        it is decremented."""
        with self.lock:
            left = getattr(self, counter)
            if left > 0:
                setattr(self, counter, left - 1)
            return left > 0


def _error(code: str, message: str) -> dict[str, Any]:
    return {"Error": {"Code": code, "Message": message}}


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signature_problem(
    method: str, path: str, query: str, headers: dict[str, str], body: bytes
) -> tuple[str, str] | None:
    """``(error code, why)`` when the request's ``Authorization`` does not verify with the
    secret key of its access key (:data:`SK`, or :data:`STS_SK` together with the session
    token :data:`STS_TOKEN` in a signed ``X-Security-Token``), or ``None``.

    Volcengine signature V4: ``Authorization: HMAC-SHA256 Credential=<ak>/<date>/<region>/
    <service>/request, SignedHeaders=<a;b>, Signature=<hex>`` over the canonical request
    ``method \n path \n sorted-encoded-query \n name:value\n per signed header \n
    signed-names \n sha256(body)``; string to sign ``HMAC-SHA256 \n X-Date \n scope \n
    sha256(canonical request)``; key ``HMAC(HMAC(HMAC(HMAC(sk, date), region), service),
    "request")``.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    auth = lower.get("authorization", "")
    if not auth.startswith("HMAC-SHA256 "):
        return "SignatureDoesNotMatch", "no HMAC-SHA256 Authorization header"
    try:
        parts = dict(p.strip().split("=", 1) for p in auth[len("HMAC-SHA256 ") :].split(","))
        ak, date, region, service, terminal = parts["Credential"].split("/")
        names = parts["SignedHeaders"].split(";")
        given = parts["Signature"]
    except (KeyError, ValueError):
        return "SignatureDoesNotMatch", "malformed Authorization header"
    if ak not in _SECRETS:
        return "InvalidAccessKey", f"unknown access key {ak}"
    if ak == STS_AK and (
        lower.get("x-security-token") != STS_TOKEN or "x-security-token" not in names
    ):
        return "InvalidSecurityToken", "temporary credentials need their signed X-Security-Token"
    if service != SERVICE or terminal != "request":
        return "SignatureDoesNotMatch", f"credential scope names service {service}"
    body_hash = hashlib.sha256(body).hexdigest()
    if lower.get("x-content-sha256") != body_hash:
        return "SignatureDoesNotMatch", "X-Content-Sha256 does not match the body"
    x_date = lower.get("x-date", "")
    if x_date[:8] != date:
        return "SignatureDoesNotMatch", "X-Date does not match the credential scope"
    if "x-date" not in names or "x-content-sha256" not in names:
        return "SignatureDoesNotMatch", "X-Date and X-Content-Sha256 must be signed"
    pairs = sorted(
        (quote(k, safe="-_.~"), quote(v[0], safe="-_.~")) for k, v in parse_qs(query).items()
    )
    canonical_query = "&".join(f"{k}={v}" for k, v in pairs)
    signed = ""
    for name in names:
        value = lower.get(name, "")
        if name == "host" and value.endswith((":80", ":443")):
            value = value.rsplit(":", 1)[0]
        signed += f"{name}:{value}\n"
    canonical = "\n".join(
        [method, path or "/", canonical_query, signed, ";".join(names), body_hash]
    )
    scope = f"{date}/{region}/{service}/request"
    to_sign = "\n".join(
        ["HMAC-SHA256", x_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(_hmac(_hmac(_hmac(_SECRETS[ak].encode(), date), region), service), "request")
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if hmac.compare_digest(expected, given):
        return None
    return "SignatureDoesNotMatch", "signature does not match"


class _ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake: FakeVefaas = self.server.fake  # type: ignore[attr-defined]
        url = urlparse(self.path)
        query = parse_qs(url.query)
        action = query.get("Action", [""])[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        problem = signature_problem("POST", url.path, url.query, dict(self.headers.items()), raw)
        if query.get("Version", [""])[0] != VERSION:
            status, result = 400, _error("InvalidVersion", "unsupported version")
        elif problem is not None:
            status, result = 401, _error(*problem)
        else:
            try:
                status, result = fake.handle(action, body)
            except _Drop:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
        meta: dict[str, Any] = {"RequestId": uuid.uuid4().hex, "Action": action, "Version": VERSION}
        if "Error" in result:
            meta["Error"] = result["Error"]
            payload = {"ResponseMetadata": meta}
        else:
            payload = {"ResponseMetadata": meta, "Result": result}
        data = json.dumps(payload).encode()
        with contextlib.suppress(OSError):  # the client may have given up (a read timeout)
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
        if fake.take("gateway_failures"):
            self._reply(503, "injected gateway failure")
            return
        if fake.take("gateway_blackholes"):
            with contextlib.suppress(_Drop):
                fake.black_hole()
            return
        if fake.take("gateway_hangs"):
            time.sleep(fake.hang_s)
            with contextlib.suppress(OSError):
                self._reply(504, "gateway timeout")
            return
        port = fake.target_port(instance, self.path)
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
