"""The veFaaS control plane: ``VEFAASApi`` calls run in worker threads, errors translated.

Written against ``volcenginesdk-vefaas`` 5.0.54 (module ``volcenginesdkvefaas``, API version
2024-06-06; read in ``volcenginesdkvefaas/api/vefaas_api.py`` and ``models/``) and
``volcenginesdk-core`` 5.0.54 (``Configuration``, ``ApiClient``, ``rest.ApiException``): the
request models ``CreateSandboxRequest(function_id, instance_image_info=
InstanceImageInfoForCreateSandboxInput(image, port, command), envs=[EnvForCreateSandboxInput],
metadata, timeout, timeout_unit, cpu_milli, memory_mb)``, ``DescribeSandboxRequest``,
``ListSandboxesRequest(function_id, metadata, page_number, page_size)`` and
``KillSandboxRequest``; API docs https://www.volcengine.com/docs/6662/1806654 (as summarised by
vefaas-dev/code-examples ``sandbox-cookbook``). The SDK posts ``/?Action=<X>&Version=2024-06-06``
with an HMAC-SHA256 signature; ``Configuration.host``/``scheme`` point it at another server.
The SDK's own retries are turned off: :mod:`sandlot.sandboxes.limits` retries starts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from sandlot._optional import require
from sandlot.sandboxes.errors import SandboxError, SandboxStartError
from sandlot.sandboxes.vefaas.config import Credentials
from sandlot.sandboxes.vefaas.options import VefaasOptions

T = TypeVar("T")

_TIMEOUT_S = 60.0
_PAGE_SIZE = 100
# Error codes (ResponseMetadata.Error.Code) another attempt may fix.
_RETRYABLE_CODE_WORDS = (
    "throttl",
    "ratelimit",
    "rate_limit",
    "toomany",
    "quota",
    "insufficient",
    "capacity",
    "busy",
    "internal",
    "unavailable",
    "timeout",
)
RUNNING = "Running"


@dataclass(frozen=True)
class SandboxInfo:
    """What the control plane says about one sandbox.

    Attributes:
        id: sandbox id.
        function_id: its function.
        status: ``Creating``, ``Running``, ``Terminating``, ``Terminated``, ... (service word).
        metadata: its metadata (our labels).
        error: the service's error message for the sandbox, if any.
        error_code: the service's error code for the sandbox, if any.
    """

    id: str
    function_id: str
    status: str
    metadata: Mapping[str, str]
    error: str = ""
    error_code: str = ""

    @property
    def failure_retryable(self) -> bool:
        """Whether a sandbox that failed this way may start on another attempt: ``True`` when
        the service gives no error code (cause unknown) or one naming a transient cause (see
        :func:`retryable_code`); ``False`` for any other code (bad image, a start command that
        exits), which the same request meets again."""
        return not self.error_code or retryable_code(self.error_code)


class ControlPlane:
    """Blocking ``VEFAASApi`` wrapped for async use.

    Args:
        creds: access key, secret key, region.
        options: ``endpoint``/``scheme``/``proxy`` of the control plane.

    Raises:
        BackendUnavailableError: ``volcenginesdkvefaas`` is not installed (``sandlot[vefaas]``).
    """

    def __init__(self, creds: Credentials, options: VefaasOptions) -> None:
        core = require("volcenginesdkcore", "vefaas")
        self.sdk = require("volcenginesdkvefaas", "vefaas")
        self._api_exception: type[Exception] = core.rest.ApiException
        config = core.Configuration()
        config.ak, config.sk, config.region = creds.ak, creds.sk, creds.region
        if options.endpoint:
            config.host = options.endpoint
        config.scheme = options.scheme
        config.connect_timeout = config.read_timeout = _TIMEOUT_S
        config.auto_retry = False
        if options.proxy:
            config.proxy = options.proxy
        self.api = self.sdk.VEFAASApi(core.ApiClient(config))

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """Run the blocking ``fn(*args)`` in a thread (not abandoned on cancellation)."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except self._api_exception as exc:
            raise translate(what, exc) from exc
        except OSError as exc:  # urllib3 connection errors
            raise SandboxError(f"{what}: {exc}", retryable=True) from exc

    def create_request(
        self,
        *,
        function_id: str,
        image: str,
        port: int,
        command: str,
        env: Mapping[str, str],
        metadata: Mapping[str, str],
        timeout_s: float,
        cpu: float | None,
        memory_mb: int | None,
    ) -> Any:
        """The ``CreateSandboxRequest``: lifetime in whole seconds, CPU in milli-cores."""
        m = self.sdk.models
        return m.CreateSandboxRequest(
            function_id=function_id,
            instance_image_info=m.InstanceImageInfoForCreateSandboxInput(
                image=image, port=port, command=command
            ),
            envs=[m.EnvForCreateSandboxInput(key=k, value=v) for k, v in env.items()] or None,
            metadata=dict(metadata),
            timeout=max(1, math.ceil(timeout_s)),
            timeout_unit="second",
            cpu_milli=None if cpu is None else max(1, round(cpu * 1000)),
            memory_mb=memory_mb,
        )

    async def create(self, request: Any, record: Callable[[str], None]) -> str:
        """``CreateSandbox``; ``record(sandbox_id)`` runs in the worker thread as soon as the id
        is known, so a caller cancelled meanwhile can still kill the sandbox.

        Raises:
            SandboxStartError: refused (``retryable`` for rate limits, capacity, 5xx).
        """

        def call() -> str:
            sandbox_id = str(self.api.create_sandbox(request).sandbox_id)
            record(sandbox_id)
            return sandbox_id

        try:
            return await self._call("CreateSandbox", call)
        except SandboxError as exc:
            raise SandboxStartError(str(exc), retryable=exc.retryable) from exc

    async def describe(self, function_id: str, sandbox_id: str) -> SandboxInfo:
        """``DescribeSandbox``."""
        request = self.sdk.models.DescribeSandboxRequest(
            function_id=function_id, sandbox_id=sandbox_id
        )
        out = await self._call("DescribeSandbox", self.api.describe_sandbox, request)
        metadata = {item.meta_key: item.meta_value for item in out.metadata_list or []}
        return SandboxInfo(
            id=sandbox_id,
            function_id=function_id,
            status=str(out.status or ""),
            metadata=metadata,
            error=str(out.error_message or ""),
            error_code=str(out.error_code or ""),
        )

    async def list(self, function_id: str, metadata: Mapping[str, str] | None) -> list[SandboxInfo]:
        """``ListSandboxes`` of ``function_id`` whose metadata contains ``metadata``, all pages."""
        found: list[SandboxInfo] = []
        page = 1
        while True:
            request = self.sdk.models.ListSandboxesRequest(
                function_id=function_id,
                metadata=dict(metadata) if metadata else None,
                page_number=page,
                page_size=_PAGE_SIZE,
            )
            out = await self._call("ListSandboxes", self.api.list_sandboxes, request)
            rows = out.sandboxes or []
            found += [
                SandboxInfo(
                    id=str(row.id),
                    function_id=function_id,
                    status=str(row.status or ""),
                    metadata=dict(row.metadata or {}),
                    error=str(row.error_message or ""),
                    error_code=str(row.error_code or ""),
                )
                for row in rows
            ]
            if len(rows) < _PAGE_SIZE or (out.total is not None and len(found) >= out.total):
                return found
            page += 1

    async def kill(self, function_id: str, sandbox_id: str) -> None:
        """``KillSandbox`` (asynchronous on the service: the status becomes Terminating)."""
        request = self.sdk.models.KillSandboxRequest(function_id=function_id, sandbox_id=sandbox_id)
        await self._call("KillSandbox", self.api.kill_sandbox, request)


def retryable_code(code: str) -> bool:
    """Whether an error code of the service names a cause another attempt may fix (a rate
    limit, capacity, an internal fault) rather than a permanent one (bad request, bad image)."""
    squashed = code.lower().replace(".", "").replace("-", "")
    return any(w in squashed for w in _RETRYABLE_CODE_WORDS)


def translate(what: str, exc: Any) -> SandboxError:
    """A ``SandboxError`` for an ``ApiException``: retryable for 429, 5xx and rate-limit,
    capacity or internal error codes; permanent for other 4xx (bad image, auth, not found)."""
    status = getattr(exc, "status", None) or 0
    code, message = "", str(getattr(exc, "reason", "") or "")
    try:
        error = json.loads(exc.body)["ResponseMetadata"]["Error"]
        code, message = str(error.get("Code", "")), str(error.get("Message", message))
    except (TypeError, ValueError, KeyError):
        pass
    retryable = status == 429 or status >= 500 or retryable_code(code)
    return SandboxError(
        f"{what}: HTTP {status} {code}: {message}".rstrip(": "), retryable=retryable
    )
