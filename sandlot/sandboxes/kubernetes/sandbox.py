"""``KubernetesSandbox``: a sandbox in a pod of a Kubernetes cluster, one pod per sandbox.

Written against ``kubernetes_asyncio`` 36.1 (why not the official client:
:mod:`sandlot.sandboxes.kubernetes.client`), read in its source (``client/api/core_v1_api.py``,
``client/api/networking_v1_api.py``, ``stream/ws_client.py``, ``watch/watch.py``,
``config/kube_config.py``) and the API reference (https://kubernetes.io/docs/reference/
kubernetes-api/workload-resources/pod-v1/). Calls: ``CoreV1Api.create_namespaced_pod``,
``read_namespaced_pod``, ``list_namespaced_pod`` (also as a watch, ``watch.Watch().stream``,
with ``field_selector``, ``resource_version`` and ``timeout_seconds``),
``delete_namespaced_pod(grace_period_seconds=)``, ``connect_get_namespaced_pod_exec`` through
``WsApiClient`` with ``_preload_content=False`` (the websocket itself, spoken by
:mod:`~sandlot.sandboxes.kubernetes.exec_stream`) and
``NetworkingV1Api.create_namespaced_network_policy``.

Commands and sessions are :class:`~sandlot.sandboxes.shared.streamed_exec.StreamedExec`'s over
the exec websocket (a pods/exec has no environment parameter: the variables are put in front
of the argv with ``env``); files are execs too (``head -c`` both ways: a write needs no EOF on
stdin), and trees the base's tar over them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import anyio
from pydantic import BaseModel

from sandlot.errors import SandboxError, SandboxFileError, SandboxStartError
from sandlot.sandboxes.capped import CappedOutput, clip_tail
from sandlot.sandboxes.environment import EnvironmentRecipe
from sandlot.sandboxes.images import backend_image
from sandlot.sandboxes.kubernetes.client import (
    api_error,
    api_message,
    cluster,
    k8s,
    new_client,
    new_watch,
    status_of,
    transport_errors,
)
from sandlot.sandboxes.kubernetes.exec_stream import PROTOCOLS, ExecStream
from sandlot.sandboxes.kubernetes.manifest import (
    CONTAINER,
    NETWORK_LABEL,
    deny_all_policy,
    pod_manifest,
    run_selector,
    sandbox_tags,
)
from sandlot.sandboxes.kubernetes.options import KubernetesOptions
from sandlot.sandboxes.kubernetes.pod_status import (
    death,
    is_ready,
    start_failure,
    unschedulable,
)
from sandlot.sandboxes.labels import sandbox_labels
from sandlot.sandboxes.shared import remote_shell
from sandlot.sandboxes.shared.streamed_exec import Process, StreamedExec
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.transport import RemoteSandbox

log = logging.getLogger("sandlot.sandboxes.kubernetes")
T = TypeVar("T")

# A create whose answer was lost is sent again this many times: a 409 then means it was made.
_CREATE_SENDS = 3
# Namespaces whose deny-all NetworkPolicy this process has made (or found).
_policies: set[tuple[str | None, str | None, str]] = set()
# File moves: what `head -c` says when its path is a directory, missing or unwritable.
_WRITE_SCRIPT = '[ -d "$1" ] && { echo "Is a directory" >&2; exit 1; }; ' + (
    'mkdir -p -- "$(dirname -- "$1")" && head -c "$2" >"$1"'
)


class KubernetesSandbox(StreamedExec):
    """A pod whose PID 1 is sandlot's small init; commands run in it through ``pods/exec``.

    Args:
        spec: ``image`` is what the cluster pulls (``options.image_overrides`` first);
            ``cpu``/``memory_mb`` the container's requests and limits; ``timeout_s`` the pod's
            ``activeDeadlineSeconds``; ``network=False`` labels the pod for the namespace's
            deny-all NetworkPolicy (made on first use); ``network="internet"`` and ``disk_mb``
            are refused (see :class:`KubernetesOptions` ``ephemeral_storage_mb``); ``labels``
            plus the ``sandlot.*`` ones become labels (and annotations,
            :func:`~sandlot.sandboxes.kubernetes.manifest.split_tags`).
        options: :class:`KubernetesOptions`.

    Raises (from ``start``):
        BackendUnavailableError: ``kubernetes_asyncio`` missing, or no kubeconfig.
        SandboxStartError: the image cannot be pulled (not retryable), the pod cannot be
            scheduled, was evicted or did not become ready in time (retryable), the API
            refused (retryable for 429/5xx).
    """

    name: ClassVar[str] = "kubernetes"
    Options: ClassVar[type[KubernetesOptions]] = KubernetesOptions
    options: KubernetesOptions
    network_modes: ClassVar[tuple[bool | str, ...]] = (False, True)
    supports_snapshot: ClassVar[bool] = False
    # The argv travels in the exec's query string: longer commands go through a file.
    argv_command_bytes: ClassVar[int | None] = 16 * 1024

    def __init__(self, spec: SandboxSpec | None = None, options: BaseModel | None = None) -> None:
        super().__init__(spec, options)
        self._api: Any = None
        self._ws: Any = None
        self._pod: str | None = None
        self._namespace = ""  # resolved by _clients (options, kubeconfig context, pod)
        self._attempts = 0

    @property
    def pod_name(self) -> str | None:
        """The name of the current pod once a create was sent, else ``None``."""
        return self._pod

    backend_id = pod_name  # what leak reports name and `sandlot gc --leaked` matches

    # ----------------------------------------------------------------- clients

    async def _clients(self) -> Any:
        """The ``CoreV1Api`` of this sandbox (its two aiohttp sessions made on first use)."""
        sdk = k8s()
        if self._api is None:
            where = await cluster(self.options)
            self._namespace = where.namespace
            self._api = new_client(where.config)
            self._ws = new_client(where.config, websocket=True)
        return sdk.client.CoreV1Api(self._api)

    async def _drop_clients(self) -> None:
        for client in (self._api, self._ws):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        self._api = self._ws = None

    async def _control(
        self, what: str, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any
    ) -> T:
        """``await fn(*args, **kw)`` cut at ``create_timeout_s``; a failure as
        :func:`~sandlot.sandboxes.kubernetes.client.api_error`'s ``SandboxError``."""
        limit = self.options.create_timeout_s
        try:
            with anyio.fail_after(limit):
                return await fn(*args, _request_timeout=limit, **kw)
        except transport_errors() as exc:
            raise api_error(f"sandbox {self.id}: {what}", exc) from exc

    # ----------------------------------------------------------------- sandlot gc

    @classmethod
    def _reaper_context(cls, options: KubernetesOptions) -> KubernetesOptions:
        """The options (the clients are made per listing, on the caller's event loop).

        Raises:
            BackendUnavailableError: ``kubernetes_asyncio`` is not installed.
        """
        k8s()
        return options

    @classmethod
    async def _list_labelled(
        cls, context: KubernetesOptions, run_id: str | None
    ) -> list[RemoteSandbox]:
        """The namespace's pods matching the label selector ``sandlot.run_id[=run_id]``, pods
        being deleted left out; each row's labels are its labels and annotations."""
        sdk = k8s()
        where = await cluster(context)
        async with new_client(where.config) as api:
            pods = await sdk.client.CoreV1Api(api).list_namespaced_pod(
                where.namespace,
                label_selector=run_selector(run_id),
                _request_timeout=context.create_timeout_s,
            )
            rows = [api.sanitize_for_serialization(p) for p in pods.items]
        return [
            RemoteSandbox(
                "kubernetes",
                row["metadata"]["name"],
                sandbox_tags(row["metadata"]),
                (row.get("status") or {}).get("phase", ""),
            )
            for row in rows
            if not row["metadata"].get("deletionTimestamp")
        ]

    @classmethod
    async def _kill_listed(cls, context: KubernetesOptions, sandbox: RemoteSandbox) -> None:
        """Delete the pod (``gracePeriodSeconds`` = ``delete_grace_s``); gone already is fine."""
        sdk = k8s()
        where = await cluster(context)
        async with new_client(where.config) as api:
            try:
                await sdk.client.CoreV1Api(api).delete_namespaced_pod(
                    sandbox.id,
                    where.namespace,
                    grace_period_seconds=context.delete_grace_s,
                    _request_timeout=context.create_timeout_s,
                )
            except sdk.client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise

    # ----------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        spec, opts = self.spec, self.options
        core = await self._clients()
        if spec.network is False:
            await self._ensure_policy()
        image = backend_image(spec.image, "kubernetes", opts.image_overrides)
        self._attempts += 1
        self._pod = f"{self.id}-{self._attempts}"
        tags = sandbox_labels(self.id, spec.labels)
        offline = spec.network is False and not self._online_install
        manifest = pod_manifest(self._pod, image, spec, opts, tags, offline=offline)
        created = time.monotonic()
        try:
            await self._create(core, manifest)
            await self._wait_ready(core, image, created)
            self._ends_at = created + max(1, math.ceil(spec.timeout_s))
            # The STARTING slot is held until a command works.
            if await self._run_quiet(remote_shell.mkdir_argv(spec.workdir)) != 0:
                raise SandboxStartError(f"sandbox {self.id}: cannot create workdir {spec.workdir}")
        except BaseException:
            # A pod that failed to start stays Pending on the cluster until it is deleted: one
            # delete now, while the STARTING slot is still held, so that the next attempts do
            # not put more than the cap in Pending (the base's clean-up of the attempt, after
            # the slot, tries again if this one fails).
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(self.options.delete_grace_s + 10),
                contextlib.suppress(Exception),
            ):
                await self._delete_pod(core)
            raise

    @property
    def _online_install(self) -> bool:
        """Whether the pod gets the network for its environment install only (a spec without
        network whose recipe installs packages)."""
        recipe = self.spec.environment
        return bool(not self.spec.network and recipe is not None and recipe.has_packages)

    async def _install_environment(self, recipe: EnvironmentRecipe) -> None:
        """The recipe's container script, run in the pod with the network; then, for a spec
        without network, the pod is labelled for the deny-all NetworkPolicy (a strategic merge
        patch of its labels). The network plugin applies a policy to a relabelled pod within
        moments, not before the patch returns: docs/kubernetes.md.

        Raises:
            SandboxSetupError: the script failed.
            SandboxError: the label could not be patched.
        """
        await super()._install_environment(recipe)
        if self._online_install:
            core = await self._clients()
            patch = {"metadata": {"labels": {NETWORK_LABEL: "none"}}}
            await self._control(
                "label the pod offline",
                core.patch_namespaced_pod,
                self._pod,
                self._namespace,
                patch,
            )

    async def _ensure_policy(self) -> None:
        """Create the namespace's deny-all NetworkPolicy once per process (409: it exists)."""
        opts = self.options
        key = (opts.kubeconfig, opts.context, self._namespace)
        if key in _policies:
            return
        sdk = k8s()
        net = sdk.client.NetworkingV1Api(self._api)
        try:
            with anyio.fail_after(opts.create_timeout_s):
                await net.create_namespaced_network_policy(
                    self._namespace, deny_all_policy(), _request_timeout=opts.create_timeout_s
                )
        except transport_errors() as exc:
            status = status_of(exc)
            if status == 403:
                raise SandboxStartError(
                    f"network=False needs the NetworkPolicy {deny_all_policy()['metadata']['name']}"
                    f" in namespace {self._namespace}, and creating it was forbidden "
                    f"({api_message(exc)}): apply it once as docs/kubernetes.md shows",
                    retryable=False,
                ) from exc
            if status != 409:
                raise SandboxStartError(
                    f"sandbox {self.id}: creating the deny-all NetworkPolicy: {api_message(exc)}",
                    retryable=api_error("", exc).retryable,
                ) from exc
        _policies.add(key)

    async def _create(self, core: Any, manifest: dict[str, Any]) -> None:
        """POST the pod; a send whose answer was lost is sent again, and its 409 means the lost
        one made it (the name is this attempt's own)."""
        lost: SandboxError | None = None
        for _ in range(_CREATE_SENDS):
            try:
                await self._control(
                    "create pod", core.create_namespaced_pod, self._namespace, manifest
                )
                return
            except SandboxError as exc:
                cause = exc.__cause__
                if cause is not None and status_of(cause) == 409 and lost is not None:
                    return  # the lost send created it
                if cause is None or status_of(cause) is not None or not exc.retryable:
                    raise SandboxStartError(str(exc), retryable=exc.retryable) from exc
                lost = exc
        assert lost is not None
        raise SandboxStartError(str(lost), retryable=True) from lost

    async def _wait_ready(self, core: Any, image: str, created: float) -> None:
        """Until the pod is Running and ready: read it, then watch it from the read's
        ``resourceVersion`` (``timeoutSeconds``); a watch that ends, drops or is too old (410)
        is followed by a new read. Within ``ready_timeout_s`` (and the base's start budget).

        Raises:
            SandboxStartError: classified (:func:`~sandlot.sandboxes.kubernetes.pod_status.
                start_failure`), or not ready in time (retryable).
        """
        opts = self.options
        deadline = created + opts.ready_timeout_s
        unschedulable_since: float | None = None

        def check(pod: dict[str, Any]) -> bool:
            nonlocal unschedulable_since
            failure = start_failure(pod, image)
            if failure is not None:
                raise failure
            message = unschedulable(pod)
            if message is None:
                unschedulable_since = None
            else:
                unschedulable_since = unschedulable_since or time.monotonic()
                if time.monotonic() - unschedulable_since >= opts.unschedulable_timeout_s:
                    raise SandboxStartError(
                        f"pod {self._pod} cannot be scheduled: {message}", retryable=True
                    )
            return is_ready(pod)

        while time.monotonic() < deadline:
            read = await self._read_pod(core)
            if read is None:
                raise SandboxStartError(f"pod {self._pod} vanished while starting", retryable=True)
            if check(read):
                return
            left = min(deadline - time.monotonic(), opts.watch_timeout_s)
            if unschedulable_since is not None:  # no event may come: look again in time
                patience = unschedulable_since + opts.unschedulable_timeout_s
                left = min(left, patience - time.monotonic())
            left = max(1, math.ceil(left))
            watch = new_watch()
            try:
                async for event in watch.stream(
                    core.list_namespaced_pod,
                    self._namespace,
                    field_selector=f"metadata.name={self._pod}",
                    resource_version=read["metadata"]["resourceVersion"],
                    timeout_seconds=left,
                    _request_timeout=left + opts.create_timeout_s,
                ):
                    if event["type"] == "DELETED":
                        raise SandboxStartError(
                            f"pod {self._pod} was deleted while starting", retryable=True
                        )
                    if check(event["raw_object"]):
                        return
            except transport_errors() as exc:  # dropped, or 410 Gone: read again
                log.debug("sandbox %s: watch of %s ended: %s", self.id, self._pod, api_message(exc))
            finally:
                with contextlib.suppress(Exception):
                    await watch.close()
        raise SandboxStartError(
            f"pod {self._pod} was not ready within ready_timeout_s={opts.ready_timeout_s:g} s",
            retryable=True,
        )

    async def _read_pod(self, core: Any) -> dict[str, Any] | None:
        """The pod as JSON, ``None`` when it does not exist.

        Raises:
            SandboxError: the API failed (retryable for transient faults).
        """
        try:
            pod = await self._control(
                "read pod", core.read_namespaced_pod, self._pod, self._namespace
            )
        except SandboxError as exc:
            if exc.__cause__ is not None and status_of(exc.__cause__) == 404:
                return None
            raise
        return dict(self._api.sanitize_for_serialization(pod))

    async def _close(self) -> None:
        """Delete the pod (``gracePeriodSeconds`` = ``delete_grace_s``; 404 is fine), then
        close the clients; ``close`` tries again on a retryable failure, then reports."""
        try:
            if self._pod is not None:
                await self._delete_pod(await self._clients())
        finally:
            await self._drop_clients()

    async def _delete_pod(self, core: Any) -> None:
        """Delete the pod, if any (``gracePeriodSeconds`` = ``delete_grace_s``; 404 is fine).

        Raises:
            SandboxError: the API failed (retryable).
        """
        if self._pod is None:
            return
        try:
            await self._control(
                "delete pod",
                core.delete_namespaced_pod,
                self._pod,
                self._namespace,
                grace_period_seconds=self.options.delete_grace_s,
            )
        except SandboxError as exc:
            if exc.__cause__ is None or status_of(exc.__cause__) != 404:
                raise SandboxError(str(exc), retryable=True) from exc
        self._pod = None

    async def _probe(self) -> str | None:
        """Why the pod cannot run commands (deleted, evicted, node lost, ended), else
        ``None`` (also when the API does not answer)."""
        if self._pod is None:
            return "its pod was deleted"
        try:
            core = await self._clients()
            pod = await self._read_pod(core)
        except Exception:  # cannot tell
            return None
        return f"pod {self._pod} was deleted" if pod is None else death(pod)

    async def _call(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``; a failure of the API or of the websocket becomes
        ``SandboxDeadError`` when the pod is gone, else a retryable ``SandboxError``."""
        try:
            return await fn(*args)
        except SandboxError as exc:
            dead = await self._gone()
            if dead is None:
                raise
            raise dead from exc
        except transport_errors() as exc:
            raise await self._gone() or api_error(f"sandbox {self.id}: {what}", exc) from exc

    # ----------------------------------------------------------------- commands

    async def _spawn(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Process:
        """Open ``pods/exec`` (stdin, stdout, stderr; no TTY) on ``env NAME=VALUE... argv``.
        The kubelet has no exec timeout: ``timeout`` is enforced by the caller's kill."""
        await self._clients()
        sdk = k8s()
        command = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv
        api = sdk.client.CoreV1Api(self._ws)
        ws = await api.connect_get_namespaced_pod_exec(
            self._pod,
            self._namespace,
            command=command,
            container=CONTAINER,
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            _headers={"sec-websocket-protocol": PROTOCOLS},
        )
        return ExecStream(await ws)

    # ----------------------------------------------------------------- files

    async def _file(
        self, what: str, path: str, argv: list[str], data: bytes | None, cap: int
    ) -> bytes:
        out = CappedOutput(cap)
        proc = await self._call("exec", self._spawn, argv, {}, None)
        try:
            code = await self._drive(proc, data, out)
        finally:
            proc.close()
        if code != 0:
            detail = clip_tail(bytes(out.stderr)) or f"exit code {code}"
            raise SandboxFileError(f"{what} {path}: {detail}")
        return bytes(out.stdout)

    async def _put_bytes(self, path: str, data: bytes) -> None:
        """``head -c <size> >path`` fed ``data`` (parents created)."""
        argv = ["/bin/sh", "-c", _WRITE_SCRIPT, "sandlot", path, str(len(data))]
        await self._file("write_file", path, argv, data, 64 * 1024)

    async def _get_bytes(self, path: str, max_bytes: int) -> bytes:
        """``head -c <max_bytes + 1> path``."""
        argv = ["head", "-c", str(max_bytes + 1), "--", path]
        return await self._file("read_file", path, argv, None, max_bytes + 1)
