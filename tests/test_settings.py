"""``sandlot.settings``: the ``SANDLOT_*`` environment, typed and documented once."""

from __future__ import annotations

import pytest

import sandlot.settings
from sandlot.settings import Settings, SettingsError, settings


def test_every_variable_is_in_the_table_of_the_module_docstring() -> None:
    doc = sandlot.settings.__doc__ or ""
    names = [field.alias for field in Settings.model_fields.values()]
    assert all(names)
    assert [name for name in names if f"``{name}``" not in doc] == []


def test_values_are_read_at_each_call_and_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOT_DOCKER_API_THREADS", raising=False)
    assert settings().docker_api_threads == 32
    monkeypatch.setenv("SANDLOT_DOCKER_API_THREADS", "8")
    monkeypatch.setenv("SANDLOT_START_BUDGET_S", "12.5")
    got = settings()
    assert (got.docker_api_threads, got.budget_s) == (8, 12.5)


def test_an_empty_variable_is_unset() -> None:
    assert Settings.from_env({"SANDLOT_BACKEND": "", "DEPLOYMENT": "modal"}).backend is None
    assert Settings.from_env({"DEPLOYMENT": "modal"}).deployment == "modal"


def test_a_bad_value_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"\$SANDLOT_MAX_STARTING='many'"):
        Settings.from_env({"SANDLOT_MAX_STARTING": "many"})
