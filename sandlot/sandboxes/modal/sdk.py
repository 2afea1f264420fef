"""The boundary to the ``modal`` SDK: lazy import, credentials check, error translation.

Everything the backend calls on Modal goes through the module object returned by
:func:`modal_sdk` (tests substitute a fake there). Written against ``modal`` 1.6.4
(``modal/exception.py``; https://modal.com/docs/reference/modal.exception).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from sandlot._optional import require
from sandlot.errors import BackendUnavailableError, SandboxError

TOKEN_ENV = ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")

# Errors another attempt may fix: the service was busy, unreachable or failed internally, or the
# gRPC stream to the worker broke (grpclib's StreamTerminatedError, which Modal's own stream
# readers retry in ``modal/io_streams.py``).
_RETRYABLE = (
    "ConnectionError",
    "InternalError",
    "ResourceExhaustedError",
    "ServiceError",
    "StreamTerminatedError",
    "ClientClosed",
)
_TRANSIENT_WORDS = (
    "rate limit",
    "too many",
    "capacity",
    "try again",
    "unavailable",
    "timed out",
    "timeout",
    "temporar",
)


def modal_sdk() -> ModuleType:
    """Import ``modal``.

    Raises:
        BackendUnavailableError: not installed; names the ``sandlot[modal]`` extra.
    """
    return require("modal", "modal")


def check_credentials() -> None:
    """Fail fast, before any network call, when no Modal token is configured.

    Modal reads ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or a profile in ``~/.modal.toml``
    (``MODAL_CONFIG_PATH``); without either the SDK would only fail after a long connection
    attempt.

    Raises:
        BackendUnavailableError: no token anywhere; the message names the variables.
    """
    if all(os.environ.get(var) for var in TOKEN_ENV):
        return
    config = Path(os.environ.get("MODAL_CONFIG_PATH") or Path.home() / ".modal.toml")
    try:
        if "token_id" in config.read_text(encoding="utf-8"):
            return
    except OSError:
        pass
    missing = [var for var in TOKEN_ENV if not os.environ.get(var)]
    raise BackendUnavailableError(
        f"no Modal credentials: set {' and '.join(missing)} (from `modal token new` or the "
        f"Modal dashboard), or create a profile in {config}"
    )


def translate(what: str, exc: BaseException) -> SandboxError:
    """A ``SandboxError`` for a Modal exception; ``retryable`` for transient service faults
    (by class: connection, internal, resource exhausted, service, a broken gRPC stream; or by
    message: rate limits, capacity, "please try again", timeouts, "temporarily")."""
    name = type(exc).__name__
    retryable = name in _RETRYABLE or any(w in str(exc).lower() for w in _TRANSIENT_WORDS)
    if isinstance(exc, (TimeoutError, OSError)):
        retryable = True
    return SandboxError(f"{what}: {name}: {exc}", retryable=retryable)


def is_modal_error(sdk: ModuleType, exc: BaseException) -> bool:
    """``True`` when ``exc`` comes from the Modal SDK or its transport: ``modal.exception.Error``,
    grpclib's exceptions (``StreamTerminatedError``, ``GRPCError``), ``OSError``, timeouts, and
    the ``BufferError`` of a stdin write past Modal's buffer limit."""
    if isinstance(exc, (sdk.exception.Error, OSError, TimeoutError, BufferError)):
        return True
    return type(exc).__module__.split(".")[0] == "grpclib"
