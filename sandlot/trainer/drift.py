"""Tokenization drift: does the token buffer a multi-turn episode built incrementally equal the
chat template's rendering of the same messages?

In training the trajectory is kept as tokens: the model's sampled tokens as sampled, each
observation rendered and appended (verl's Continuous Token helpers). The model at inference
time, and any later re-tokenization (SFT on saved trajectories, a reward model, a replay), sees
the chat template's rendering of the messages instead. Where the two differ, the policy is
trained on a context it will never see. Typical causes: the model sampled a non-canonical split
of its text (re-encoding the decoded text would give other ids), a template that rewrites past
turns (Qwen3 drops earlier ``<think>`` blocks), whitespace a template strips, a tool output with
text that looks like a special token.

:func:`check_drift` reports the first differing position with the decoded context on both sides.
It needs only a Hugging Face tokenizer (no verl).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def template_ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    **chat_template_kwargs: Any,
) -> list[int]:
    """The chat template's token ids for ``messages`` (whatever container the tokenizer's
    ``apply_chat_template`` returns)."""
    rendered = tokenizer.apply_chat_template(
        list(messages),
        tools=tools,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        **chat_template_kwargs,
    )
    if hasattr(rendered, "keys") and "input_ids" in rendered:
        rendered = rendered["input_ids"]
    if hasattr(rendered, "tolist"):
        rendered = rendered.tolist()
    if rendered and isinstance(rendered[0], list):  # a batch of one
        rendered = rendered[0]
    return [int(t) for t in rendered]


@dataclass(frozen=True)
class Drift:
    """The first difference between the buffer and the template's rendering.

    Attributes:
        position: index of the first differing token (or the shorter length).
        buffer_len / template_len: lengths of the two sequences.
        buffer_tokens / template_tokens: the tokens from ``position`` on (a window).
        buffer_text / template_text: the same windows decoded (special tokens kept), with the
            text before ``position`` in ``context``.
    """

    position: int
    buffer_len: int
    template_len: int
    buffer_tokens: list[int]
    template_tokens: list[int]
    buffer_text: str
    template_text: str
    context: str

    def describe(self) -> str:
        return (
            f"token drift at position {self.position} (buffer {self.buffer_len} tokens, "
            f"template {self.template_len}): after {self.context!r} the buffer has "
            f"{self.buffer_text!r} {self.buffer_tokens} where the template has "
            f"{self.template_text!r} {self.template_tokens}"
        )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (``None`` when equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_drift(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    token_ids: Sequence[int],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    window: int = 8,
    **chat_template_kwargs: Any,
) -> Drift | None:
    """Compare ``token_ids`` (prompt + response of an episode) with the chat template's
    rendering of ``messages``; ``None`` when they are equal (a buffer that stops where the
    template only adds whitespace after the last turn counts as equal).

    Args:
        tokenizer: the model's tokenizer (its chat template).
        messages: the conversation the buffer holds (as the agent loop kept it).
        token_ids: the incrementally built buffer.
        tools: the tool schemas the prompt was rendered with.
        add_generation_prompt: the buffer ends with an open assistant turn.
        window: tokens shown on each side of the difference.
        **chat_template_kwargs: as given to the builder (e.g. ``enable_thinking``).
    """
    expected = template_ids(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        **chat_template_kwargs,
    )
    actual = [int(t) for t in token_ids]
    position = first_difference(actual, expected)
    if position is None:
        return None

    def text(ids: Sequence[int]) -> str:
        decoded: str = tokenizer.decode(list(ids), skip_special_tokens=False)
        return decoded

    if position == len(actual) and not text(expected[position:]).strip():
        # The buffer ends at the model's stop token; the template adds the turn separator
        # ("\n" after <|im_end|>) that the next merge inserts. Not drift.
        return None

    return Drift(
        position=position,
        buffer_len=len(actual),
        template_len=len(expected),
        buffer_tokens=actual[position : position + window],
        template_tokens=expected[position : position + window],
        buffer_text=text(actual[position : position + window]),
        template_text=text(expected[position : position + window]),
        context=text(actual[max(0, position - window) : position]),
    )


def drifted_tokens(drift: Drift | None) -> int:
    """Tokens from the first difference to the end of the longer sequence (0 without drift):
    how much of the sample was trained on a context the template would not produce."""
    if drift is None:
        return 0
    return max(drift.buffer_len, drift.template_len) - drift.position
