"""``OpenAIChatPolicy`` against the scripted OpenAI-compatible server: wire format, native and
text tool calls, retries, budgets, timeouts, and keeping the API key secret."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from typing import Any

import anyio
import pytest
from requirements import TEST, need_module
from rollout.scripted_server import ScriptedServer
from rollout.virtual_time import VirtualClock

from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.policy import ContextLengthError, PolicyError
from sandlot.tools import ToolCall, get_parser

need_module("httpx", TEST)
pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789abcdef"
TASK = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "<task id=minicalc__minicalc-1>\nDivision truncates.\n</task>"},
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def policy(
    server: ScriptedServer, model: str, clock: VirtualClock | None = None, **kwargs: Any
) -> OpenAIChatPolicy:
    """A client whose retry waits and budget run on a virtual clock (no wall-clock waits)."""
    clock = clock or VirtualClock()
    return OpenAIChatPolicy(server.url, model, clock=clock, sleep=clock.sleep, **kwargs)


@pytest.mark.parametrize("template_tools", [True, False])
async def test_text_mode_returns_the_text_for_the_parser(
    server: ScriptedServer, template_tools: bool
) -> None:
    """The calls stay in the text; the tools go to the chat template (``tool_choice: none``)
    or, with ``template_tools=False``, not at all."""
    sampling = {"temperature": 0.0, "max_tokens": 256}
    async with policy(server, "solver", sampling=sampling, template_tools=template_tools) as p:
        turn = await p.generate(TASK, TOOLS)
    assert turn.tool_calls is None
    parsed = get_parser("hermes").parse(turn.content)
    assert parsed.error is None
    assert parsed.calls == [
        ToolCall("str_replace_editor", {"command": "view", "path": "/testbed/minicalc/ops.py"})
    ]
    assert turn.finish_reason == "stop"
    assert turn.prompt_tokens > 0 and turn.completion_tokens > 0
    (body,) = server.bodies
    if template_tools:
        assert body["tools"] == TOOLS and body["tool_choice"] == "none"
    else:
        assert "tools" not in body and "tool_choice" not in body
    assert body["model"] == "solver" and body["messages"] == TASK
    assert body["temperature"] == 0.0 and body["max_tokens"] == 256


async def test_native_mode_sends_tools_and_decodes_tool_calls(server: ScriptedServer) -> None:
    async with policy(server, "solver", native_tools=True) as p:
        turn = await p.generate(TASK, TOOLS)
    assert turn.tool_calls == [
        ToolCall("str_replace_editor", {"command": "view", "path": "/testbed/minicalc/ops.py"})
    ]
    assert turn.finish_reason == "tool_calls"
    assert server.bodies[0]["tools"] == TOOLS and "tool_choice" not in server.bodies[0]


async def test_native_reply_without_tool_calls_is_text(server: ScriptedServer) -> None:
    async with policy(server, "quitter", native_tools=True) as p:
        turn = await p.generate(TASK, TOOLS)
    assert turn.tool_calls is None and turn.content == "I am done here."


async def test_undecodable_native_arguments_stay_text(server: ScriptedServer) -> None:
    """Arguments that are not a JSON object are kept as written, for the toolbox to report."""
    async with policy(server, "garbage", native_tools=True) as p:
        history: list[dict[str, Any]] = list(TASK)
        seen = []
        for _ in range(4):
            turn = await p.generate(history, TOOLS)
            assert turn.tool_calls is not None
            seen.append(turn.tool_calls[0])
            history.append({"role": "assistant", "content": turn.content})
    assert seen == [
        ToolCall("bash", '{"command": "ls"'),  # type: ignore[arg-type]
        ToolCall("bash", "[1, 2, 3]"),  # type: ignore[arg-type]
        ToolCall("rm_rf_everything", {}),
        ToolCall("bash", "not json at all"),  # type: ignore[arg-type]
    ]


async def test_429_is_retried_until_it_succeeds(server: ScriptedServer) -> None:
    async with policy(server, "flaky") as p:
        turn = await p.generate(TASK, TOOLS)
    assert "<tool_call>" in turn.content
    assert server.requests["flaky"] == 3  # two 429s, then the answer


async def test_retry_after_is_honoured(instance_records: list[dict[str, Any]]) -> None:
    """A ``Retry-After`` longer than the backoff bound is the wait."""
    clock = VirtualClock()
    with ScriptedServer(instance_records, flaky_failures=1, retry_after="7") as server:
        async with policy(server, "flaky", clock, backoff_s=1.0) as p:
            await p.generate(TASK, TOOLS)
    assert server.requests["flaky"] == 2
    assert clock.sleeps == [7.0]


async def test_retries_last_for_the_budget_not_a_count(server: ScriptedServer) -> None:
    """A server answering 503 is retried until the next wait would pass ``retry_budget_s``:
    each wait is at most ``max_backoff_s`` (30 s) and the first six at most 1+2+...+30 = 61 s,
    so a 300 s budget makes at least eight attempts (a count of five retries would stop at
    six); then a retryable ``PolicyError`` that says how long it tried."""
    clock = VirtualClock()
    async with policy(server, "status-503", clock, retry_budget_s=300.0) as p:
        with pytest.raises(PolicyError) as info:
            await p.generate(TASK, TOOLS)
    attempts = server.requests["status-503"]
    assert attempts >= 8 and attempts == len(clock.sleeps) + 1
    assert all(0.0 <= wait <= 30.0 for wait in clock.sleeps)
    assert all(wait <= 2.0**i for i, wait in enumerate(clock.sleeps))  # exponential bound
    assert clock.now < 300.0
    assert info.value.retryable
    message = str(info.value)
    assert f"failed {attempts} time(s)" in message and "retry_budget_s=300" in message
    assert "HTTP 503" in message and "scripted failure 503" in message


async def test_a_retry_past_the_budget_is_not_taken(instance_records: list[dict[str, Any]]) -> None:
    """A ``Retry-After`` longer than what is left of ``retry_budget_s`` ends the call now."""
    clock = VirtualClock()
    with ScriptedServer(instance_records, flaky_failures=5, retry_after="30") as server:
        async with policy(server, "flaky", clock, retry_budget_s=2.0) as p:
            with pytest.raises(PolicyError) as info:
                await p.generate(TASK, TOOLS)
    assert clock.sleeps == []
    assert info.value.retryable and "HTTP 429" in str(info.value)
    assert server.requests["flaky"] == 1


async def test_400_is_not_retried_and_carries_the_servers_message(
    server: ScriptedServer,
) -> None:
    async with policy(server, "status-400") as p:
        with pytest.raises(PolicyError) as info:
            await p.generate(TASK, TOOLS)
    assert not info.value.retryable
    assert "HTTP 400" in str(info.value) and "scripted failure 400" in str(info.value)
    assert server.requests["status-400"] == 1


async def test_unknown_model_404_is_not_retried(server: ScriptedServer) -> None:
    async with policy(server, "no-such-model") as p:
        with pytest.raises(PolicyError, match="does not exist") as info:
            await p.generate(TASK, TOOLS)
    assert not info.value.retryable


async def test_context_overflow_is_a_context_length_error(server: ScriptedServer) -> None:
    async with policy(server, "overflow") as p:
        with pytest.raises(ContextLengthError, match="maximum context length") as info:
            await p.generate(TASK, TOOLS)
    assert not info.value.retryable
    assert server.requests["overflow"] == 1


async def test_malformed_reply_is_retried_then_retryable(server: ScriptedServer) -> None:
    clock = VirtualClock()
    async with policy(server, "malformed", clock, retry_budget_s=60.0) as p:
        with pytest.raises(PolicyError, match="malformed reply") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable
    assert server.requests["malformed"] == len(clock.sleeps) + 1 >= 2


async def test_timeout_is_retryable(server: ScriptedServer) -> None:
    async with policy(server, "sleeper", request_timeout_s=0.3, retry_budget_s=0.0) as p:
        with pytest.raises(PolicyError, match=r"no answer within request_timeout_s=0\.3s") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable
    assert server.requests["sleeper"] == 1


async def test_a_server_that_accepts_and_never_answers_is_cut_by_the_request_timeout() -> None:
    """The kernel accepts the connection (it is in the listen backlog) and takes the request;
    nothing ever answers. Only ``request_timeout_s`` ends the wait (the outer limit fails the
    test instead of hanging it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        client = OpenAIChatPolicy(
            f"http://127.0.0.1:{port}/v1", "m", request_timeout_s=0.5, retry_budget_s=0.0
        )
        async with client as p:
            with anyio.fail_after(60):
                with pytest.raises(PolicyError, match=r"no answer within request_timeout_s=0\.5s"):
                    await p.generate(TASK, TOOLS)


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    clock = VirtualClock()
    async with OpenAIChatPolicy(
        f"http://127.0.0.1:{port}/v1", "solver", retry_budget_s=10.0, clock=clock, sleep=clock.sleep
    ) as p:
        with pytest.raises(PolicyError, match=r"failed [0-9]+ time") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable and "ConnectError" in str(info.value)
    assert clock.sleeps, "a refused connection is retried"


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIChatPolicy("127.0.0.1:8000/v1", "m")
    with pytest.raises(ValueError, match="sampling may not set model, tool_choice"):
        OpenAIChatPolicy(
            "http://127.0.0.1:8000/v1", "m", sampling={"model": "x", "tool_choice": "auto"}
        )
    with pytest.raises(ValueError, match="retry_budget_s"):
        OpenAIChatPolicy("http://127.0.0.1:8000/v1", "m", retry_budget_s=-1)


# ----------------------------------------------------------------------------- the API key


async def test_the_key_from_the_environment_is_sent_as_a_bearer_token(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_LLM_KEY", KEY)
    async with policy(server, "solver", api_key_env="MY_LLM_KEY") as p:
        await p.generate(TASK, TOOLS)
        assert p.secrets() == [KEY]
    assert server.authorizations == [f"Bearer {KEY}"]


async def test_the_key_argument_wins_and_no_key_sends_no_header(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with policy(server, "solver", api_key=KEY) as p:
        await p.generate(TASK, TOOLS)
    monkeypatch.delenv("OPENAI_API_KEY")
    async with policy(server, "solver") as p:
        await p.generate(TASK, TOOLS)
        assert p.secrets() == []
    assert server.authorizations == [f"Bearer {KEY}", None]


async def test_the_key_never_appears_in_errors_logs_or_repr(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that echoes the ``Authorization`` header into its errors (``status-401``), and
    retried failures logged at every level: the key is redacted everywhere."""
    caplog.set_level(logging.DEBUG)
    errors: list[PolicyError] = []
    async with policy(server, "status-401", api_key=KEY) as p:
        assert KEY not in repr(p)
        with pytest.raises(PolicyError) as info:
            await p.generate(TASK, TOOLS)
        errors.append(info.value)
    async with policy(server, "flaky", api_key=KEY) as p:
        await p.generate(TASK, TOOLS)
    async with policy(server, "status-502", api_key=KEY, retry_budget_s=5.0) as p:
        with pytest.raises(PolicyError) as info:
            await p.generate(TASK, TOOLS)
        errors.append(info.value)
    assert server.authorizations[0] == f"Bearer {KEY}"  # the server did see it
    assert "invalid credentials: Bearer [REDACTED]" in str(errors[0])
    for error in errors:
        assert KEY not in str(error) and KEY not in repr(error)
        assert error.__cause__ is None or KEY not in str(error.__cause__)
    assert caplog.records, "the retries should have been logged"
    assert KEY not in caplog.text
    assert all(KEY not in str(r.args) for r in caplog.records)


def test_importing_the_client_does_not_import_httpx() -> None:
    code = (
        "import sys, sandlot, sandlot.rollout, sandlot.rollout.llm; "
        "sys.exit('httpx' in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
