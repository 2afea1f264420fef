"""One look at a registry: does it answer and hold a name, without pulling it; and what a
failed skopeo call on a registry means.

``skopeo inspect --raw`` fetches the manifest (or index) a name resolves to: one request, no
retries. That is the preflight of ``sandlot eval``/``rollout`` for an image not cached yet:
a wrong name or a registry nobody listens on is found once, before any sandbox starts.
"""

from __future__ import annotations

import subprocess

from sandlot.images.errors import ImageError
from sandlot.images.reference import Reference
from sandlot.images.tools import find_tool

INSPECT_TIMEOUT_S = 30.0
"""How long one ``skopeo inspect`` may take (a registry that accepts and never answers)."""

# Failures no repeat cures soon: nothing listens at the address, or no such host.
_REFUSED = ("connection refused", "no such host", "no route to host")
_TRANSIENT = (
    "connection reset", "EOF", "timeout", "502 Bad Gateway", "503 Service Unavailable",
    "504 Gateway", "TLS handshake", "429 Too Many Requests", "toomanyrequests",
)  # fmt: skip


def check_remote(ref: Reference, *, creds: str | None = None) -> None:
    """Ask ``ref``'s registry for the manifest it names (one request, no retry).

    Args:
        ref: a registry reference (``ref.local`` is false).
        creds: ``user:password`` for the registry (skopeo's ``--creds``); ``None`` uses
            skopeo's own (``~/.docker/config.json``, ``auth.json``, credential helpers).

    Raises:
        ImageError: the registry refused the connection, did not answer within
            :data:`INSPECT_TIMEOUT_S`, refused the credentials or does not hold the name
            (:func:`registry_error`; the message names the registry).
        BackendUnavailableError: skopeo is missing.
    """
    argv = [find_tool("skopeo"), "inspect", "--raw", "--retry-times", "0"]
    if ref.plain_http:
        argv.append("--tls-verify=false")
    if creds:
        argv.append(f"--creds={creds}")
    argv.append(ref.source)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=INSPECT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ImageError(
            f"cannot resolve {ref.text!r}: the registry {ref.registry} did not answer within "
            f"{INSPECT_TIMEOUT_S:g} s; check the address and the network",
            retryable=True,
        ) from None
    if done.returncode != 0:
        raise registry_error(ref, done.stderr)


def registry_error(ref: Reference, stderr: str) -> ImageError:
    """The :class:`ImageError` of a failed skopeo call on ``ref``, from its stderr.

    A refused connection (or an unknown host) names the registry and is not retryable:
    nothing listens there, and repeating it cost minutes (skopeo's retries, then the
    sandbox start's). Transient answers (5xx, 429, a dropped connection) are retryable.
    """
    lines = stderr.strip().splitlines()
    message = lines[-1] if lines else "no output"
    if any(word in stderr for word in _REFUSED):
        cause = next(word for word in _REFUSED if word in stderr)
        return ImageError(
            f"cannot pull {ref.text!r}: nothing answers at the registry {ref.registry} "
            f"({cause}); start the registry or correct the image name",
            retryable=False,
        )
    return ImageError(
        f"cannot pull {ref.text!r}: {message}",
        retryable=any(word in stderr for word in _TRANSIENT),
    )
