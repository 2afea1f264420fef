"""``OpenAIChatPolicy``: the :class:`~sandlot.rollout.policy.Policy` of an OpenAI-compatible
chat-completions endpoint.

The API followed is OpenAI's ``POST {base_url}/chat/completions`` as vLLM and SGLang serve it
(``base_url`` ends with ``/v1``, e.g. ``http://127.0.0.1:8000/v1``)::

    request:  {"model": ..., "messages": [...], "tools": [...]?, **sampling}
    response: {"choices": [{"message": {"content": ..., "tool_calls": [...]?},
                            "finish_reason": "stop" | "tool_calls" | "length"}],
               "usage": {"prompt_tokens": ..., "completion_tokens": ...}}

Tool calls travel one of two ways:

* ``native_tools=True``: the request carries ``tools`` and the server's tool parser fills
  ``tool_calls`` (vLLM ``--enable-auto-tool-choice --tool-call-parser ...``). Each becomes a
  :class:`~sandlot.tools.ToolCall` with its ``arguments`` JSON-decoded. Arguments that are not a
  JSON object are kept as the server sent them, as text, so that the toolbox reports them to
  the model as a format error (the model learns from it; the episode goes on). A reply without
  ``tool_calls`` is returned as text (``tool_calls=None``): the agent loop then reads it with
  its text parser.
* ``native_tools=False`` (the default; as in training, the model writes its calls as text):
  the reply's text is returned for the configured ``tool_parser`` (``hermes``,
  ``qwen3_coder``). The request carries ``tools`` with ``tool_choice: "none"`` so that the
  server's chat template still shows the tools to the model, as verl's does in training (vLLM
  renders them for ``"none"`` unless started with ``--exclude-tools-when-tool-choice-none``)
  and parses nothing; ``template_tools=False`` sends no ``tools`` at all, for prompts that
  describe the tools themselves. Should the server parse calls anyway, its ``tool_calls``
  are used as native ones.

Faults: 429, 5xx, connection errors, timeouts and malformed replies are retried for as long as
the retry budget lasts (``retry_budget_s``, 300 s by default: a vLLM restart takes minutes),
not a number of times. The waits grow exponentially from ``backoff_s`` up to ``max_backoff_s``
with full jitter (tenacity's ``wait_random_exponential``), and a ``Retry-After`` header is
honoured; a wait that would end past the budget is not taken, and then
:class:`~sandlot.rollout.policy.PolicyError` with ``retryable=True`` is raised. While it retries,
the episode that asked for the turn simply waits: its sandbox and conversation are kept, nothing
is rerun. Each HTTP request is cut after ``request_timeout_s`` (a server that accepts and never
answers). Other 4xx answers raise at once with ``retryable=False`` and the server's message; a
prompt longer than the model's context raises
:class:`~sandlot.rollout.policy.ContextLengthError`, which ends the episode as
``context_length`` rather than as an infrastructure error.

The API key (argument, else ``$OPENAI_API_KEY`` or the variable named by ``api_key_env``) is
sent as ``Authorization: Bearer``, returned by :meth:`OpenAIChatPolicy.secrets` for the agent
loop to redact, and kept out of every log line, exception message and ``repr``.

Token ids and logprobs: with ``sampling`` ``{"logprobs": True, "return_token_ids": True}``
(vLLM's extra), the turn's ``extra`` holds ``token_ids``, ``prompt_token_ids`` and ``logprobs``
(one float per generated token) as the server sent them.

Why not the ``openai`` SDK (httpx-based, retries, timeouts, ``extra_body``): measured with
``benchmarks/llm_client.py`` (openai 3.57.0 against this client and a bare ``httpx`` post, the
scripted server in a child process; 2 shared cores, 300 sequential requests):

* **The outage budget.** The SDK's retries are a count (``max_retries=2``; waits of
  ``0.5 * 2**k`` s capped at 8 s, less up to 25 % jitter): against a refused port it gave up
  after 3 attempts in 1.3 s. Outlasting a 90 s vLLM restart takes about 20 retries, and a
  count means a different time for a fast refusal and a slow timeout. This client tries until
  ``retry_budget_s`` (22 attempts in 288 s of a 300 s budget on a virtual clock), which is what
  lets a minutes-long outage lose no episode (``tests/rollout/test_outage.py``).
* **Retry-After.** The SDK honours it up to 120 s and does not retry at all beyond (a 429 with
  ``Retry-After: 150`` raised ``RateLimitError`` in 0.05 s); here any wait inside the budget
  is taken (150 s, then the answer).
* **Cost.** 7.5 ms of client CPU per request for the SDK against 4.6 ms here and 3.9 ms for the
  bare post (1.9x and 1.2x the baseline); median latency 72.6 / 59.6 / 54.6 ms. ``import
  openai`` took 8.5 s against 2.2 s for ``httpx`` + ``tenacity`` on the loaded machine, and
  openai 3.x brings its own HTTP stack (``httpx2``) beside the ``httpx`` sandlot uses.
* **vLLM's extras** reach the caller either way: the SDK keeps ``token_ids`` and
  ``prompt_token_ids`` as untyped ``model_extra`` and types ``logprobs``; here they land in
  ``PolicyTurn.extra``.

Using the SDK would mean ``max_retries=0`` and this module's budget, ``Retry-After`` handling
and error mapping kept around it: the SDK would replace one ``post`` and one ``json()``, for
more CPU per request and a second HTTP stack. So the client stays on httpx + tenacity.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from sandlot._optional import require
from sandlot.rollout.policy import ContextLengthError, Message, PolicyError, PolicyTurn
from sandlot.tools.parsers import ToolCall

if TYPE_CHECKING:
    import httpx
    import tenacity

log = logging.getLogger("sandlot.rollout.llm")

EXTRA = "rollout"
"""The ``sandlot`` extra that installs httpx and tenacity for this client."""

REDACTED = "[REDACTED]"

_CONTEXT_LENGTH = re.compile(
    r"context[ _]length|context window|maximum allowed length|too many tokens|"
    r"prompt is too long|longer than the model",
    re.IGNORECASE,
)


class OpenAIChatPolicy:
    """A chat-completions client that is a :class:`~sandlot.rollout.policy.Policy`.

    Use it as an async context manager (or call :meth:`aclose`) so its connections close; one
    instance serves any number of concurrent episodes, on one event loop.

    Args:
        base_url: the API root, ``http(s)://host:port/v1``; requests go to
            ``{base_url}/chat/completions``.
        model: the ``model`` field of each request (the name the server serves).
        api_key: the key to send; ``None`` reads the environment variable ``api_key_env``;
            when that is unset or empty no ``Authorization`` header is sent (a local vLLM
            without ``--api-key``).
        api_key_env: the variable the key is read from when ``api_key`` is ``None``.
        native_tools: send ``tools`` and read the reply's ``tool_calls`` (see the module
            docstring); ``False`` leaves the calls in the text for the ``tool_parser``.
        template_tools: with ``native_tools=False``, send ``tools`` with
            ``tool_choice: "none"`` for the chat template to render; ``False`` sends none.
        request_timeout_s: seconds one HTTP request may take in all (connect, wait, read).
        retry_budget_s: seconds from the first attempt of a turn during which failed attempts
            (429, 5xx, connection errors, timeouts, malformed replies) are retried; a wait
            (backoff or ``Retry-After``) that would end past it is not taken (``0``: no retry).
        sampling: extra request fields merged into every request (``temperature``,
            ``top_p``, ``max_tokens``, ``chat_template_kwargs``, ...; what
            :meth:`~sandlot.rollout.generation.GenerationConfig.request_fields` returns).
        backoff_s: the first wait's upper bound in seconds; it doubles per retry up to
            ``max_backoff_s``, and each wait is drawn uniformly below it (full jitter).
        max_backoff_s: the longest wait between two attempts, unless the server's
            ``Retry-After`` asks for more.
        clock: monotonic seconds, for the budget (tests pass a virtual clock).
        sleep: the async sleep between attempts (tests pass one that advances that clock).

    Raises:
        ValueError: ``base_url`` is not an ``http://`` or ``https://`` URL, ``sampling`` sets a
            field the client owns, or a number is out of range.
        BackendUnavailableError: httpx or tenacity is not installed (the message names the
            extra).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        native_tools: bool = False,
        template_tools: bool = True,
        request_timeout_s: float = 600.0,
        retry_budget_s: float = 300.0,
        sampling: dict[str, Any] | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if request_timeout_s <= 0 or retry_budget_s < 0 or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError(
                "request_timeout_s must be > 0 and retry_budget_s, backoff_s, max_backoff_s >= 0"
            )
        lib = require("httpx", EXTRA)
        self._tenacity = require("tenacity", EXTRA)
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.native_tools = native_tools
        self.template_tools = template_tools
        self.request_timeout_s = request_timeout_s
        self.retry_budget_s = retry_budget_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._sleep = sleep
        self.sampling = dict(sampling or {})
        reserved = sorted({"model", "messages", "tools", "tool_choice"} & set(self.sampling))
        if reserved:
            raise ValueError(f"sampling may not set {', '.join(reserved)}")
        key = api_key if api_key is not None else os.environ.get(api_key_env, "")
        self._api_key = key.strip()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._httpx = lib
        self._client: httpx.AsyncClient = lib.AsyncClient(
            headers=headers,
            timeout=lib.Timeout(request_timeout_s),
            # Concurrency is the scheduler's to bound; a pool cap here would queue requests
            # behind one another and count the wait against their timeout.
            limits=lib.Limits(max_connections=None, max_keepalive_connections=64),
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        key = "set" if self._api_key else "unset"
        return (
            f"OpenAIChatPolicy(base_url={self.base_url!r}, model={self.model!r}, "
            f"native_tools={self.native_tools}, api_key={key})"
        )

    # ----------------------------------------------------------------- Policy

    def secrets(self) -> list[str]:
        """The API key, when there is one (for the agent loop to redact)."""
        return [self._api_key] if self._api_key else []

    async def generate(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
    ) -> PolicyTurn:
        """Ask for the next assistant turn (see the module docstring for the wire format).

        Args:
            messages: the conversation, OpenAI chat messages oldest first.
            tools: the OpenAI ``tools`` schemas (sent as the module docstring says).
            max_tokens: the request's ``max_tokens`` (what is left of the episode's response
                budget); ``None`` keeps ``sampling``'s.

        Returns:
            The turn: ``content`` (``""`` when the server sent none), ``tool_calls`` (native
            mode with calls, else ``None``), ``usage`` as ``prompt_tokens`` /
            ``completion_tokens``, ``finish_reason``, and in ``extra`` the reasoning text and
            the token ids and logprobs when asked for (see :func:`_vllm_extras`).

        Raises:
            ContextLengthError: the server says the prompt does not fit the model's context.
            PolicyError: a 4xx answer (``retryable=False``, with the server's message), or
                429 / 5xx / connection errors / timeouts / malformed replies until
                ``retry_budget_s`` ran out (``retryable=True``).
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.sampling}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if tools and self.native_tools:
            body["tools"] = tools
        elif tools and self.template_tools:
            body["tools"] = tools
            body["tool_choice"] = "none"
        payload = json.dumps(body, ensure_ascii=False).encode()
        lib = self._tenacity
        started = self._clock()
        retrying = lib.AsyncRetrying(
            retry=lib.retry_if_exception_type(_Retryable),
            wait=self._waiter(),
            stop=lambda state: (
                self._clock() - started + (state.upcoming_sleep or 0.0) >= self.retry_budget_s
            ),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(state, started),
            reraise=True,
        )
        try:
            turn: PolicyTurn = await retrying(self._attempt, payload)
        except _Retryable as last:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise PolicyError(
                self._redact(
                    f"model server {self.url} failed {attempts} time(s) in "
                    f"{self._clock() - started:.1f}s (retry_budget_s={self.retry_budget_s:g}); "
                    f"last: {last}"
                ),
                retryable=True,
            ) from None
        return turn

    def _waiter(self) -> Callable[[tenacity.RetryCallState], float]:
        """Full-jitter exponential backoff, or the server's ``Retry-After`` when longer."""
        backoff = self._tenacity.wait_random_exponential(
            multiplier=self.backoff_s, max=self.max_backoff_s
        )

        def wait(state: tenacity.RetryCallState) -> float:
            delay = float(backoff(state))
            failure = state.outcome.exception() if state.outcome else None
            if isinstance(failure, _Retryable) and failure.retry_after is not None:
                delay = max(delay, failure.retry_after)
            return delay

        return wait

    def _log_retry(self, state: tenacity.RetryCallState, started: float) -> None:
        failure = state.outcome.exception() if state.outcome else None
        log.warning(
            "model server %s: %s; attempt %d failed, %.1fs of retry_budget_s=%g used, "
            "next in %.2fs",
            self.url,
            self._redact(str(failure)),
            state.attempt_number,
            self._clock() - started,
            self.retry_budget_s,
            state.upcoming_sleep,
        )

    async def _attempt(self, payload: bytes) -> PolicyTurn:
        """One request.

        Raises:
            _Retryable: a failure worth another attempt (its reason and ``Retry-After``).
            PolicyError: a non-retryable answer.
        """
        lib = self._httpx
        try:
            with anyio.fail_after(self.request_timeout_s):
                response = await self._client.post(self.url, content=payload)
        except (TimeoutError, lib.TimeoutException):
            raise _Retryable(
                f"no answer within request_timeout_s={self.request_timeout_s:g}s"
            ) from None
        except lib.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc or 'connection failed'}") from None
        status = response.status_code
        if status == 200:
            try:
                return _turn(response.json())
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                raise _Retryable(
                    f"malformed reply ({type(exc).__name__}: {exc}): {_head(response)}"
                ) from None
        message = _error_message(response)
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {message}", _retry_after(response))
        text = self._redact(f"model server {self.url} answered HTTP {status}: {message}")
        if status == 400 and _CONTEXT_LENGTH.search(message):
            raise ContextLengthError(text)
        raise PolicyError(text, retryable=False)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, REDACTED) if self._api_key else text

    # ----------------------------------------------------------------- lifecycle

    async def aclose(self) -> None:
        """Close the connections (idempotent)."""
        await self._client.aclose()

    async def __aenter__(self) -> OpenAIChatPolicy:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Retryable(Exception):
    """One failed attempt worth another: why, and the server's ``Retry-After`` in seconds."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def _turn(data: Any) -> PolicyTurn:
    """A ``PolicyTurn`` from a chat-completions reply. ``tool_calls`` are read in either mode:
    a server that parsed calls in text mode (one that ignores ``tool_choice: "none"``) would
    otherwise lose them.

    Raises:
        KeyError, IndexError, TypeError, ValueError: the reply is not a chat completion.
    """
    choice = data["choices"][0]
    message = choice["message"]
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TypeError(f"message.content is a {type(content).__name__}, not text")
    calls = None
    if message.get("tool_calls"):
        calls = [_tool_call(call) for call in message["tool_calls"]]
    usage = data.get("usage") or {}
    extra: dict[str, Any] = {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        extra["reasoning_content"] = reasoning
    extra.update(_vllm_extras(data, choice))
    return PolicyTurn(
        content=content,
        tool_calls=calls,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason=choice.get("finish_reason"),
        extra=extra,
    )


def _vllm_extras(data: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """Token ids and logprobs, when the request asked for them (``sampling``'s
    ``logprobs: true``, vLLM's ``return_token_ids: true``) and the server sent them:
    ``token_ids`` (``choices[0].token_ids``), ``prompt_token_ids`` (vLLM's top-level field) and
    ``logprobs`` (one float per generated token, from ``choices[0].logprobs.content``).

    Raises:
        KeyError, TypeError, ValueError: the fields are there but not in vLLM's shape.
    """
    found: dict[str, Any] = {}
    if choice.get("token_ids") is not None:
        found["token_ids"] = [int(t) for t in choice["token_ids"]]
    if data.get("prompt_token_ids") is not None:
        found["prompt_token_ids"] = [int(t) for t in data["prompt_token_ids"]]
    logprobs = choice.get("logprobs")
    if logprobs and logprobs.get("content") is not None:
        found["logprobs"] = [float(t["logprob"]) for t in logprobs["content"]]
    return found


def _tool_call(call: dict[str, Any]) -> ToolCall:
    """A native call; arguments that do not decode to a JSON object stay text (the toolbox
    reports them to the model as a format error)."""
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str):
        raise TypeError("a tool call has no function name")
    raw = function.get("arguments")
    arguments: Any = raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        arguments = {}
    elif isinstance(raw, str):
        try:
            decoded = json.loads(raw)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            arguments = decoded
    elif not isinstance(raw, dict):
        arguments = json.dumps(raw)
    return ToolCall(name, arguments)


def _head(response: httpx.Response, limit: int = 300) -> str:
    text = response.text
    return text if len(text) <= limit else text[:limit] + "..."


def _error_message(response: httpx.Response) -> str:
    """The server's error message: OpenAI's ``{"error": {"message"}}``, vLLM's and SGLang's
    ``{"message"}`` or ``{"detail"}``, else the start of the body."""
    try:
        data = response.json()
    except ValueError:
        return _head(response) or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])
    return _head(response)


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``None``."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
