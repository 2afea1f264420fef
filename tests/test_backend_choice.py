"""Which backend a run uses is decided once, in the order of a CLI tool: the argument
(``--backend``), then ``$SANDLOT_BACKEND``, then ``$DEPLOYMENT``, then the config file, then
the default; and said once, with where it came from."""

from __future__ import annotations

import logging

import pytest

from sandlot.errors import BackendNotFoundError
from sandlot.sandboxes import registry
from sandlot.sandboxes.registry import BackendChoice, choose_backend

# (argument, $SANDLOT_BACKEND, $DEPLOYMENT, config file) -> (backend, where it came from)
ORDER = [
    ((None, None, None, None), ("local", "the default")),
    ((None, None, None, "docker"), ("docker", "the config")),
    ((None, None, "modal", "docker"), ("modal", "$DEPLOYMENT")),
    ((None, "vefaas", "modal", "docker"), ("vefaas", "$SANDLOT_BACKEND")),
    (("docker", "vefaas", "modal", "local"), ("docker", "--backend")),
    (("local", None, "modal", None), ("local", "--backend")),
    ((None, "docker", None, None), ("docker", "$SANDLOT_BACKEND")),
    ((None, None, None, "local"), ("local", "the config")),
    # Empty is unset, at every level; a name is stripped and lower-cased.
    (("", "", " Modal ", ""), ("modal", "$DEPLOYMENT")),
    (("  ", " DOCKER", None, None), ("docker", "$SANDLOT_BACKEND")),
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    monkeypatch.setattr(registry, "_said", set())  # what this process has logged so far
    return monkeypatch


@pytest.mark.parametrize(("given", "expected"), ORDER, ids=lambda v: repr(v))
def test_the_order_of_a_cli_tool(
    given: tuple[str | None, ...], expected: tuple[str, str], env: pytest.MonkeyPatch
) -> None:
    argument, sandlot_backend, deployment, config = given
    for variable, value in (("SANDLOT_BACKEND", sandlot_backend), ("DEPLOYMENT", deployment)):
        if value is not None:
            env.setenv(variable, value)
    choice = choose_backend(argument, given_by="--backend", config=config, config_by="the config")
    assert (choice.name, choice.source) == expected


def test_a_command_without_a_config_file_has_its_own_default(env: pytest.MonkeyPatch) -> None:
    choice = choose_backend(None, default="docker")  # sandlot data prepare
    assert (choice.name, choice.defaulted) == ("docker", True)
    env.setenv("SANDLOT_BACKEND", "modal")
    assert choose_backend(None, default="docker") == BackendChoice("modal", "$SANDLOT_BACKEND")


def test_the_choice_is_said_with_where_it_came_from(env: pytest.MonkeyPatch) -> None:
    env.setenv("DEPLOYMENT", "modal")
    said: list[str] = []
    choose_backend(None, say=said.append)
    assert said == ["backend: modal (from $DEPLOYMENT)"]


def test_without_a_sayer_a_process_logs_each_choice_once(
    env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=registry.__name__)
    env.setenv("DEPLOYMENT", "docker")
    for _ in range(3):  # a training worker: one choice per episode
        choose_backend(config="local")
    choose_backend("local")  # the caller's own name: nothing was decided here
    assert caplog.messages == ["backend: docker (from $DEPLOYMENT)"]


@pytest.mark.parametrize("variable", ["SANDLOT_BACKEND", "DEPLOYMENT"])
def test_an_unknown_name_says_where_it_was_set(variable: str, env: pytest.MonkeyPatch) -> None:
    env.setenv(variable, "lcoal")
    with pytest.raises(BackendNotFoundError, match=rf"'lcoal' \(set by \${variable}\)") as err:
        choose_backend(config="docker")
    assert "did you mean 'local'" in str(err.value)
    with pytest.raises(BackendNotFoundError) as err:
        choose_backend("dokcer", given_by="--backend")
    assert "set by" not in str(err.value) and "did you mean 'docker'" in str(err.value)
