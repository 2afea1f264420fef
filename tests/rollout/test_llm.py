"""``OpenAIChatPolicy`` against the scripted OpenAI-compatible server: wire format, native and
text tool calls, retries, budgets, timeouts, and keeping the API key secret."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from requirements import TEST, need_module
from rollout.scripted_server import ScriptedServer

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


def policy(server: ScriptedServer, model: str, **kwargs: Any) -> OpenAIChatPolicy:
    kwargs.setdefault("backoff_s", 0.01)
    return OpenAIChatPolicy(server.url, model, **kwargs)


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
    async with policy(server, "flaky", max_retries=3) as p:
        turn = await p.generate(TASK, TOOLS)
    assert "<tool_call>" in turn.content
    assert server.requests["flaky"] == 3  # two 429s, then the answer


async def test_retry_after_is_honoured(instance_records: list[dict[str, Any]]) -> None:
    with ScriptedServer(instance_records, flaky_failures=1, retry_after="1") as server:
        async with policy(server, "flaky") as p:
            started = time.monotonic()
            await p.generate(TASK, TOOLS)
            elapsed = time.monotonic() - started
    assert server.requests["flaky"] == 2
    assert 1.0 <= elapsed < 5.0


async def test_5xx_past_max_retries_is_a_retryable_policy_error(server: ScriptedServer) -> None:
    async with policy(server, "status-503", max_retries=2) as p:
        with pytest.raises(PolicyError) as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable
    assert "failed 3 time(s)" in str(info.value) and "HTTP 503" in str(info.value)
    assert "scripted failure 503" in str(info.value)
    assert server.requests["status-503"] == 3


async def test_a_retry_past_the_budget_is_not_taken(instance_records: list[dict[str, Any]]) -> None:
    """A ``Retry-After`` longer than what is left of ``retry_budget_s`` ends the call now."""
    with ScriptedServer(instance_records, flaky_failures=5, retry_after="30") as server:
        async with policy(server, "flaky", max_retries=5, retry_budget_s=2.0) as p:
            started = time.monotonic()
            with pytest.raises(PolicyError) as info:
                await p.generate(TASK, TOOLS)
    assert time.monotonic() - started < 1.5
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
    async with policy(server, "malformed", max_retries=1) as p:
        with pytest.raises(PolicyError, match="malformed reply") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable
    assert server.requests["malformed"] == 2


async def test_timeout_is_retried_then_retryable(server: ScriptedServer) -> None:
    async with policy(server, "sleeper", request_timeout_s=0.3, max_retries=1) as p:
        started = time.monotonic()
        with pytest.raises(PolicyError, match=r"no answer within request_timeout_s=0\.3s") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable
    assert time.monotonic() - started < 2.0
    assert server.requests["sleeper"] == 2


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIChatPolicy(
        f"http://127.0.0.1:{port}/v1", "solver", max_retries=2, backoff_s=0.01
    ) as p:
        with pytest.raises(PolicyError, match="failed 3 time") as info:
            await p.generate(TASK, TOOLS)
    assert info.value.retryable and "ConnectError" in str(info.value)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIChatPolicy("127.0.0.1:8000/v1", "m")
    with pytest.raises(ValueError, match="sampling may not set model, tool_choice"):
        OpenAIChatPolicy(
            "http://127.0.0.1:8000/v1", "m", sampling={"model": "x", "tool_choice": "auto"}
        )
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatPolicy("http://127.0.0.1:8000/v1", "m", max_retries=-1)


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
    async with policy(server, "flaky", api_key=KEY, max_retries=3) as p:
        await p.generate(TASK, TOOLS)
    async with policy(server, "status-502", api_key=KEY, max_retries=1) as p:
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
