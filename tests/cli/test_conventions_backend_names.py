"""A backend name that is not a backend: the error says where it was set, the known backends,
the closest one and the fix, in one ``Error:`` line, whichever command reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandlot.cli.main import cli

DATASET = Path(__file__).resolve().parents[2] / "examples" / "swe-mini" / "instances.jsonl"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "agent_config" / "local.yaml"

COMMANDS = {
    "eval": ["eval", "--dataset", str(DATASET), "--predictions", "gold"],
    "rollout": [
        "rollout",
        *("--dataset", str(DATASET), "--config", str(CONFIG)),
        *("--base-url", "http://127.0.0.1:9/v1", "--model", "m"),
    ],
    "gc": ["gc", "--all", "--dry-run"],
    "env build": ["env", "build", "--dataset", str(DATASET)],
}


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize("variable", ["SANDLOT_BACKEND", "DEPLOYMENT"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_typo_in_the_environment_names_the_variable(
    command: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    monkeypatch.setenv(variable, "lcoal")
    result = CliRunner().invoke(cli, COMMANDS[command])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = _error_lines(result.output)
    assert f"unknown sandbox backend 'lcoal' (set by ${variable})" in line
    listed = line.partition("known backends: ")[2].partition(" (did you mean 'local'?)")[0]
    assert {"docker", "local", "modal", "vefaas"} <= set(listed.split(", "))  # tests add more
    assert f"fix or unset {variable} (e.g. `export {variable}=local`)" in line
    assert "--backend" not in line.split(";")[0]  # not reported as the flag's value
    assert "Traceback" not in result.output


def test_a_typo_in_the_flag_is_the_flags() -> None:
    result = CliRunner().invoke(cli, [*COMMANDS["eval"], "--backend", "dokcer"])
    assert result.exit_code == 2
    [line] = _error_lines(result.output)
    assert "Invalid value for --backend: unknown sandbox backend 'dokcer';" in line
    assert "(did you mean 'docker'?)" in line and "$" not in line


@pytest.mark.parametrize("variable", ["SANDLOT_BACKEND", "DEPLOYMENT"])
def test_data_prepare_names_the_variable(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDLOT_BACKEND", raising=False)
    monkeypatch.delenv("DEPLOYMENT", raising=False)
    monkeypatch.setenv(variable, "lcoal")
    args = ["data", "prepare", "swe_rebench", "--local-save-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    [line] = _error_lines(result.output)
    assert f"unknown sandbox backend 'lcoal' (set by ${variable})" in line
    assert "(did you mean 'local'?)" in line
    assert "Invalid value" not in line and not list(tmp_path.iterdir())
