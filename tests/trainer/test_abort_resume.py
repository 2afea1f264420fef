"""Partial rollout through verl's real ``FullyAsyncLLMServerClient``: a weight sync aborts a
generation mid-reply, the client resubmits prompt + the tokens so far under the same sticky
``request_id`` (verl.md §2.4), and ``TokenPolicy`` must see one uninterrupted turn.

The client, verl's ``GlobalRequestLoadBalancer`` and the fake replica
(``fake_server.AbortOnceServer``) are wired as in the fully-async trainer: the balancer and the
replica are Ray actors, the client is a plain object in the test process. The client sleeps 1 s
before each resume, hence ``slow``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_server import AbortOnceServer, tool_call
from requirements import TRAIN, need_module

need_module("verl.experimental.agent_loop", TRAIN)
llm_server = need_module("verl.workers.rollout.llm_server", TRAIN)
ray = need_module("ray", TRAIN)

from sandlot.rollout.policy import PolicyError  # noqa: E402
from sandlot.trainer.agent_loop import TokenPolicy  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RESPONSE_LENGTH = 4096
PROMPT = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the bug."},
]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    path = os.pathsep.join([str(ROOT), str(Path(__file__).parent)])  # fake_server for actors
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield
    finally:
        ray.shutdown()


def encode(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return [*ids, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def client_over(server: Any, *, partial_rollout: bool) -> Any:
    """verl's fully-async client routed by verl's balancer to ``server`` alone."""
    from omegaconf import OmegaConf

    balancer = ray.remote(llm_server.GlobalRequestLoadBalancer).remote(servers={"fake": server})
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"name": "vllm", "response_length": RESPONSE_LENGTH},
            },
            "async_training": {"partial_rollout": partial_rollout},
        }
    )
    return llm_server.FullyAsyncLLMServerClient(config=config, load_balancer_handle=balancer)


async def test_an_aborted_reply_is_resumed_into_one_turn(
    ray_cluster: None, make_loop: Any, tokenizer: Any
) -> None:
    first = encode(tokenizer, "Looking.\n" + tool_call("bash", command="ls -la"))
    second = encode(tokenizer, "Done, 修好了.")
    cut = len(first) // 2  # inside the tool call's JSON
    server = ray.remote(AbortOnceServer).remote([first, second], abort_turn=0, abort_after=cut)
    client = client_over(server, partial_rollout=True)
    policy = TokenPolicy(
        make_loop(client), {"temperature": 1.0, "logprobs": True}, response_length=RESPONSE_LENGTH
    )

    messages: list[dict[str, Any]] = [dict(m) for m in PROMPT]
    turn = await policy.generate(messages, [])
    messages += [{"role": "assistant", "content": turn.content}, {"role": "tool", "content": "x"}]
    last = await policy.generate(messages, [])
    calls = await server.calls.remote()
    tokens = policy.tokens

    # The server was interrupted once: the resume carried prompt + the partial tokens and the
    # rest of the budget; the policy saw neither.
    assert [c["stop_reason"] for c in calls] == ["aborted", "completed", "completed"]
    assert calls[1]["prompt_ids"] == calls[0]["prompt_ids"] + first[:cut]
    assert calls[1]["max_tokens"] == calls[0]["max_tokens"] - cut
    assert tokens.num_generations == 2
    assert turn.completion_tokens == len(first) and turn.finish_reason == "stop"
    assert turn.content == tokenizer.decode(first[:-1], skip_special_tokens=False)
    assert last.content == "Done, 修好了."

    # One uninterrupted turn in the buffer: the reply's ids verbatim, all trained on.
    response = tokens.response_ids
    assert response[: len(first)] == first
    assert tokens.response_mask[: len(first)] == [1] * len(first)
    assert [t for t, m in zip(response, tokens.response_mask, strict=True) if m] == first + second
    # Log-probs aligned across the abort: token i of a reply has -(i + 1) / 1000.
    expected = [-(i + 1) / 1000 for i in range(len(first))]
    assert tokens.response_logprobs is not None
    assert tokens.response_logprobs[: len(first)] == expected
    sampled = [
        lp for lp, m in zip(tokens.response_logprobs, tokens.response_mask, strict=True) if m
    ]
    assert sampled == expected + [-(i + 1) / 1000 for i in range(len(second))]
    # The trajectory spans the policy versions before and after the sync.
    assert tokens.extra_fields["min_global_steps"] == 0
    assert tokens.extra_fields["max_global_steps"] == 1


async def test_without_partial_rollout_the_aborted_turn_fails_the_policy(
    ray_cluster: None, make_loop: Any, tokenizer: Any
) -> None:
    first = encode(tokenizer, "Looking.\n" + tool_call("bash", command="ls"))
    server = ray.remote(AbortOnceServer).remote([first], abort_turn=0, abort_after=3)
    policy = TokenPolicy(
        make_loop(client_over(server, partial_rollout=False)),
        {"logprobs": True},
        response_length=RESPONSE_LENGTH,
    )
    with pytest.raises(PolicyError, match="aborted"):
        await policy.generate([dict(m) for m in PROMPT], [])
    assert [c["stop_reason"] for c in await server.calls.remote()] == ["aborted"]
    assert policy.tokens.response_mask == []  # nothing of the cut reply is trained on
