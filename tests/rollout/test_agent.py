"""The agent loop core (``run_episode``) on ``local``: real sandboxes, real tools, the real
evaluator, and the scripted model server behind ``OpenAIChatPolicy``.

Every test runs with ``SANDLOT_LOCAL_ROOT`` in a fresh directory and checks that it is empty
afterwards: each episode closed every sandbox it opened (its own and the evaluation's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from requirements import EVAL, TEST, bwrap_missing, need_module, needs
from rollout.scripted_server import ScriptedServer

from sandlot.datasets.rows import TaskRow
from sandlot.rollout import run_episode
from sandlot.rollout.config import AgentConfig, parse_agent_config
from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.policy import Message, PolicyError, PolicyTurn
from sandlot.rollout.trajectory import ExitReason, Trajectory

need_module("swebench", EVAL)
need_module("httpx", TEST)
pytestmark = [pytest.mark.anyio, needs(bwrap_missing), pytest.mark.usefixtures("local_root")]

KEY = "sk-agent-test-9f8e7d6c5b4a"

Connect = Callable[..., OpenAIChatPolicy]
MakeRow = Callable[..., TaskRow]


def agent_config(reward: str = "same", **interaction: Any) -> AgentConfig:
    return parse_agent_config(
        {
            "sandbox": {"backend": "local", "options": {"local": {"isolation": "bwrap"}}},
            "interaction": {"max_turns": 10, **interaction},
            "reward": {"mode": reward},
        }
    )


@pytest.fixture
async def connect(server: ScriptedServer) -> AsyncIterator[Connect]:
    """``connect(model, **kwargs)``: an ``OpenAIChatPolicy`` on the scripted server (closed at
    teardown)."""
    opened: list[OpenAIChatPolicy] = []

    def make(model: str, **kwargs: Any) -> OpenAIChatPolicy:
        kwargs.setdefault("backoff_s", 0.01)
        kwargs.setdefault("api_key", KEY)
        client = OpenAIChatPolicy(server.url, model, **kwargs)
        opened.append(client)
        return client

    yield make
    for client in opened:
        await client.aclose()


def assert_timings(traj: Trajectory) -> None:
    for key in ("start", "setup", "agent", "model", "tools", "eval", "total"):
        assert traj.timings_s.get(key, 0.0) >= 0.0, key
    assert traj.timings_s["total"] >= traj.timings_s.get("agent", 0.0)


# ----------------------------------------------------------------------------- solving


@pytest.mark.slow
@pytest.mark.parametrize(
    ("native", "reward"), [(False, "fresh"), (True, "same")], ids=["text-fresh", "native-same"]
)
async def test_the_solver_resolves_instances(
    make_row: MakeRow, connect: Connect, server: ScriptedServer, native: bool, reward: str
) -> None:
    """Three instances at once (one of them a two-file fix), through view, ``str_replace``,
    a test run and ``submit``: each resolved, reward 1.0."""
    ids = ["minicalc__minicalc-1", "textkit__textkit-1", "ledger__ledger-2"]
    policy = connect("solver", native_tools=native)
    config = agent_config(reward)
    trajectories: dict[str, Trajectory] = {}

    async def one(instance_id: str) -> None:
        trajectories[instance_id] = await run_episode(
            make_row(instance_id), policy, config, model_name_or_path="scripted-solver"
        )

    async with anyio.create_task_group() as tg:
        for instance_id in ids:
            tg.start_soon(one, instance_id)

    for instance_id, traj in trajectories.items():
        assert traj.exit_reason is ExitReason.SUBMITTED, (instance_id, traj.error)
        assert traj.reward == 1.0 and traj.resolved, traj.eval
        assert traj.format_errors == 0 and traj.tool_timeouts == 0
        assert traj.model_name_or_path == "scripted-solver"
        assert traj.eval is not None and traj.eval.model_name_or_path == "scripted-solver"
        assert traj.model_patch.startswith("diff --git")
        tools = [o.tool for step in traj.steps for o in step.observations]
        assert tools[0] == "str_replace_editor" and tools[-2:] == ["bash", "submit"]
        assert all(o.status == "ok" for step in traj.steps for o in step.observations)
        assert traj.usage.prompt_tokens > 0 and traj.usage.completion_tokens > 0
        assert_timings(traj)
        roles = [m["role"] for m in traj.messages]
        assert roles[:2] == ["system", "user"] and roles.count("assistant") == traj.num_turns
        if native:
            assert all("tool_call_id" in m for m in traj.messages if m["role"] == "tool")
    assert trajectories["ledger__ledger-2"].num_turns == 7  # view, four edits, tests, submit
    assert server.requests["solver"] == sum(t.num_turns for t in trajectories.values())


@pytest.mark.slow
async def test_the_flaky_server_still_solves(make_row: MakeRow, connect: Connect) -> None:
    """429s on every turn are absorbed by the client's retries."""
    traj = await run_episode(make_row("ledger__ledger-1"), connect("flaky"), agent_config())
    assert traj.exit_reason is ExitReason.SUBMITTED and traj.reward == 1.0


@pytest.mark.slow
async def test_max_turns_ends_the_episode_and_still_grades_the_diff(
    make_row: MakeRow, connect: Connect
) -> None:
    """Two turns (view, the fix): no ``submit``, yet the workdir's diff is the model patch."""
    traj = await run_episode(
        make_row("minicalc__minicalc-1"), connect("solver"), agent_config(max_turns=2)
    )
    assert traj.exit_reason is ExitReason.MAX_TURNS and traj.num_turns == 2
    assert "+    return a / b\n" in traj.model_patch
    assert traj.reward == 1.0


# ----------------------------------------------------------------------------- the model misbehaves


@pytest.mark.parametrize("native", [False, True], ids=["text", "native"])
async def test_garbage_is_format_errors_and_reward_zero(
    make_row: MakeRow, connect: Connect, native: bool
) -> None:
    """Broken markup, an unknown tool, arguments that are not a JSON object: each turn is a
    format error the model reads, and the episode runs on until ``max_turns``."""
    traj = await run_episode(
        make_row("minicalc__minicalc-1"),
        connect("garbage", native_tools=native),
        agent_config(max_turns=4),
    )
    assert traj.exit_reason is ExitReason.MAX_TURNS and traj.error is None
    assert traj.num_turns == 4 and traj.format_errors == 4
    assert all(step.format_error for step in traj.steps)
    assert traj.model_patch == "" and traj.reward == 0.0 and not traj.resolved
    feedback = [m for m in traj.messages if m["role"] in ("user", "tool")][1:]
    assert len(feedback) == 4
    said = [m["content"] for m in feedback]
    assert "Unknown tool 'rm_rf_everything'" in said[2]
    if native:  # every native call is answered by a tool message, as the API requires
        assert all(m["role"] == "tool" and "tool_call_id" in m for m in feedback)
        assert "The arguments of bash are not valid JSON" in said[0]
        assert "The arguments of bash must be a JSON object, got list" in said[1]
        assert "The arguments of bash are not valid JSON" in said[3]
    else:
        assert [m["role"] for m in feedback] == ["user", "user", "tool", "user"]
        assert "invalid JSON inside <tool_call>" in said[0]
        assert "a </tool_call> tag has no <tool_call>" in said[1]
        assert '"arguments" is not valid JSON' in said[3]


async def test_no_tool_call_ends_the_episode(make_row: MakeRow, connect: Connect) -> None:
    traj = await run_episode(make_row("textkit__textkit-2"), connect("quitter"), agent_config())
    assert traj.exit_reason is ExitReason.NO_TOOL_CALL and traj.num_turns == 1
    assert traj.reward == 0.0


async def test_tool_timeouts_spend_the_timeout_budget(make_row: MakeRow, connect: Connect) -> None:
    """``sleep 600`` past ``action_timeout`` on every turn: the second timeout ends it."""
    config = agent_config(action_timeout=0.5, timeout_budget=2, max_turns=10)
    started = anyio.current_time()
    traj = await run_episode(make_row("ledger__ledger-1"), connect("stall"), config)
    assert traj.exit_reason is ExitReason.TIMEOUT_BUDGET
    assert traj.num_turns == 2 and traj.tool_timeouts == 2
    statuses = [o.status for step in traj.steps for o in step.observations]
    assert statuses == ["timeout", "timeout"]
    assert (
        "was cancelled because it took more than 0.5 seconds"
        in traj.steps[0].observations[0].output
    )
    assert anyio.current_time() - started < 30


async def test_context_overflow_ends_as_context_length_not_infra_error(
    make_row: MakeRow, connect: Connect
) -> None:
    traj = await run_episode(make_row("ledger__ledger-1"), connect("overflow"), agent_config())
    assert traj.exit_reason is ExitReason.CONTEXT_LENGTH
    assert traj.error and "maximum context length" in traj.error
    assert traj.num_turns == 0 and traj.steps == []
    assert traj.eval is not None and traj.reward == 0.0


async def test_the_api_key_is_redacted_from_the_trajectory(
    make_row: MakeRow, connect: Connect
) -> None:
    """The ``leaker`` writes the key it was sent into its text and runs ``echo <key>``."""
    for native in (False, True):
        traj = await run_episode(
            make_row("ledger__ledger-1"), connect("leaker", native_tools=native), agent_config()
        )
        assert traj.exit_reason is ExitReason.SUBMITTED
        dump = traj.model_dump_json()
        assert KEY not in dump
        assert traj.steps[0].observations[0].output == "[REDACTED]\n"
        assert "[REDACTED]" in traj.steps[0].content


# ----------------------------------------------------------------------------- infrastructure


async def test_a_server_error_is_a_retryable_infra_error(
    make_row: MakeRow, connect: Connect
) -> None:
    traj = await run_episode(
        make_row("minicalc__minicalc-1"), connect("status-503", retry_budget_s=0.05), agent_config()
    )
    assert traj.exit_reason is ExitReason.INFRA_ERROR and traj.retryable
    assert traj.error and traj.error.startswith("model server:") and "HTTP 503" in traj.error
    assert traj.eval is None and traj.reward == 0.0


async def test_a_rejected_request_is_a_final_infra_error(
    make_row: MakeRow, connect: Connect
) -> None:
    traj = await run_episode(
        make_row("minicalc__minicalc-1"), connect("status-400"), agent_config()
    )
    assert traj.exit_reason is ExitReason.INFRA_ERROR and not traj.retryable
    assert traj.error and "HTTP 400" in traj.error


class _Raising:
    """A policy that fails on its second turn."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0

    async def generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        self.calls += 1
        if self.calls > 1:
            raise self.exc
        return PolicyTurn(content='<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}')

    def secrets(self) -> list[str]:
        return []


@pytest.mark.parametrize(
    ("exc", "retryable", "error"),
    [
        (PolicyError("trainer's server_manager is gone"), True, "model server: trainer's"),
        (RuntimeError("policy bug"), False, "unexpected RuntimeError: policy bug"),
    ],
    ids=["policy-error", "bug"],
)
async def test_a_raising_policy_is_an_infra_error(
    make_row: MakeRow, exc: Exception, retryable: bool, error: str
) -> None:
    traj = await run_episode(make_row("textkit__textkit-3"), _Raising(exc), agent_config())
    assert traj.exit_reason is ExitReason.INFRA_ERROR
    assert traj.retryable is retryable
    assert traj.error is not None and traj.error.startswith(error)


async def test_an_image_map_without_the_backend_is_an_infra_error(
    make_row: MakeRow, connect: Connect
) -> None:
    row = make_row("minicalc__minicalc-1", image={"docker": "python:3.12"})
    traj = await run_episode(row, connect("solver"), agent_config())
    assert traj.exit_reason is ExitReason.INFRA_ERROR and not traj.retryable
    assert traj.error and "not for backend 'local'" in traj.error
    assert traj.num_turns == 0


async def test_a_missing_root_filesystem_is_an_infra_error(
    make_row: MakeRow, connect: Connect, tmp_path: Path
) -> None:
    row = make_row("minicalc__minicalc-1", image=str(tmp_path / "no-such-rootfs"), environment=None)
    traj = await run_episode(row, connect("solver"), agent_config())
    assert traj.exit_reason is ExitReason.INFRA_ERROR and not traj.retryable
    assert traj.error and traj.error.startswith("sandbox (SandboxStartError)")
    assert "is not a directory" in traj.error
    assert traj.num_turns == 0


async def test_deployment_overrides_the_configs_backend(
    make_row: MakeRow, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config for ``docker`` runs on ``local`` with ``DEPLOYMENT=local``: one variable."""
    config = parse_agent_config(
        {
            "sandbox": {"backend": "docker", "options": {"docker": {"pull": "never"}}},
            "interaction": {"max_turns": 1},
        }
    )
    monkeypatch.setenv("DEPLOYMENT", "local")
    traj = await run_episode(make_row("minicalc__minicalc-1"), connect("garbage"), config)
    assert traj.exit_reason is ExitReason.MAX_TURNS and traj.error is None
    assert traj.timings_s["start"] > 0
