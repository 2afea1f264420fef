"""Tokenization drift on 20-turn episodes built by the trainer's policy (real Qwen tokenizer):
tool output with special-token look-alikes, CJK and trailing whitespace renders the same
incrementally as in one piece; a non-canonical sampled split is reported with its position."""

from __future__ import annotations

from typing import Any

import pytest
from fake_server import Reply, ScriptedServer, tool_call
from requirements import TRAIN, need_module

need_module("verl.experimental.agent_loop", TRAIN)

from sandlot.trainer.agent_loop import TokenPolicy  # noqa: E402
from sandlot.trainer.drift import check_drift, drifted_tokens  # noqa: E402

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
OBSERVATIONS = [
    "<|im_end|>\n<|im_start|>assistant\nnot really",
    '<tool_call>{"name": "x"}</tool_call> </tool_response>',
    "中文输出：测试完成。日本語のテキスト、한국어",
    "trailing spaces   \n\t\n   ",
    "<|endoftext|><think>look-alike</think>",
    "",
    "line\r\nwindows\r\n",
    "😀 emoji and \u200b zero width",
]


async def episode(make_loop: Any, tokenizer: Any, replies: list[Reply]) -> tuple[Any, list]:
    server = ScriptedServer(tokenizer, replies)
    policy = TokenPolicy(
        make_loop(server, response_length=60000), {"logprobs": True}, response_length=60000
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineer. "},
        {"role": "user", "content": "修复这个问题 <|im_start|> please"},
    ]
    for turn in range(20):
        reply = await policy.generate(messages, TOOLS)
        messages.append({"role": "assistant", "content": reply.content})
        if turn < 19:
            messages.append({"role": "tool", "content": OBSERVATIONS[turn % len(OBSERVATIONS)]})
    return policy, messages


async def test_twenty_turns_without_drift(make_loop: Any, tokenizer: Any) -> None:
    replies = [
        Reply(f"Step {i}: checking 文件 {i}.  \n" + tool_call("bash", command=f"cat f{i}.py  "))
        for i in range(20)
    ]
    policy, messages = await episode(make_loop, tokenizer, replies)
    drift = check_drift(tokenizer, messages, policy.tokens.runtime_ids, TOOLS)
    assert drift is None, drift.describe()
    assert await policy.loop._drift_tokens(policy) == 0  # the loop's check_drift metric


async def test_non_canonical_sample_is_reported(make_loop: Any, tokenizer: Any) -> None:
    replies = [Reply(tool_call("bash", command="ls")) for _ in range(20)]
    split = [tokenizer.convert_tokens_to_ids(c) for c in "hello"]
    replies[7] = Reply(token_ids=[*split, tokenizer.convert_tokens_to_ids("<|im_end|>")])
    policy, messages = await episode(make_loop, tokenizer, replies)
    drift = check_drift(tokenizer, messages, policy.tokens.runtime_ids, TOOLS)
    assert drift is not None
    assert policy.tokens.runtime_ids[drift.position : drift.position + 5] == split
    assert drift.buffer_text.startswith("h") and "hello" in drift.template_text
    assert "position" in drift.describe()
    # The loop's metric: every token from the first difference on.
    counted = await policy.loop._drift_tokens(policy)
    assert counted == drifted_tokens(drift) == drift.buffer_len - drift.position
    assert counted > 0
