"""``OpenAIChatPolicy`` keeps the token ids and logprobs vLLM returns when they are asked for
(``benchmarks/llm_client.py`` compares this with the ``openai`` SDK)."""

from __future__ import annotations

import pytest
from requirements import TEST, need_module
from rollout.scripted_server import ScriptedServer

from sandlot.rollout.llm import OpenAIChatPolicy
from sandlot.rollout.policy import PolicyError

need_module("httpx", TEST)
pytestmark = pytest.mark.anyio

TASK = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Say you are done."},
]


async def test_token_ids_and_logprobs_reach_the_turn(server: ScriptedServer) -> None:
    sampling = {"logprobs": True, "return_token_ids": True}
    async with OpenAIChatPolicy(server.url, "quitter", sampling=sampling) as policy:
        turn = await policy.generate(TASK, [])
    words = turn.content.split()
    assert turn.extra["token_ids"] == [100 + i for i in range(len(words))]
    assert turn.extra["prompt_token_ids"] == [0, 1]
    assert turn.extra["logprobs"] == [-0.25] * len(words)
    assert server.bodies[-1]["return_token_ids"] is True


async def test_without_asking_the_turn_has_none(server: ScriptedServer) -> None:
    async with OpenAIChatPolicy(server.url, "quitter") as policy:
        turn = await policy.generate(TASK, [])
    assert not {"token_ids", "prompt_token_ids", "logprobs"} & set(turn.extra)


async def test_logprobs_not_in_vllms_shape_are_a_malformed_reply(server: ScriptedServer) -> None:
    class Odd(ScriptedServer):
        def answer(self, body, authorization):  # type: ignore[no-untyped-def]
            status, headers, payload = super().answer(body, authorization)
            payload["choices"][0]["logprobs"] = {"content": [{"token": "x"}]}
            return status, headers, payload

    with Odd() as odd:
        async with OpenAIChatPolicy(odd.url, "quitter", retry_budget_s=0) as policy:
            with pytest.raises(PolicyError, match="malformed reply"):
                await policy.generate(TASK, [])
