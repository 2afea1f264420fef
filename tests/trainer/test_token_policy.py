"""Token bookkeeping of the trainer's policy and of the mapping to verl's ``AgentLoopOutput``,
with a real Qwen tokenizer and a fake ``server_manager`` (no sandbox)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import yaml
from fake_server import Reply, ScriptedServer, tool_call
from requirements import TRAIN, need_module

need_module("verl.experimental.agent_loop", TRAIN)

from sandlot.rollout.dump import DUMP_GLOB  # noqa: E402
from sandlot.rollout.policy import ContextLengthError, PolicyError  # noqa: E402
from sandlot.rollout.store import iter_trajectories  # noqa: E402
from sandlot.rollout.trajectory import ExitReason, Trajectory  # noqa: E402
from sandlot.trainer.agent_loop import TokenPolicy  # noqa: E402
from sandlot.trainer.drift import template_ids  # noqa: E402
from sandlot.trainer.mapping import TokenBuffer, to_agent_loop_output  # noqa: E402

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
PROMPT = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix <task id=x>. 修复它 "},
]


async def drive(policy: TokenPolicy, observations: list[str]) -> list[Any]:
    """Play the agent loop's part: after each reply append it and the next observation."""
    messages: list[dict[str, Any]] = [dict(m) for m in PROMPT]
    turns = []
    for observation in [*observations, None]:
        turn = await policy.generate(messages, TOOLS)
        turns.append(turn)
        messages.append({"role": "assistant", "content": turn.content})
        if observation is None or turn.finish_reason == "length":
            break
        messages.append({"role": "tool", "content": observation})
    return turns


def sampled_positions(server: ScriptedServer, tokens: TokenBuffer) -> list[int]:
    """Where each request's reply sits in the response (request i's prompt length - prompt)."""
    marks = [0] * len(tokens.response_mask)
    base = len(tokens.prompt_ids)
    for request in server.requests:
        start = len(request.prompt_ids) - base
        for i in range(start, start + len(request.reply_ids)):
            if i < len(marks):
                marks[i] = 1
    return marks


async def test_sampled_tokens_are_kept_verbatim_and_only_they_are_trained(
    make_loop: Any, tokenizer: Any
) -> None:
    # The second reply is sampled as one token per character: a valid sequence that the
    # tokenizer would never produce from the text; it must reach the trainer unchanged.
    odd = [tokenizer.convert_tokens_to_ids(c) for c in "okay"] + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    script = [
        Reply("Looking.\n" + tool_call("bash", command="ls")),
        Reply(token_ids=odd),
        Reply(tool_call("bash", command="echo 你好 ")),
    ]
    server = ScriptedServer(tokenizer, script)
    policy = TokenPolicy(
        make_loop(server), {"temperature": 1.0, "logprobs": True}, response_length=4096
    )
    turns = await drive(policy, ["a.py\nb.py  \n", "<|im_end|> fake <tool_call> 汉字\t \n"])
    tokens = policy.tokens

    assert [t.content for t in turns][1] == "okay"
    assert len({r.request_id for r in server.requests}) == 1  # one request_id per trajectory
    for request in server.requests:  # each request continues the buffer as it was
        assert tokens.runtime_ids[: len(request.prompt_ids)] == request.prompt_ids
        start = len(request.prompt_ids)
        assert tokens.runtime_ids[start : start + len(request.reply_ids)] == request.reply_ids
        assert request.sampling_params["max_tokens"] == 4096 - (start - len(tokens.prompt_ids))
    assert tokens.response_mask == sampled_positions(server, tokens)
    assert tokens.response_logprobs == [-0.5 if m else 0.0 for m in tokens.response_mask]
    # The prompt is the chat template's rendering, tools included.
    assert tokens.prompt_ids == template_ids(tokenizer, PROMPT, TOOLS, add_generation_prompt=True)
    # The look-alike in the observation is text the template renders, never a sampled token.
    decoded = tokenizer.decode(tokens.response_ids)
    assert "<tool_response>\n<|im_end|> fake <tool_call> 汉字\t \n\n</tool_response>" in decoded
    assert tokens.extra_fields["min_global_steps"] == 3
    assert tokens.extra_fields["max_global_steps"] == 5


async def test_no_logprobs_unless_requested(make_loop: Any, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, [Reply(tool_call("bash", command="ls")), Reply("done")])
    policy = TokenPolicy(make_loop(server), {"logprobs": False}, response_length=4096)
    await drive(policy, ["x"])
    assert policy.tokens.response_logprobs is None
    traj = Trajectory(instance_id="x", exit_reason=ExitReason.NO_TOOL_CALL, reward=0.0)
    output = to_agent_loop_output(
        traj, policy.tokens, response_length=4096, logprobs=False, pad_token_id=0
    )
    assert output.response_logprobs is None
    assert output.response_mask == policy.tokens.response_mask


async def test_response_length_is_the_trajectory_budget(make_loop: Any, tokenizer: Any) -> None:
    long = "word " * 40
    server = ScriptedServer(tokenizer, [Reply(tool_call("bash", command="ls")), Reply(long)])
    first = len(server.encode_reply(Reply(tool_call("bash", command="ls"))))
    budget = first + 30
    policy = TokenPolicy(make_loop(server), {"logprobs": True}, response_length=budget)
    turns = await drive(policy, ["out"])
    assert turns[-1].finish_reason == "length"
    asked = server.requests[-1].sampling_params["max_tokens"]
    assert asked == budget - (len(server.requests[-1].prompt_ids) - len(policy.tokens.prompt_ids))
    traj = Trajectory(instance_id="x", exit_reason=ExitReason.CONTEXT_LENGTH, reward=1.0)
    output = to_agent_loop_output(
        traj, policy.tokens, response_length=budget, logprobs=True, pad_token_id=0
    )
    assert len(output.response_ids) == len(output.response_mask) == budget
    assert len(output.response_logprobs) == budget
    # A next turn with nothing left is refused before any request.
    with pytest.raises(ContextLengthError):
        await policy.generate([*PROMPT, {"role": "assistant", "content": "x"}], TOOLS)


async def test_aborted_generation_and_missing_logprobs_are_policy_errors(
    make_loop: Any, tokenizer: Any
) -> None:
    server = ScriptedServer(tokenizer, [Reply("partial", stop_reason="aborted")])
    policy = TokenPolicy(make_loop(server), {"logprobs": True}, response_length=4096)
    with pytest.raises(PolicyError, match="aborted"):
        await policy.generate([dict(m) for m in PROMPT], TOOLS)

    class NoLogprobs(ScriptedServer):
        async def generate(self, request_id: str, **kwargs: Any) -> Any:
            output = await super().generate(request_id, **kwargs)
            output.log_probs = []  # what verl's fully-async client returns when none came
            return output

    server = NoLogprobs(tokenizer, [Reply("hello")])
    policy = TokenPolicy(make_loop(server), {"logprobs": True}, response_length=4096)
    with pytest.raises(PolicyError, match="log-probs"):
        await policy.generate([dict(m) for m in PROMPT], TOOLS)


async def test_mapping_masks_failures_and_chosen_exits() -> None:
    tokens = TokenBuffer(
        prompt_ids=[1, 2],
        runtime_ids=[1, 2, 7, 8, 9, 10],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -0.3],
        extra_fields={"global_steps": 6, "min_global_steps": 5, "max_global_steps": 6},
        num_generations=2,
    )
    solved = Trajectory(
        instance_id="i", exit_reason=ExitReason.SUBMITTED, reward=1.0, timings_s={"model": 2.0}
    )
    out = to_agent_loop_output(solved, tokens, response_length=3, logprobs=True, pad_token_id=0)
    assert out.response_ids == [7, 8, 9] and out.response_mask == [1, 1, 0]
    assert out.response_logprobs == [-0.1, -0.2, 0.0]
    assert out.reward_score == 1.0 and out.extra_fields["masked"] is False
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (5, 6)
    assert out.metrics.generate_sequences == 2.0

    failed = solved.model_copy(update={"exit_reason": ExitReason.INFRA_ERROR, "error": "boom"})
    out = to_agent_loop_output(failed, tokens, response_length=8, logprobs=True, pad_token_id=0)
    assert out.response_mask == [0, 0, 0, 0] and out.reward_score == 0.0
    assert out.response_logprobs == [0.0] * 4
    assert out.extra_fields["mask_reason"] == "infra_error"

    capped = solved.model_copy(update={"exit_reason": ExitReason.MAX_TURNS})
    out = to_agent_loop_output(
        capped, tokens, response_length=8, logprobs=True, pad_token_id=0, masked_exits=["max_turns"]
    )
    assert out.extra_fields["masked"] is True and set(out.response_mask) == {0}

    # Failed before any generation: one masked pad token, steps from the fallback.
    empty = TokenBuffer(prompt_ids=[1, 2], runtime_ids=[1, 2])
    out = to_agent_loop_output(
        failed, empty, response_length=8, logprobs=True, pad_token_id=0, fallback_global_steps=9
    )
    assert (out.response_ids, out.response_mask, out.response_logprobs) == ([0], [0], [0.0])
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 9


async def test_run_masks_a_row_that_is_not_a_sandlot_row(make_loop: Any, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, [])
    loop = make_loop(server)
    raw = np.array([{"role": "user", "content": "hi"}], dtype=object)
    output = await loop.run({"logprobs": True}, raw_prompt=raw, index=3, extra_info={})
    assert output.extra_fields["exit_reason"] == "infra_error"
    assert "not a sandlot row" in output.extra_fields["error"]
    assert output.reward_score == 0.0 and set(output.response_mask) == {0}
    assert output.response_logprobs == [0.0] * len(output.response_ids)
    expected = template_ids(
        tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert output.prompt_ids == expected
    assert not server.requests


class Routing(ScriptedServer):
    """A MoE server: each reply carries expert ids over its whole context (2 layers, top 2)."""

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        output = await super().generate(request_id, **kwargs)
        length = len(kwargs["prompt_ids"]) + len(output.token_ids)
        output.routed_experts = np.full((length, 2, 2), len(self.requests), dtype=np.int16)
        return output


async def test_routed_experts_of_the_last_call_reach_verl(make_loop: Any, tokenizer: Any) -> None:
    server = Routing(tokenizer, [Reply("one " + tool_call("bash", command="ls")), Reply("two")])
    policy = TokenPolicy(make_loop(server), {"logprobs": True}, response_length=4096)
    await drive(policy, ["files"])
    tokens = policy.tokens
    assert tokens.routed_experts is not None and int(tokens.routed_experts[0, 0, 0]) == 2
    done = Trajectory(instance_id="i", exit_reason=ExitReason.SUBMITTED, reward=1.0)
    out = to_agent_loop_output(done, tokens, response_length=10, logprobs=True, pad_token_id=0)
    assert out.routed_experts.shape == (len(tokens.prompt_ids) + 10, 2, 2)

    # Router replay on, the sample never generated: zeros, so verl's batch still concatenates.
    failed = done.model_copy(update={"exit_reason": ExitReason.INFRA_ERROR})
    empty = TokenBuffer(prompt_ids=[1, 2, 3], runtime_ids=[1, 2, 3])
    out = to_agent_loop_output(
        failed, empty, response_length=8, logprobs=True, pad_token_id=0, routing_shape=(2, 2)
    )
    assert out.routed_experts.shape == (4, 2, 2) and not out.routed_experts.any()
    plain = to_agent_loop_output(failed, empty, response_length=8, logprobs=True, pad_token_id=0)
    assert plain.routed_experts is None


# --------------------------------------------------------------------------- generation config


def agent_config_with(tmp_path: Any, generation: dict[str, Any]) -> str:
    path = tmp_path / "generation_agent_config.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local"}, "generation": generation}))
    return str(path)


async def test_the_generation_block_is_laid_over_verls_sampling(
    make_loop: Any, tokenizer: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent config's ``generation`` reaches verl's server as ``sandlot rollout`` sends it
    to an OpenAI server: sampling over verl's, ``max_tokens`` capping the budget, and the chat
    template's kwargs in the prompt builder."""
    server = ScriptedServer(tokenizer, [Reply("hi")])
    generation = {
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["</answer>"],
        "max_tokens": 7,
        "extra_body": {"top_k": 20},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    loop = make_loop(server, agent_config=agent_config_with(tmp_path, generation))
    assert loop.apply_chat_template_kwargs == {"enable_thinking": False}
    assert loop.continuous_token_builder.chat_template_kwargs == {"enable_thinking": False}

    async def one_turn(policy: TokenPolicy, row: Any) -> Trajectory:
        # What the agent loop core passes when the config sets max_tokens.
        await policy.generate([dict(m) for m in PROMPT], TOOLS, max_tokens=7)
        return Trajectory(instance_id="x", exit_reason=ExitReason.NO_TOOL_CALL)

    monkeypatch.setattr(type(loop), "_episode", lambda self, policy, row: one_turn(policy, row))
    verl = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    await loop.run(verl, raw_prompt=np.array(PROMPT, dtype=object), extra_info={})
    (request,) = server.requests
    assert request.sampling_params == {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "logprobs": True,
        "stop": ["</answer>"],
        "max_tokens": 7,
    }


async def test_max_tokens_never_exceeds_whats_left(make_loop: Any, tokenizer: Any) -> None:
    server = ScriptedServer(tokenizer, [Reply("hi")])
    policy = TokenPolicy(make_loop(server), {"logprobs": False}, response_length=5)
    await policy.generate([dict(m) for m in PROMPT], TOOLS, max_tokens=100)
    assert server.requests[0].sampling_params["max_tokens"] == 5


async def test_a_response_length_other_than_verls_masks_samples_naming_both(
    make_loop: Any, tokenizer: Any, tmp_path: Any
) -> None:
    server = ScriptedServer(tokenizer, [])
    path = agent_config_with(tmp_path, {"response_length": 1000})
    loop = make_loop(server, response_length=4096, agent_config=path)
    raw = np.array([{"role": "user", "content": "hi"}], dtype=object)
    output = await loop.run({"logprobs": True}, raw_prompt=raw, index=3, extra_info={})
    assert output.extra_fields["exit_reason"] == "infra_error"
    error = output.extra_fields["error"]
    assert "generation.response_length=1000" in error
    assert "actor_rollout_ref.rollout.response_length=4096" in error
    assert not server.requests


async def test_trajectory_dir_keeps_every_sample_for_the_audit(
    make_loop: Any, tokenizer: Any, tmp_path: Any
) -> None:
    loop = make_loop(ScriptedServer(tokenizer, []), trajectory_dir=str(tmp_path / "kept"))
    raw = np.array([{"role": "user", "content": "hi"}], dtype=object)
    for index in (3, 3):
        await loop.run({"logprobs": True}, raw_prompt=raw, index=index, extra_info={})
    (dump,) = (tmp_path / "kept").glob(DUMP_GLOB)
    kept = list(iter_trajectories(dump, latest=False))
    assert [(t.instance_id, t.exit_reason.value) for t in kept] == [("3", "infra_error")] * 2
    assert "not a sandlot row" in (kept[0].error or "")
