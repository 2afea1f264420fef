"""``agent_config.yaml``: the examples load and differ only in ``sandbox``; bad keys and values
are ``ConfigError``s naming the key path and the allowed values; the environment picks the
backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandlot.rollout.config import (
    AgentConfig,
    ConfigError,
    load_agent_config,
    parse_agent_config,
    with_flags,
)
from sandlot.sandboxes.registry import get_backend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agent_config"
BACKENDS = ("local", "docker", "modal", "vefaas", "kubernetes")


def lists_the_backends(message: str) -> bool:
    """``message`` ends with ``allowed: <backends>`` naming every built-in one (tests may have
    registered more)."""
    allowed = message.rpartition("allowed: ")[2].split(", ")
    return set(BACKENDS) <= set(allowed)


@pytest.fixture(autouse=True)
def _no_backend_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)


def test_there_is_one_example_per_built_in_backend() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_example_loads_with_its_backends_options(backend: str) -> None:
    config = load_agent_config(EXAMPLES / f"{backend}.yaml")
    assert config.sandbox.backend == backend
    assert config.sandbox.resolved_backend() == backend
    assert set(config.sandbox.options) == {backend}
    options = config.sandbox.options_for(backend)
    assert isinstance(options, get_backend(backend).Options)
    assert config.tool_specs()[0] == {"name": "bash", "timeout_s": 180}


def test_the_examples_differ_only_in_the_sandbox_block() -> None:
    raw = {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLES.glob("*.yaml")}
    loaded = {name: load_agent_config(EXAMPLES / f"{name}.yaml") for name in raw}
    reference = loaded["local"].model_dump(exclude={"sandbox"})
    for name in raw:
        assert set(raw[name]) == set(raw["local"]), name  # the same blocks, spelled out
        rest = {k: v for k, v in raw[name].items() if k != "sandbox"}
        assert rest == {k: v for k, v in raw["local"].items() if k != "sandbox"}, name
        assert loaded[name].model_dump(exclude={"sandbox"}) == reference, name
    assert len({yaml.safe_dump(r["sandbox"]) for r in raw.values()}) == len(raw)


def test_an_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "agent_config.yaml"
    path.write_text("")
    assert load_agent_config(path) == AgentConfig()


# ----------------------------------------------------------------------------- errors


def bad(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_agent_config(data, source="cfg.yaml")
    message = str(info.value)
    assert message.startswith("cfg.yaml: ")
    return message


def test_an_unknown_block_is_named() -> None:
    assert "cfg.yaml: interactoin: unknown key" in bad({"interactoin": {}})


def test_an_unknown_nested_key_is_named() -> None:
    message = bad({"interaction": {"max_turn": 5}})
    assert "interaction.max_turn: unknown key" in message


def test_an_out_of_range_value_names_its_path() -> None:
    message = bad({"interaction": {"max_turns": 0}})
    assert "interaction.max_turns: Input should be greater than or equal to 1" in message


def test_a_bad_reward_mode_lists_the_modes() -> None:
    message = bad({"reward": {"mode": "stale"}})
    assert "reward.mode" in message and "'fresh' or 'same'" in message


def test_an_unknown_backend_lists_the_backends() -> None:
    message = bad({"sandbox": {"backend": "k8s"}})
    assert "sandbox.backend" in message and "unknown backend 'k8s'" in message
    assert lists_the_backends(message)


def test_an_unknown_parser_lists_the_parsers() -> None:
    message = bad({"tool_parser": "json"})
    assert "tool_parser" in message and "allowed: hermes, qwen3_coder" in message


def test_an_unknown_tool_lists_the_tools() -> None:
    message = bad({"tools": ["bash", "python"]})
    assert "tools" in message and "unknown tool 'python'" in message
    assert "allowed: bash, execute_bash, str_replace_editor, submit, finish" in message


def test_backend_options_are_checked_by_the_backends_model() -> None:
    message = bad({"sandbox": {"backend": "docker", "options": {"docker": {"pull": "sometimes"}}}})
    assert "sandbox.options.docker.pull" in message
    assert "'missing', 'always' or 'never'" in message
    message = bad({"sandbox": {"backend": "local", "options": {"local": {"isolaton": "none"}}}})
    assert "sandbox.options.local.isolaton: unknown key" in message


def test_inactive_backend_blocks_are_checked_too() -> None:
    """A typo in the modal block fails at load, not when DEPLOYMENT=modal picks it later."""
    message = bad({"sandbox": {"backend": "local", "options": {"modal": {"app": "x"}}}})
    assert "sandbox.options.modal.app: unknown key" in message
    message = bad({"sandbox": {"options": {"k8s": {}}}})
    assert "sandbox.options.k8s: unknown backend; allowed: " in message
    assert lists_the_backends(message)


def test_spec_defaults_are_checked_and_row_fields_refused() -> None:
    message = bad({"sandbox": {"spec": {"memory_mb": -1}}})
    assert "sandbox.spec" in message and "greater than 0" in message
    message = bad({"sandbox": {"spec": {"image": "python:3.12", "timeout_s": 60}}})
    assert "sandbox.spec" in message and "image: set by each row" in message
    assert "allowed here:" in message and "memory_mb" in message


def test_prompt_templates_may_not_reveal_the_solution() -> None:
    message = bad({"prompt": {"user": "Fix it:\n{problem_statement}\nHint: {patch}"}})
    assert "prompt.user" in message and "template field {patch} is not allowed" in message
    assert "{problem_statement}" in message  # the allowed fields are listed
    assert "prompt.system" in bad({"prompt": {"system": "unbalanced { brace"}})


def test_a_file_that_is_not_a_mapping_or_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "agent_config.yaml"
    path.write_text("- a\n- list\n")
    with pytest.raises(ConfigError, match="must be a mapping of blocks, got list"):
        load_agent_config(path)
    path.write_text("sandbox: {backend: [local\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_agent_config(path)
    with pytest.raises(FileNotFoundError):
        load_agent_config(tmp_path / "missing.yaml")


# ----------------------------------------------------------------------------- the environment


@pytest.mark.parametrize("variable", ["SANDLOT_BACKEND", "DEPLOYMENT"])
def test_the_environment_overrides_the_backend(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    config = load_agent_config(EXAMPLES / "modal.yaml")
    monkeypatch.setenv(variable, "Docker")
    assert config.sandbox.resolved_backend() == "docker"
    assert config.sandbox.options_for("docker") == get_backend("docker").Options()


def test_sandlot_backend_wins_over_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_agent_config(EXAMPLES / "vefaas.yaml")
    monkeypatch.setenv("DEPLOYMENT", "modal")
    monkeypatch.setenv("SANDLOT_BACKEND", "local")
    assert config.sandbox.resolved_backend() == "local"


def test_an_unknown_backend_from_the_environment_names_the_backends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_agent_config(EXAMPLES / "local.yaml")
    monkeypatch.setenv("DEPLOYMENT", "k8s")
    with pytest.raises(ConfigError, match=r"backend 'k8s' \(set by \$DEPLOYMENT\)") as info:
        config.sandbox.options_for(config.sandbox.resolved_backend())
    # Tests that register fakes (modal-fake, ...) may have run first: the built-in ones suffice.
    known = str(info.value).split("known backends: ")[1].split(";")[0].split(", ")
    assert {"docker", "local", "modal", "vefaas"} <= set(known)


# ----------------------------------------------------------------------------- the model client


def test_the_client_block_defaults_and_overrides() -> None:
    """The retry budget is time (300 s: a vLLM restart), the command line wins over the file."""
    default = parse_agent_config(None).client
    assert (default.request_timeout_s, default.retry_budget_s) == (600.0, 300.0)
    config = parse_agent_config({"client": {"request_timeout_s": 30, "retry_budget_s": 900}})
    merged = with_flags(config.client, "client", request_timeout_s=None, retry_budget_s=60.0)
    assert (merged.request_timeout_s, merged.retry_budget_s) == (30.0, 60.0)
    with pytest.raises(ConfigError, match=r"client\.request_timeout_s"):
        with_flags(config.client, "client", request_timeout_s=0.0)


def test_an_unknown_client_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"client\.max_retries: unknown key; allowed: backoff_s"):
        parse_agent_config({"client": {"max_retries": 5}})
