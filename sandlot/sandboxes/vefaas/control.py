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
The SDK's own retries are turned off: :mod:`sandlot.sandboxes.scale.starting` retries starts.

Failure shapes, read in ``volcenginesdkcore/rest.py`` and
``interceptor/interceptors/deserialized_response_interceptor.py`` (5.0.54), all classified here:

* a non-2xx answer: ``rest.ApiException(http_resp=...)`` with the JSON body
  ``{"ResponseMetadata": {"Error": {"Code", "Message"}}}``;
* a 200 whose ``ResponseMetadata`` has an ``Error`` (the gateway's way of reporting throttling):
  ``ApiException(status=200, reason=str(error_dict))``, no body;
* a 200 without ``ResponseMetadata``: ``ApiException(status=200, reason="InternalServiceError")``;
* transport faults: the SDK's pool has ``Retry(total=False)``, so urllib3 raises its own
  ``NewConnectionError``, ``ReadTimeoutError``, ``ProtocolError`` (subclasses of
  ``urllib3.exceptions.HTTPError``, *not* of ``OSError``) and only ``SSLError`` is wrapped in an
  ``ApiException`` with status 0.

Error codes are classified by name, not by HTTP status; the retryable ones include Volcengine's
documented common codes (https://www.volcengine.com/docs/6369/68677: ``Throttling``,
``RequestLimitExceeded``, ``FlowLimitExceeded``, ``AccountFlowLimitExceeded``,
``ServiceUnavailable``, ``ServiceUnavailableTemporary``, ``InternalError``,
``InternalServiceError``) and any code naming a rate limit, capacity or an internal fault.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from sandlot._optional import require
from sandlot.errors import SandboxError, SandboxStartError
from sandlot.sandboxes.scale.backoff import retry
from sandlot.sandboxes.spec import SandboxSpec
from sandlot.sandboxes.vefaas.config import Credentials
from sandlot.sandboxes.vefaas.options import VefaasOptions
from sandlot.sandboxes.vefaas.pacer import Pacer

T = TypeVar("T")

_PAGE_SIZE = 100
# Words of the error codes (ResponseMetadata.Error.Code) another attempt may fix; they cover
# every code documented as transient (see the module docstring).
_RETRYABLE_CODE_WORDS = (
    "throttl",
    "ratelimit",
    "toomany",
    "quota",
    "insufficient",
    "capacity",
    "busy",
    "internal",
    "unavailable",
    "timeout",
    "limitexceeded",
)
RUNNING = "Running"
GONE = ("Terminating", "Terminated", "Destroyed", "Expired", "Killed")
"""Statuses of a sandbox already on its way out."""
# Each call of the control plane waits at least this long after the previous one of the process
# that reads sandbox status (DescribeSandbox while waiting, ListSandboxes): 256 starting
# sandboxes share ~20 reads per second instead of each reading on its own clock.
_STATUS_READ_INTERVAL_S = 0.05


class ControlPlaneError(SandboxError):
    """A control-plane call failed.

    Attributes:
        status: the HTTP status (0 for transport faults; 200 for an error in a 200 body).
        code: the service's error code (``Throttling``, ``ResourceNotFound.Sandbox``, ...), or
            ``""`` when the answer carried none.
        ambiguous: the request may have taken effect although no answer came back (a read
            timeout or dropped connection after sending).
    """

    def __init__(
        self, message: str, *, status: int, code: str, retryable: bool, ambiguous: bool = False
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status, self.code, self.ambiguous = status, code, ambiguous

    @property
    def not_found(self) -> bool:
        """The sandbox (or function) does not exist: HTTP 404 or a ``*NotFound*`` code."""
        return self.status == 404 or "notfound" in self.code.lower().replace(".", "")


STATUS_PACER = Pacer(_STATUS_READ_INTERVAL_S)


@dataclass(frozen=True)
class SandboxInfo:
    """One sandbox as ``DescribeSandbox`` or ``ListSandboxes`` reports it: its ``id``, its
    ``status`` (the service's word: ``Creating``, ``Running``, ``Terminating``, ...), its
    ``metadata`` (our labels), and the service's ``error`` message and ``error_code`` if any."""

    id: str
    status: str
    metadata: Mapping[str, str]
    error: str = ""
    error_code: str = ""

    @classmethod
    def of(cls, out: Any, sandbox_id: str, metadata: Mapping[str, str]) -> SandboxInfo:
        """From a ``DescribeSandboxResponse`` or a ``ListSandboxes`` row."""
        status, error, code = (
            str(v or "") for v in (out.status, out.error_message, out.error_code)
        )
        return cls(sandbox_id, status, metadata, error, code)

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
        # Signed into the X-Security-Token header (volcenginesdkcore 5.0.54 SignerV4.sign).
        config.session_token = creds.token or ""
        if options.endpoint:
            config.host = options.endpoint
        config.scheme = options.scheme
        config.connect_timeout = config.read_timeout = options.control_timeout_s
        config.auto_retry = False
        if options.proxy:
            config.proxy = options.proxy
        self.api = self.sdk.VEFAASApi(core.ApiClient(config))
        urllib3 = require("urllib3", "vefaas")
        self._transport_errors: tuple[type[BaseException], ...] = (
            urllib3.exceptions.HTTPError,
            OSError,
        )
        self._unsent_errors: tuple[type[BaseException], ...] = (
            urllib3.exceptions.NewConnectionError,
            urllib3.exceptions.ConnectTimeoutError,
            ConnectionRefusedError,
        )

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """Run the blocking ``fn(*args)`` in a thread (not abandoned on cancellation).

        Raises:
            ControlPlaneError: any failure, classified (see the module docstring).
        """
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except self._api_exception as exc:
            raise translate(what, exc) from exc
        except self._transport_errors as exc:
            # Connection refused / connect timeout: the request never left. Anything else
            # (read timeout, connection dropped mid-answer) may have been acted on.
            raise ControlPlaneError(
                f"{what}: {type(exc).__name__}: {exc}",
                status=0,
                code="",
                retryable=True,
                ambiguous=not isinstance(exc, self._unsent_errors),
            ) from exc

    def create_request(
        self, spec: SandboxSpec, *, function_id: str, command: str, port: int
    ) -> Any:
        """The ``CreateSandboxRequest`` of ``spec``: its ``image``, ``env``, ``labels`` as the
        metadata, lifetime in whole seconds, CPU in milli-cores, ``memory_mb``."""
        m = self.sdk.models
        return m.CreateSandboxRequest(
            function_id=function_id,
            instance_image_info=m.InstanceImageInfoForCreateSandboxInput(
                image=spec.image, port=port, command=command
            ),
            envs=[m.EnvForCreateSandboxInput(key=k, value=v) for k, v in spec.env.items()] or None,
            metadata=dict(spec.labels),
            timeout=max(1, math.ceil(spec.timeout_s)),
            timeout_unit="second",
            cpu_milli=None if spec.cpu is None else max(1, round(spec.cpu * 1000)),
            memory_mb=spec.memory_mb,
        )

    async def create(self, request: Any, record: Callable[[str], None]) -> str:
        """``CreateSandbox``; ``record(sandbox_id)`` runs in the worker thread as soon as the id
        is known, so a caller cancelled meanwhile can still kill the sandbox.

        The API has no client token, so a create whose answer was lost (``ambiguous``) can
        only be found afterwards by its ``Metadata`` (see :meth:`list`).

        Raises:
            SandboxStartError: refused (``retryable`` for rate limits, capacity, 5xx and
                transport faults), or answered 200 without a ``SandboxId`` (retryable and
                ``ambiguous``: an instance may exist). Its ``__cause__`` is the
                :class:`ControlPlaneError`.
        """

        def call() -> str:
            sandbox_id = self.api.create_sandbox(request).sandbox_id
            if not sandbox_id:
                raise ControlPlaneError(
                    "CreateSandbox: the answer (HTTP 200) carries no SandboxId",
                    status=200,
                    code="",
                    retryable=True,
                    ambiguous=True,
                )
            record(str(sandbox_id))
            return str(sandbox_id)

        try:
            return await self._call("CreateSandbox", call)
        except SandboxError as exc:
            raise SandboxStartError(str(exc), retryable=exc.retryable) from exc

    async def describe(self, function_id: str, sandbox_id: str) -> SandboxInfo:
        """``DescribeSandbox`` (paced with the process's other status reads).

        Raises:
            ControlPlaneError: the call failed (``not_found`` when the sandbox is unknown).
        """
        request = self.sdk.models.DescribeSandboxRequest(
            function_id=function_id, sandbox_id=sandbox_id
        )
        await STATUS_PACER.wait()
        out = await self._call("DescribeSandbox", self.api.describe_sandbox, request)
        metadata = {item.meta_key: item.meta_value for item in out.metadata_list or []}
        return SandboxInfo.of(out, sandbox_id, metadata)

    async def list(self, function_id: str, metadata: Mapping[str, str] | None) -> list[SandboxInfo]:
        """``ListSandboxes`` of ``function_id`` whose metadata contains ``metadata``, all pages.

        A page that fails retryably is asked again (3 tries, 50 ms doubling): a listing of many
        pages would otherwise rarely get through a throttled control plane. Pages are read
        until the reported ``Total`` is reached (a page may be shorter than asked for before
        the end), or, without a total, until a short page; an empty page ends the listing in
        both cases.

        Raises:
            ControlPlaneError: a page could not be read.
        """
        found: list[SandboxInfo] = []
        page = 1
        while True:
            await STATUS_PACER.wait()
            request = self.sdk.models.ListSandboxesRequest(
                function_id=function_id,
                metadata=dict(metadata) if metadata else None,
                page_number=page,
                page_size=_PAGE_SIZE,
            )
            out = await retry(
                functools.partial(self._call, "ListSandboxes", self.api.list_sandboxes, request),
                attempts=3,
                first_s=0.05,
                max_s=0.5,
                retry_on=lambda exc: isinstance(exc, ControlPlaneError) and exc.retryable,
            )
            rows = out.sandboxes or []
            found += [SandboxInfo.of(row, str(row.id), dict(row.metadata or {})) for row in rows]
            last = len(found) >= out.total if out.total is not None else len(rows) < _PAGE_SIZE
            if last or not rows:
                return found
            page += 1

    async def kill(self, function_id: str, sandbox_id: str) -> None:
        """``KillSandbox`` (asynchronous on the service: the status becomes Terminating).

        A sandbox the service does not know (it expired, or was killed already) counts as
        killed.

        Raises:
            ControlPlaneError: the call failed otherwise.
        """
        request = self.sdk.models.KillSandboxRequest(function_id=function_id, sandbox_id=sandbox_id)
        try:
            await self._call("KillSandbox", self.api.kill_sandbox, request)
        except ControlPlaneError as exc:
            if not exc.not_found:
                raise


def retryable_code(code: str) -> bool:
    """Whether an error code of the service names a cause another attempt may fix (a rate
    limit, capacity, an internal fault) rather than a permanent one (bad request, bad image)."""
    squashed = code.lower().replace(".", "").replace("-", "").replace("_", "")
    return any(w.replace("_", "") in squashed for w in _RETRYABLE_CODE_WORDS)


def _error_of(exc: Any) -> tuple[str, str]:
    """``(code, message)`` of an ``ApiException``: from the JSON body of a non-2xx answer, or
    from ``reason`` (``str`` of the error dict) of an error carried by a 200."""
    reason = str(getattr(exc, "reason", "") or "")
    try:
        error = json.loads(exc.body)["ResponseMetadata"]["Error"]
        return str(error.get("Code", "")), str(error.get("Message", reason))
    except (TypeError, ValueError, KeyError, AttributeError):
        pass
    if reason.startswith("{"):
        try:
            error = ast.literal_eval(reason)
        except (ValueError, SyntaxError):
            error = None
        if isinstance(error, dict):
            return str(error.get("Code", "")), str(error.get("Message", reason))
    if reason == "InternalServiceError":  # the SDK's word for a 200 without ResponseMetadata
        return reason, "the answer has no ResponseMetadata"
    return "", reason


def translate(what: str, exc: Any) -> ControlPlaneError:
    """A :class:`ControlPlaneError` for an ``ApiException``: retryable for the codes of
    :func:`retryable_code` whatever the HTTP status (a 200 carrying ``Throttling`` included),
    for 429 and 5xx, and for transport faults the SDK wraps (status 0); permanent otherwise
    (bad image, auth, not found)."""
    status = int(getattr(exc, "status", None) or 0)
    code, message = _error_of(exc)
    retryable = retryable_code(code) or status in (0, 429) or status >= 500
    return ControlPlaneError(
        f"{what}: HTTP {status} {code}: {message}".rstrip(": "),
        status=status,
        code=code,
        retryable=retryable,
        ambiguous=status == 0,
    )
