"""Fake verl LLM servers whose "models" are scripted policies, encoded with a real tokenizer.

``ScriptedServer`` has the ``generate`` of verl's ``LLMServerClient`` (what an agent loop sees
as ``self.server_manager``): for each request it takes the next reply of the trajectory's script
(keyed by ``request_id``), encodes it the way a model samples it (text + ``<|im_end|>``, or the
given token ids verbatim), and returns a ``TokenOutput`` with log-probs when asked and
``global_steps`` in ``extra_fields``. It records every request for the assertions.

A script is a callable ``(messages_so_far_as_token_ids, turn) -> Reply``; :func:`solver` and
:func:`failer` solve or fail a swe-mini instance through the real tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from verl.workers.rollout.replica import TokenOutput
except ImportError:  # the test modules then skip (fail under CI=true) through need_module
    TokenOutput = None


@dataclass
class Reply:
    """One scripted turn: ``text`` (encoded + ``<|im_end|>``) or ``token_ids`` verbatim."""

    text: str = ""
    token_ids: list[int] | None = None
    stop_reason: str = "completed"


def tool_call(name: str, **arguments: Any) -> str:
    """A hermes tool call, as Qwen writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def solver(instance: dict[str, Any]) -> list[Reply]:
    """Apply the gold patch with ``bash`` and submit."""
    patch = instance["patch"]
    command = (
        f"cd {instance.get('workdir', '/testbed')} && git apply <<'SANDLOT_EOF'\n{patch}SANDLOT_EOF"
    )
    return [
        Reply("I will apply the fix.\n" + tool_call("bash", command=command)),
        Reply("Done.\n" + tool_call("submit")),
    ]


def failer(instance: dict[str, Any]) -> list[Reply]:
    """Look around, change nothing, submit."""
    return [
        Reply("Let me look.\n" + tool_call("bash", command="ls")),
        Reply(tool_call("submit")),
    ]


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    reply_ids: list[int] = field(default_factory=list)


class ScriptedServer:
    """verl's ``server_manager.generate`` over scripted replies (see the module docstring).

    Args:
        tokenizer: encodes the replies.
        script: the replies of every trajectory, in order (after the last: a plain text reply).
        logprob: the log-prob returned for every sampled token.
        global_steps: the policy version reported (``extra_fields``).
    """

    def __init__(
        self,
        tokenizer: Any,  # or the path of a tokenizer directory (loaded where it is used)
        script: list[Reply] | Callable[[str], list[Reply]],
        *,
        logprob: float = -0.5,
        global_steps: int = 3,
    ) -> None:
        self._tokenizer = tokenizer
        self.script = script
        self.logprob = logprob
        self.global_steps = global_steps
        self.requests: list[Request] = []
        self._turns: dict[str, int] = {}

    @property
    def tokenizer(self) -> Any:
        if isinstance(self._tokenizer, str):
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer)
        return self._tokenizer

    @property
    def im_end(self) -> int:
        token: int = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        return token

    def encode_reply(self, reply: Reply) -> list[int]:
        if reply.token_ids is not None:
            return list(reply.token_ids)
        ids: list[int] = self.tokenizer.encode(reply.text, add_special_tokens=False)
        return [*ids, self.im_end]

    def replies_for(self, prompt_ids: list[int]) -> list[Reply]:
        if callable(self.script):
            return self.script(self.tokenizer.decode(prompt_ids))
        return self.script

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        turn = self._turns.get(request_id, 0)
        self._turns[request_id] = turn + 1
        replies = self.replies_for(prompt_ids)
        reply = replies[turn] if turn < len(replies) else Reply("I am done.")
        ids = self.encode_reply(reply)
        stop = reply.stop_reason
        limit = sampling_params.get("max_tokens")
        if limit is not None and len(ids) >= limit:
            ids, stop = ids[:limit], "length"
        self.requests.append(Request(request_id, list(prompt_ids), dict(sampling_params), ids))
        steps = self.global_steps + turn
        return TokenOutput(
            token_ids=ids,
            log_probs=[self.logprob] * len(ids) if sampling_params.get("logprobs") else None,
            stop_reason=stop,
            num_preempted=0,
            extra_fields={
                "global_steps": steps,
                "min_global_steps": steps,
                "max_global_steps": steps,
            },
        )


class ByInstance:
    """A picklable script: the prompt names the instance (``<task id=...>``) and the policy
    (``policy=solver`` or ``policy=failer``)."""

    def __init__(self, instances: dict[str, dict[str, Any]]) -> None:
        self.instances = instances

    def __call__(self, prompt: str) -> list[Reply]:
        instance_id = prompt.split("<task id=", 1)[1].split(">", 1)[0]
        policy = solver if "policy=solver" in prompt else failer
        return policy(self.instances[instance_id])


class AbortOnceServer:
    """A vLLM replica stand-in for verl's ``FullyAsyncLLMServerClient`` (run it as a Ray actor:
    the load balancer hands out its handle). It returns ``replies`` (token ids) in order, one per
    turn; turn ``abort_turn`` is cut after ``abort_after`` tokens with ``stop_reason="aborted"``,
    as vLLM's ``pause_generation`` does at a weight sync, and the policy version
    (``global_steps``) rises by one. The resumed request (prompt + the partial tokens) gets the
    rest. The ``i``-th token of a reply has log-prob ``-(i + 1) / 1000``, so misaligned
    log-probs show. ``calls()`` returns what each request carried."""

    def __init__(self, replies: list[list[int]], *, abort_turn: int, abort_after: int) -> None:
        self.replies = replies
        self.abort_turn = abort_turn
        self.abort_after = abort_after
        self.steps = 0
        self._turn = 0
        self._done = 0  # tokens of the current reply already returned
        self._calls: list[dict[str, Any]] = []

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        reply = self.replies[self._turn]
        start = self._done
        aborting = self._turn == self.abort_turn and start == 0
        end, stop = (self.abort_after, "aborted") if aborting else (len(reply), "completed")
        limit = sampling_params.get("max_tokens")
        if limit is not None and end - start > limit:
            end, stop = start + limit, "length"
        self._calls.append(
            {"prompt_ids": list(prompt_ids), "max_tokens": limit, "stop_reason": stop}
        )
        steps = self.steps
        if stop == "aborted":
            self._done, self.steps = end, self.steps + 1
        else:
            self._done, self._turn = 0, self._turn + 1
        return TokenOutput(
            token_ids=reply[start:end],
            log_probs=[-(i + 1) / 1000 for i in range(start, end)]
            if sampling_params.get("logprobs")
            else None,
            stop_reason=stop,
            num_preempted=0,
            extra_fields={"global_steps": steps},
        )

    def calls(self) -> list[dict[str, Any]]:
        return self._calls
