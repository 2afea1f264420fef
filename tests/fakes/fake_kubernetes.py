"""A fake Kubernetes API server on loopback, for the real client (``kubernetes_asyncio``).

It speaks the API's HTTP and websocket protocols, as far as sandlot's backend uses them:

* ``/api/v1/namespaces/{ns}/pods``: create (``POST``, the pod's JSON), list and watch (``GET``;
  ``labelSelector`` with ``k``, ``k=v``, ``k!=v``, ``!k``; ``fieldSelector`` on dotted paths;
  ``watch=true`` streams ``{"type", "object"}`` lines from ``resourceVersion`` (events kept
  for the last :data:`HISTORY` changes; older: an ``ERROR`` event with a 410 ``Status``), or,
  without one, ``ADDED`` for every pod first; ``timeoutSeconds`` ends it);
* ``/api/v1/namespaces/{ns}/pods/{name}``: read, patch (its labels), delete
  (``gracePeriodSeconds``: the pod gets
  a ``deletionTimestamp``, its processes SIGTERM, then SIGKILL after the grace, then it is
  gone);
* ``/api/v1/namespaces/{ns}/pods/{name}/exec``: the websocket of ``v5.channel.k8s.io`` (or
  ``v4``, :attr:`FakeKubernetes.v4_only`): channel 0 stdin, 1 stdout, 2 stderr, 3 the
  ``Status`` once the command ended (``Success``, or ``NonZeroExitCode`` with the code in
  ``details.causes``), v5's ``[255, 0]`` closes stdin; a pod that is not running is a 400
  before the upgrade;
* ``/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies`` and
  ``/apis/apps/v1/namespaces/{ns}/daemonsets``: create (409 ``AlreadyExists``), replace
  (``PUT``) and list.

Every request needs ``Authorization: Bearer`` :data:`TOKEN` (401 otherwise); errors are
``Status`` objects. Pods run as ``fakes.kube_node`` containers: a pod is ``Pending``
(``PodScheduled`` false with reason ``Unschedulable`` and the scheduler's message while
:attr:`FakeKubernetes.unschedulable` is set), scheduled after ``schedule_latency_s``, pulls
(an image not in ``known_images``: ``ErrImagePull``, then ``ImagePullBackOff``), then runs
its ``command`` as PID 1 and is ``Running`` and ``Ready``. ``activeDeadlineSeconds`` fails it
(``DeadlineExceeded``), PID 1's exit ends it, :meth:`FakeKubernetes.evict` evicts it (phase
``Failed``, reason ``Evicted``, its processes killed and its exec connections dropped).

Faults: ``lost_creates`` (the next N creates take effect, then the connection is closed
unanswered), ``dropped_watches`` (the next N watches close their connection unanswered after
the events they replay), ``fault_rate`` (that fraction of create, read, list, delete and exec
calls fail at random with one of :data:`FAULTS`: 500, 429, a connection closed before the
call took effect, or, for creates, after; and of watches, dropped), each served fault in
``faults_served``. ``peak_pending`` is the most pods seen ``Pending`` (not being deleted) at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import random
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

from fakes.kube_node import Container

TOKEN = "fake-kubernetes-token"
NAMESPACE = "sandlot"
HISTORY = 1000
FAULTS = ("500", "429", "refused", "lost")
T = TypeVar("T")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def matches(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    """Whether ``obj`` is selected by the label and field selectors (the API's syntax)."""
    have = obj["metadata"].get("labels") or {}
    for term in filter(None, (labels or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if have.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if have.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in have:
                return False
        elif term not in have:
            return False
    for term in filter(None, (fields or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if _field(obj, key) != value:
                return False
    return True


class Pod:
    """One pod: its JSON (``obj``) and, once scheduled, its container."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.container: Container | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def status(self) -> dict[str, Any]:
        return self.obj.setdefault("status", {})

    @property
    def running(self) -> bool:
        return self.status.get("phase") == "Running" and not self.deleting

    @property
    def deleting(self) -> bool:
        return bool(self.obj["metadata"].get("deletionTimestamp"))


class FakeKubernetes:
    """The fake cluster; :meth:`start` serves it on a thread of its own (its own event loop)."""

    def __init__(self, known_images: set[str] | None = None) -> None:
        self.known_images = known_images
        self.schedule_latency_s = 0.0
        self.pull_latency_s = 0.0
        self.unschedulable: str | None = None
        self.v4_only = False
        self.lost_creates = 0
        self.dropped_watches = 0
        self.fault_rate = 0.0
        self.faults_served: list[tuple[str, str]] = []
        self.rng = random.Random(11)
        self.pods: dict[tuple[str, str], Pod] = {}
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "networkpolicies": {},
            "daemonsets": {},
        }
        self.calls: list[tuple[str, str]] = []
        self.peak_pending = 0
        self.rv = 0
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-k8s-"))
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ----------------------------------------------------------------- serving

    def start(self) -> FakeKubernetes:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-kubernetes", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    async def _serve(self) -> None:
        self._changed = asyncio.Condition()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._dispatch)
        # The API server takes 1 MiB of headers and request line; aiohttp's default is 8 KiB.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, max_line_size=1 << 20, max_field_size=1 << 20
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``fn()`` on the server's loop from another thread; its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(30)

    def stop(self) -> None:
        if self._loop is None:
            return

        async def down() -> None:
            for pod in list(self.pods.values()):
                if pod.task is not None:
                    pod.task.cancel()
                if pod.container is not None:
                    pod.container.kill()
            if self._runner is not None:
                await self._runner.cleanup()

        with contextlib.suppress(Exception):
            self.call(down)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self) -> Path:
        """A kubeconfig file for this server (token auth, namespace :data:`NAMESPACE`)."""
        path = self.workdir / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.server}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": NAMESPACE},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def options(self) -> dict[str, Any]:
        """The backend options that point at this server."""
        return {"kubeconfig": str(self.kubeconfig()), "namespace": NAMESPACE}

    # ----------------------------------------------------------------- for tests

    def live(self) -> list[str]:
        """Names of the pods that exist and are not being deleted."""
        return [p.name for p in list(self.pods.values()) if not p.deleting]

    def pod(self, name: str) -> dict[str, Any]:
        """The JSON of pod ``name`` (any namespace)."""
        return next(p.obj for p in self.pods.values() if p.name == name)

    def evict(self, name: str, message: str = "The node was low on resource: memory.") -> None:
        """Evict pod ``name``: its processes killed, phase ``Failed``, reason ``Evicted``."""
        pod = next(p for p in self.pods.values() if p.name == name)

        async def evict() -> None:
            await self._end(pod, "Failed", reason="Evicted", message=message)

        self.call(evict)

    def lose_node(self, name: str) -> None:
        """Pod ``name``'s node stops answering: processes gone, phase ``Unknown``."""
        pod = next(p for p in self.pods.values() if p.name == name)

        async def lose() -> None:
            await self._end(pod, "Unknown", reason="NodeLost", message="node fake-node-1 lost")

        self.call(lose)

    # ----------------------------------------------------------------- events

    async def _changed_pod(self, kind: str, pod: Pod) -> None:
        self.rv += 1
        pod.obj["metadata"]["resourceVersion"] = str(self.rv)
        ns = pod.obj["metadata"]["namespace"]
        self.history.append((self.rv, ns, kind, json.loads(json.dumps(pod.obj))))
        del self.history[:-HISTORY]
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    def _fault(self, call: str) -> str | None:
        if self.fault_rate and self.rng.random() < self.fault_rate:
            fault = self.rng.choice(FAULTS if call == "create" else FAULTS[:3])
            if call != "watch":
                self.faults_served.append((call, fault))
            return fault
        return None

    # ----------------------------------------------------------------- HTTP

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        parts = request.match_info["path"].strip("/").split("/")
        self.calls.append((request.method, request.path))
        if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[2] == "namespaces":
            ns, kind, rest = parts[3], parts[4], parts[5:]
            if kind == "pods":
                return await self._pods(request, ns, rest)
        if parts[0] == "apis" and len(parts) in (6, 7) and parts[3] == "namespaces":
            return await self._objects(request, parts[5], parts[4])
        return _status(404, "NotFound", f"the server could not find {request.path}")

    async def _objects(self, request: web.Request, kind: str, ns: str) -> web.Response:
        store = self.objects.get(kind)
        if store is None:
            return _status(404, "NotFound", f"no resource {kind}")
        if request.method == "POST":
            obj = await request.json()
            key = (ns, obj["metadata"]["name"])
            if key in store:
                return _status(409, "AlreadyExists", f'{kind} "{key[1]}" already exists')
            obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
            store[key] = obj
            return web.json_response(obj, status=201)
        if request.method == "PUT":  # replace
            obj = await request.json()
            key = (ns, obj["metadata"]["name"])
            if key not in store:
                return _status(404, "NotFound", f'{kind} "{key[1]}" not found')
            obj["metadata"].update(namespace=ns, uid=store[key]["metadata"]["uid"])
            store[key] = obj
            return web.json_response(obj)
        items = [o for (n, _), o in store.items() if n == ns]
        return web.json_response({"kind": "List", "metadata": {}, "items": items})

    async def _pods(self, request: web.Request, ns: str, rest: list[str]) -> web.StreamResponse:
        method = request.method
        if not rest:
            if method == "POST":
                return await self._create(request, ns)
            if request.query.get("watch", "").lower() in ("true", "t", "1"):  # Go ParseBool
                return await self._watch(request, ns)
            return await self._list(request, ns)
        pod = self.pods.get((ns, rest[0]))
        if len(rest) == 2 and rest[1] == "exec":
            return await self._exec(request, pod, rest[0])
        fault = self._fault("read" if method == "GET" else "delete")
        if fault is not None:
            return self._serve_fault(request, fault)
        if pod is None:
            return _status(404, "NotFound", f'pods "{rest[0]}" not found')
        if method == "PATCH":  # merge and strategic merge agree on a labels map
            labels = ((await request.json()).get("metadata") or {}).get("labels") or {}
            have = pod.obj["metadata"].setdefault("labels", {})
            for key, value in labels.items():
                if value is None:
                    have.pop(key, None)
                else:
                    have[key] = value
            await self._changed_pod("MODIFIED", pod)
        if method == "DELETE":
            grace = request.query.get("gracePeriodSeconds")
            if grace is None and request.can_read_body:
                with contextlib.suppress(ValueError):
                    grace = (await request.json()).get("gracePeriodSeconds")
            await self._delete(pod, float(grace if grace is not None else 30))
        return web.json_response(pod.obj)

    def _serve_fault(self, request: web.Request, fault: str) -> web.Response:
        if fault in ("refused", "lost"):
            assert request.transport is not None
            request.transport.abort()  # nothing is answered
            return web.Response()
        code = int(fault)
        return _status(
            code, "TooManyRequests" if code == 429 else "InternalError", f"injected {fault}"
        )

    async def _create(self, request: web.Request, ns: str) -> web.Response:
        fault = self._fault("create")
        if fault not in (None, "lost"):
            return self._serve_fault(request, fault)
        obj = await request.json()
        name = obj["metadata"]["name"]
        if (ns, name) in self.pods:
            return _status(409, "AlreadyExists", f'pods "{name}" already exists')
        obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
        obj["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False"}],
        }
        pod = Pod(obj)
        self.pods[(ns, name)] = pod
        await self._changed_pod("ADDED", pod)
        pod.task = asyncio.get_running_loop().create_task(self._run(pod))
        pending = sum(
            1 for p in self.pods.values() if p.status.get("phase") == "Pending" and not p.deleting
        )
        self.peak_pending = max(self.peak_pending, pending)
        if fault == "lost" or self.lost_creates > 0:
            if fault is None:
                self.lost_creates -= 1
                self.faults_served.append(("create", "lost"))
            return self._serve_fault(request, "lost")
        return web.json_response(obj, status=201)

    async def _list(self, request: web.Request, ns: str) -> web.Response:
        fault = self._fault("list")
        if fault is not None:
            return self._serve_fault(request, fault)
        labels, fields = request.query.get("labelSelector"), request.query.get("fieldSelector")
        items = [
            p.obj
            for (n, _), p in list(self.pods.items())
            if n == ns and matches(p.obj, labels, fields)
        ]
        return web.json_response(
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, ns: str) -> web.StreamResponse:
        labels, fields = request.query.get("labelSelector"), request.query.get("fieldSelector")
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        since = request.query.get("resourceVersion") or "0"
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        seen = int(since)
        if seen == 0:
            for (n, _), p in list(self.pods.items()):
                if n == ns and matches(p.obj, labels, fields):
                    await send("ADDED", p.obj)
            seen = self.rv
        elif self.history and seen < self.history[0][0] - 1:
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 410,
                "reason": "Expired",
                "message": f"too old resource version: {seen}",
            }
            await send("ERROR", gone)
            return response
        if self.dropped_watches > 0 or self._fault("watch"):
            self.dropped_watches = max(0, self.dropped_watches - 1)
            self.faults_served.append(("watch", "dropped"))
            assert request.transport is not None
            request.transport.abort()
            return response
        changed = self._changed
        assert changed is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        async with changed:
            while True:
                for rv, n, kind, obj in list(self.history):
                    if rv > seen and n == ns and matches(obj, labels, fields):
                        await send(kind, obj)
                seen = self.rv
                left = end - loop.time()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except asyncio.TimeoutError:
                    break
        await response.write_eof()
        return response

    # ----------------------------------------------------------------- the kubelet

    async def _run(self, pod: Pod) -> None:
        """Schedule, pull, start; then wait for PID 1 (or the deadline) to end the pod."""
        status = pod.status
        while self.unschedulable is not None:
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": self.unschedulable,
                }
            ]
            await self._changed_pod("MODIFIED", pod)
            # The knob is set from the test's thread: polled, not an (unthreadsafe) Event.
            while self.unschedulable is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await asyncio.sleep(self.schedule_latency_s)
        spec = pod.obj["spec"]
        spec["nodeName"] = "fake-node-1"
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        container = spec["containers"][0]
        image = container["image"]
        waiting = {"reason": "ContainerCreating"}
        status["containerStatuses"] = [
            {
                "name": container["name"],
                "image": image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": waiting},
            }
        ]
        await self._changed_pod("MODIFIED", pod)
        await asyncio.sleep(self.pull_latency_s)
        if self.known_images is not None and image not in self.known_images:
            message = f'failed to pull and unpack image "{image}": not found'
            waiting.update(reason="ErrImagePull", message=message)
            await self._changed_pod("MODIFIED", pod)
            await asyncio.sleep(0.1)
            waiting.update(reason="ImagePullBackOff", message=f'Back-off pulling image "{image}"')
            await self._changed_pod("MODIFIED", pod)
            return
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        pod.container = Container(self.workdir, pod.obj["metadata"]["uid"], env)
        await pod.container.start(container["command"], network=self.networked(pod))
        deadline = spec.get("activeDeadlineSeconds")
        if deadline:
            pod.deadline = asyncio.get_running_loop().call_later(
                float(deadline),
                lambda: asyncio.ensure_future(
                    self._end(
                        pod,
                        "Failed",
                        reason="DeadlineExceeded",
                        message="Pod was active on the node longer than the specified deadline",
                    )
                ),
            )
        status.update(phase="Running", startTime=_now())
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True"},
        ]
        status["containerStatuses"][0].update(
            ready=True, started=True, state={"running": {"startedAt": _now()}}
        )
        await self._changed_pod("MODIFIED", pod)
        assert pod.container.init is not None
        code = await pod.container.init.wait()
        if not pod.deleting and pod.status.get("phase") == "Running":
            code = 128 - code if code < 0 else code
            await self._end(pod, "Succeeded" if code == 0 else "Failed", exit_code=code)

    def networked(self, pod: Pod) -> bool:
        """Whether no NetworkPolicy denying all egress selects the pod (read now)."""
        ns = pod.obj["metadata"]["namespace"]
        for (n, _), policy in self.objects["networkpolicies"].items():
            spec = policy.get("spec") or {}
            wanted = (spec.get("podSelector") or {}).get("matchLabels") or {}
            have = pod.obj["metadata"].get("labels") or {}
            if (
                n == ns
                and "Egress" in (spec.get("policyTypes") or [])
                and not spec.get("egress")
                and all(have.get(k) == v for k, v in wanted.items())
            ):
                return False
        return True

    async def _end(
        self,
        pod: Pod,
        phase: str,
        *,
        reason: str | None = None,
        message: str | None = None,
        exit_code: int = 137,
    ) -> None:
        """The pod's container is gone; the pod object stays (phase ``phase``)."""
        if pod.deadline is not None:
            pod.deadline.cancel()
        if pod.container is not None:
            pod.container.kill()
        if pod.status.get("phase") in ("Failed", "Succeeded"):
            return
        pod.status["phase"] = phase
        if reason:
            pod.status.update(reason=reason, message=message)
        for cs in pod.status.get("containerStatuses") or []:
            cs.update(
                ready=False,
                state={"terminated": {"exitCode": exit_code, "reason": reason or "Completed"}},
            )
        pod.status["conditions"] = [{"type": "Ready", "status": "False"}]
        await self._changed_pod("MODIFIED", pod)

    async def _delete(self, pod: Pod, grace_s: float) -> None:
        if pod.deleting:
            return
        pod.obj["metadata"]["deletionTimestamp"] = _now()
        pod.obj["metadata"]["deletionGracePeriodSeconds"] = int(grace_s)
        await self._changed_pod("MODIFIED", pod)

        async def finish() -> None:
            if pod.task is not None:
                pod.task.cancel()
            if pod.deadline is not None:
                pod.deadline.cancel()
            if pod.container is not None:
                await pod.container.stop(grace_s)
            self.pods.pop((pod.obj["metadata"]["namespace"], pod.name), None)
            await self._changed_pod("DELETED", pod)

        asyncio.get_running_loop().create_task(finish())

    # ----------------------------------------------------------------- exec

    async def _exec(self, request: web.Request, pod: Pod | None, name: str) -> web.StreamResponse:
        fault = self._fault("exec")
        if fault is not None:
            return self._serve_fault(request, fault)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if not pod.running or pod.container is None:
            return _status(400, "BadRequest", f'container not found ("{name}")')
        protocols = (
            ("v4.channel.k8s.io",) if self.v4_only else ("v5.channel.k8s.io", "v4.channel.k8s.io")
        )
        ws = web.WebSocketResponse(protocols=protocols, max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        container = pod.container
        container.sockets.add(ws)
        proc = await container.spawn(request.query.getall("command"), network=self.networked(pod))
        assert proc.stdin and proc.stdout and proc.stderr

        async def pump(stream: asyncio.StreamReader, channel: int) -> None:
            while chunk := await stream.read(64 * 1024):
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_bytes(bytes([channel]) + chunk)

        async def feed() -> None:
            assert proc.stdin is not None
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                channel, data = msg.data[0], msg.data[1:]
                if channel == 0:
                    proc.stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await proc.stdin.drain()
                elif channel == 255 and ws.ws_protocol == "v5.channel.k8s.io" and data == b"\0":
                    proc.stdin.close()
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the client went away: the process runs on

        feeder = asyncio.get_running_loop().create_task(feed())
        try:
            await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
            code = await proc.wait()
            code = 128 - code if code < 0 else code
            if code == 0:
                status: dict[str, Any] = {"metadata": {}, "status": "Success"}
            else:
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "reason": "NonZeroExitCode",
                    "message": f"command terminated with non-zero exit code: exit status {code}",
                    "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
                }
            if ws in container.sockets and not ws.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_bytes(b"\x03" + json.dumps(status).encode())
                    await ws.close()
        finally:
            feeder.cancel()
            container.sockets.discard(ws)
            container.release(proc)
        return ws
