"""``sandlot.settings``: the ``SANDLOT_*`` environment, typed and documented once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sandlot.settings
from sandlot.settings import Settings, SettingsError, settings


def test_every_variable_is_in_the_table_of_the_module_docstring() -> None:
    doc = sandlot.settings.__doc__ or ""
    names = Settings.variables()
    assert len(names) > len(Settings.model_fields)  # the alternative names are listed too
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


def test_the_first_name_of_a_variable_wins_and_secrets_stay_hidden() -> None:
    both = {"VOLCENGINE_ACCESS_KEY": "sdk-name", "VOLCE_ACCESS_KEY": "first"}
    key = Settings.from_env(both).volce_access_key
    assert key is not None and key.get_secret_value() == "first" and "first" not in repr(key)
    key = Settings.from_env({"VOLCENGINE_ACCESS_KEY": "sdk-name"}).volce_access_key
    assert key is not None and key.get_secret_value() == "sdk-name"


def test_a_bad_value_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"\$SANDLOT_MAX_STARTING='many'"):
        Settings.from_env({"SANDLOT_MAX_STARTING": "many"})


def _environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, variable) of each ``os.environ.get/[]`` or ``os.getenv`` read in ``path``; a
    variable given by a module-level string constant is resolved, any other is ``"?"``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def name(arg: ast.expr) -> str:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return constants.get(arg.id, "?") if isinstance(arg, ast.Name) else "?"

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            if ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
                reads.append((node.lineno, name(node.args[0])))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            is_environ = ast.unparse(node.value) == "os.environ"
            reads.extend([(node.lineno, name(node.slice))] if is_environ else [])
    return reads


def test_settings_are_read_only_through_sandlot_settings() -> None:
    package = Path(sandlot.settings.__file__).parent
    checked = [path for path in package.rglob("*.py") if path.name != "settings.py"]
    variables = set(Settings.variables())
    direct = [
        f"{path.relative_to(package)}:{line} reads ${variable}"
        for path in checked
        for line, variable in _environment_reads(path)
        if variable in variables
    ]
    assert direct == [], "read these through sandlot.settings.settings()"


def test_the_read_finder_resolves_constants(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        'import os\nNAME = "SANDLOT_X"\nos.environ.get(NAME)\nos.getenv("Y")\nos.environ[z]\n'
    )
    assert _environment_reads(module) == [(3, "SANDLOT_X"), (4, "Y"), (5, "?")]
