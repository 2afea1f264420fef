"""The model endpoint check of ``sandlot rollout``: the server answers one request.

``GET {base_url}/models`` (OpenAI's "list models", which vLLM, SGLang and the OpenAI API serve)
with a short timeout: a refused or silent ``--base-url`` is found in seconds instead of each
episode waiting out its retry budget (300 s by default) on every turn. A refused API key
(401/403) is found too. Any other answer counts as an answering server: a proxy without
``/models`` may still serve chat completions, and a server may serve more models than it lists
(so ``--model`` is not checked against the list).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from sandlot._optional import require
from sandlot.preflight.problem import Problem
from sandlot.rollout.llm import EXTRA

TIMEOUT_S = 10.0
"""Seconds the one request may take (connect and answer)."""


def public_url(url: str) -> str:
    """``url`` without user:password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    netloc = parts.hostname or ""
    netloc += f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=netloc))


def endpoint_problems(base_url: str, *, api_key: str | None, api_key_env: str) -> list[Problem]:
    """Problems asking the OpenAI-compatible server at ``base_url`` (ending in ``/v1``) for its
    models, once.

    Args:
        base_url: the ``--base-url``.
        api_key: the key sent as ``Authorization: Bearer`` (never in a message), or ``None``.
        api_key_env: the variable it came from, for the fix.
    """
    httpx = require("httpx", EXTRA)
    url = f"{base_url.rstrip('/')}/models"
    shown = public_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True)
    except httpx.TimeoutException:
        return [_down(shown, f"no answer within {TIMEOUT_S:g} s")]
    except httpx.HTTPError as exc:
        return [_down(shown, f"{type(exc).__name__}: {exc or 'connection failed'}")]
    status = response.status_code
    if status in (401, 403):
        return [
            Problem(
                "--base-url",
                f"{shown} refused the API key (HTTP {status})",
                f"set ${api_key_env} to the server's key (or --api-key-env to the variable "
                "that holds it)",
            )
        ]
    if status >= 500:
        return [_down(shown, f"HTTP {status}")]
    return []


def _down(url: str, why: str) -> Problem:
    return Problem(
        "--base-url",
        f"the model server does not answer at {url} ({why})",
        "start it (e.g. `vllm serve MODEL`) or correct --base-url (it ends with /v1)",
    )
