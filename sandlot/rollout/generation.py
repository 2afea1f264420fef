"""``GenerationConfig``: how each assistant turn is sampled, one definition for ``sandlot
rollout`` and for training, so that an eval reproduces a training episode's sampling.

The ``generation`` block of ``agent_config.yaml`` (every key optional; ``sandlot rollout``'s
``--max-tokens``, ``--response-length``, ``--temperature``, ``--top-p``, ``--stop``,
``--chat-template-kwargs`` and ``--extra-body`` override it)::

    generation:
      response_length: 32768      # tokens of the whole trajectory after the first prompt
                                  # (verl's actor_rollout_ref.rollout.response_length)
      max_tokens: 4096            # cap of one request
      temperature: 1.0
      top_p: 1.0
      stop: ["</answer>"]
      chat_template_kwargs: {enable_thinking: false}
      extra_body: {top_k: 20, repetition_penalty: 1.05}   # passed through as they are

Each request's ``max_tokens`` is what is left of ``response_length`` (as verl's trainer and
:class:`~sandlot.trainer.agent_loop.TokenPolicy` compute it: the response so far is every token
after the first prompt, the model's and the tool observations'), capped by ``max_tokens``. Over
HTTP the tokens are known from the replies' ``usage``: the observations appended since the last
reply are counted at the next one, so a rollout request may ask for up to one observation's
tokens more than the trainer would; the episode still ends (``context_length``) where
training's ends.

Where the values go: an OpenAI-compatible request carries ``temperature``, ``top_p``,
``stop``, ``chat_template_kwargs`` (vLLM's and SGLang's extension) and ``extra_body``'s keys at
the top level (what the ``openai`` SDK's ``extra_body`` does). In training, ``temperature``,
``top_p``, ``stop`` and ``extra_body`` are laid over verl's ``sampling_params`` (vLLM's
``SamplingParams`` fields), and ``chat_template_kwargs`` over verl's
``data.apply_chat_template_kwargs`` for rendering the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Fields the client or this config own: extra_body may not set them behind its back.
_OWNED = frozenset({"model", "messages", "tools", "tool_choice", "max_tokens", "n", "stream"})


class GenerationConfig(BaseModel):
    """The ``generation`` block (see the module docstring); unknown keys are refused by name.

    Attributes:
        response_length: tokens the trajectory may add after its first prompt; ``None``: no
            trajectory budget (only ``max_tokens`` and the model's context bound a request).
        max_tokens: tokens one request may generate; ``None``: no cap of its own.
        temperature: sampling temperature; ``None``: the server's (or verl's) default.
        top_p: nucleus sampling mass in (0, 1]; ``None``: the default.
        stop: strings that end a generation; ``None``: the default.
        chat_template_kwargs: keyword arguments of the chat template (``enable_thinking``).
        extra_body: further request fields passed through unchanged (``top_k``, ``min_p``,
            ``repetition_penalty``, ``seed``, ...).
    """

    model_config = ConfigDict(extra="forbid")

    response_length: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: list[str] | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("extra_body")
    @classmethod
    def _not_owned(cls, value: dict[str, Any]) -> dict[str, Any]:
        named = set(cls.model_fields) - {"extra_body", "response_length"}
        clash = sorted(set(value) & (_OWNED | named))
        if clash:
            raise ValueError(
                f"{', '.join(clash)}: not settable through extra_body (the client sets "
                f"model/messages/tools; use generation.<key> for the sampling keys)"
            )
        return value

    def next_max_tokens(self, used: int) -> int | None:
        """``max_tokens`` of the next request when ``used`` response tokens are spent.

        Returns:
            ``response_length - used`` capped by ``max_tokens`` (``<= 0``: the budget is spent),
            or ``max_tokens`` (maybe ``None``) without a ``response_length``.
        """
        if self.response_length is None:
            return self.max_tokens
        left = self.response_length - used
        return left if self.max_tokens is None else min(left, self.max_tokens)

    def request_fields(self) -> dict[str, Any]:
        """The fields every OpenAI chat-completions request carries (``max_tokens`` is set
        per request from :meth:`next_max_tokens`)."""
        fields = self._sampling()
        if self.chat_template_kwargs:
            fields["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        fields.update(self.extra_body)
        return fields

    def sampling_params(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """verl's ``sampling_params`` (``base``) with this config's sampling laid over them."""
        return {**base, **self._sampling(), **self.extra_body}

    def _sampling(self) -> dict[str, Any]:
        chosen = {"temperature": self.temperature, "top_p": self.top_p, "stop": self.stop}
        return {k: v for k, v in chosen.items() if v is not None}
