"""The Kubernetes client of the ``kubernetes`` backend: ``kubernetes_asyncio`` (imported lazily,
``pip install 'sandlot[kubernetes]'``), its configuration and the translation of its errors.

``kubernetes_asyncio`` rather than the official ``kubernetes`` package: sandlot is asyncio
throughout and runs hundreds of sandboxes per process, each with commands and sessions
streaming at once. The official client is synchronous (urllib3; its exec is a
``websocket-client`` socket read by a blocking loop), so every call and every open exec
stream would hold a worker thread; the asyncio port is the same generated API (same models,
same kubeconfig and in-cluster loading) over aiohttp, whose websocket lets the backend speak
``v5.channel.k8s.io`` itself (:mod:`sandlot.sandboxes.kubernetes.exec_stream`).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio

from sandlot._optional import require
from sandlot.errors import BackendUnavailableError, SandboxError
from sandlot.sandboxes.kubernetes.options import KubernetesOptions

# Statuses another attempt may get past: throttled, server trouble, gateway trouble.
_TRANSIENT = {429, 500, 502, 503, 504}
_POD_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def k8s() -> ModuleType:
    """The ``kubernetes_asyncio`` package.

    Raises:
        BackendUnavailableError: not installed (names the extra).
    """
    return require("kubernetes_asyncio", "kubernetes")


class _RestSSL:
    """The ``ssl`` module as ``kubernetes_asyncio.client.rest`` sees it (:func:`new_client`,
    :func:`new_watch`).

    Its ``RESTClientObject`` makes an SSL context per client (a ``Watch`` makes a client of its
    own), and ``create_default_context`` parses the system's CA bundle each time (~30 ms of
    CPU, the event loop blocked): with two clients per sandbox, a watch per wait and hundreds of
    sandboxes starting, many seconds. While this thread is in :func:`new_client` or
    :func:`new_watch`, the context of the configuration's TLS settings is made once and handed
    out again (the client then applies the same settings to it: the key is every setting it
    reads); any other caller gets a new one, as before.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(ssl, name)

    def create_default_context(self, *args: Any, **kw: Any) -> ssl.SSLContext:
        key = getattr(_building, "key", None)
        if key is None:
            return ssl.create_default_context(*args, **kw)
        key = (key, args, tuple(sorted(kw.items())))
        context = _ssl_contexts.get(key)
        if context is None:
            context = _ssl_contexts[key] = ssl.create_default_context(*args, **kw)
        return context


_building = threading.local()
_ssl_contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}


@contextlib.contextmanager
def _shared_ssl(config: Any) -> Iterator[None]:
    rest = k8s().client.rest
    if not isinstance(rest.ssl, _RestSSL):
        rest.ssl = _RestSSL()
    _building.key = tuple(
        getattr(config, name, None)
        for name in (
            "ssl_ca_cert",
            "cert_file",
            "key_file",
            "verify_ssl",
            "disable_strict_ssl_verification",
        )
    )
    try:
        yield
    finally:
        _building.key = None


def new_client(config: Any, *, websocket: bool = False) -> Any:
    """A new ``ApiClient`` (``websocket``: ``WsApiClient``) of ``config``, its SSL context
    shared with the other clients of the same TLS settings (see :class:`_RestSSL`)."""
    sdk = k8s()
    with _shared_ssl(config):
        return (sdk.stream.WsApiClient if websocket else sdk.client.ApiClient)(config)


def new_watch() -> Any:
    """A new ``watch.Watch`` (it makes an ``ApiClient`` of the default configuration, for
    decoding events), its SSL context shared likewise."""
    sdk = k8s()
    with _shared_ssl(sdk.client.Configuration.get_default_copy()):
        return sdk.watch.Watch()


def transport_errors() -> tuple[type[BaseException], ...]:
    """What a call raises when the API server could not be reached or answered badly."""
    import aiohttp

    return (k8s().client.exceptions.ApiException, aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True)
class Cluster:
    """Where a backend's calls go.

    Attributes:
        config: the client's ``Configuration`` (server, credentials).
        namespace: ``options.namespace``, else the kubeconfig context's namespace, else (in a
            pod) its own namespace, else ``default``: where ``kubectl`` would look.
    """

    config: Any
    namespace: str


_clusters: dict[tuple[str | None, str | None], Cluster] = {}


async def cluster(options: KubernetesOptions) -> Cluster:
    """The :class:`Cluster` of ``options``, loaded once per kubeconfig path and context:
    ``options.kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else, inside a pod,
    its service account.

    Raises:
        BackendUnavailableError: no kubeconfig and not in a cluster, or the file is unusable.
    """
    path = kubeconfig_path(options)
    key = (path, options.context)
    if key not in _clusters:
        _clusters[key] = await _load(path, options.context)
    found = _clusters[key]
    return Cluster(found.config, options.namespace or found.namespace)


def kubeconfig_path(options: KubernetesOptions) -> str:
    """The kubeconfig ``options`` mean: ``kubeconfig``, else ``$KUBECONFIG``, else
    ``~/.kube/config`` (it may not exist)."""
    return options.kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube/config")


async def _load(path: str, context: str | None) -> Cluster:
    sdk = k8s()
    cfg = sdk.client.Configuration()
    namespace = None
    try:
        if await anyio.Path(path.split(os.pathsep)[0]).is_file():
            loader = await sdk.config.load_kube_config(
                config_file=path, context=context, client_configuration=cfg
            )
            namespace = (loader.current_context or {}).get("context", {}).get("namespace")
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            sdk.config.load_incluster_config(client_configuration=cfg)
            with contextlib.suppress(OSError):
                namespace = (await anyio.Path(_POD_NAMESPACE).read_text()).strip()
        else:
            raise BackendUnavailableError(no_cluster(path))
    except sdk.config.ConfigException as exc:
        raise BackendUnavailableError(f"kubeconfig {path}: {exc}") from exc
    return Cluster(cfg, namespace or "default")


def no_cluster(path: str) -> str:
    """The message for a machine with no kubeconfig at ``path`` and no in-cluster config."""
    return (
        f"no kubeconfig at {path} and not inside a cluster: set KUBECONFIG, or the kubernetes "
        "backend's kubeconfig option"
    )


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an ``ApiException`` (or a failed websocket handshake), else ``None``."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def api_message(exc: BaseException) -> str:
    """What the API server said: a ``Status`` body's ``message``, else the exception."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return f"{status_of(exc)} {message}"
    status = status_of(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '') or getattr(exc, 'message', '')}".strip()
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def api_error(what: str, exc: BaseException) -> SandboxError:
    """``exc`` of a call as a ``SandboxError``: retryable unless the server refused for good
    (a 4xx other than 408/409/429: forbidden, invalid, not found)."""
    status = status_of(exc)
    retryable = status is None or status in _TRANSIENT or status in (408, 409)
    return SandboxError(f"{what}: {api_message(exc)}", retryable=retryable)
