"""``GenerationConfig``: one generation config for ``sandlot rollout`` and training."""

from __future__ import annotations

import pytest

from sandlot.rollout.config import ConfigError, parse_agent_config
from sandlot.rollout.generation import GenerationConfig


def test_a_misspelt_key_is_named() -> None:
    misspelt = r"generation\.temprature: unknown key \(did you mean 'temperature'\?\)"
    with pytest.raises(ConfigError, match=misspelt):
        parse_agent_config({"generation": {"temprature": 0.7}})
    with pytest.raises(ConfigError, match=r"generation\.top_p: Input should be less than"):
        parse_agent_config({"generation": {"top_p": 1.5}})


def test_extra_body_may_not_set_what_the_client_or_the_config_owns() -> None:
    with pytest.raises(ConfigError, match=r"generation\.extra_body: .*max_tokens, model"):
        parse_agent_config({"generation": {"extra_body": {"model": "x", "max_tokens": 5}}})
    with pytest.raises(ConfigError, match="temperature: not settable through extra_body"):
        parse_agent_config({"generation": {"extra_body": {"temperature": 0.1}}})


def test_max_tokens_is_what_is_left_of_the_response_length_capped() -> None:
    """As verl's trainer: ``response_length`` minus the response so far, capped by
    ``max_tokens``; ``<= 0`` once spent."""
    both = GenerationConfig(response_length=1000, max_tokens=300)
    assert [both.next_max_tokens(u) for u in (0, 600, 800, 1000, 1200)] == [
        300,
        300,
        200,
        0,
        -200,
    ]
    assert GenerationConfig(response_length=1000).next_max_tokens(250) == 750
    assert GenerationConfig(max_tokens=64).next_max_tokens(10**6) == 64
    assert GenerationConfig().next_max_tokens(5) is None


def test_the_same_values_reach_a_request_and_verls_sampling_params() -> None:
    generation = GenerationConfig(
        temperature=0.6,
        top_p=0.95,
        stop=["</answer>"],
        chat_template_kwargs={"enable_thinking": False},
        extra_body={"top_k": 20, "repetition_penalty": 1.05},
    )
    sampling = {"temperature": 0.6, "top_p": 0.95, "stop": ["</answer>"]}
    extra = {"top_k": 20, "repetition_penalty": 1.05}
    assert generation.request_fields() == {
        **sampling,
        "chat_template_kwargs": {"enable_thinking": False},
        **extra,
    }
    verl = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    assert generation.sampling_params(verl) == {**verl, **sampling, **extra}
    assert GenerationConfig().request_fields() == {}
    assert GenerationConfig().sampling_params(verl) == verl
