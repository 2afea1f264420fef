"""An unknown ``agent_config.yaml`` key: one ``Error:`` line naming the key's path, the closest
allowed key and every key allowed at its level, as the README promises."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sandlot.cli.main import cli

DATASET = Path(__file__).resolve().parents[2] / "examples" / "swe-mini" / "instances.jsonl"


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "concurrncy: 2\n",
            "concurrncy: unknown key (did you mean 'concurrency'?); allowed: client, concurrency, "
            "generation, interaction, prompt, reasoning_opened, reward, sandbox, tool_parser, "
            "tools",
        ),
        (
            "interaction: {max_turn: 3}\n",
            "interaction.max_turn: unknown key (did you mean 'max_turns'?); allowed: "
            "action_timeout, max_observation_chars, max_total_tokens, max_turns, timeout_budget",
        ),
        (
            "sandbox: {options: {local: {isolaton: none}}}\n",
            "sandbox.options.local.isolaton: unknown key (did you mean 'isolation'?); allowed: "
            "bwrap_path,",
        ),
        (
            "sandbox: {spec: {timeout: 3}}\n",
            "sandbox.spec: timeout: unknown key (did you mean 'timeout_s'?); allowed: cpu, "
            "disk_mb,",
        ),
    ],
)
def test_unknown_keys_list_the_allowed_ones(tmp_path: Path, yaml_text: str, expected: str) -> None:
    config = tmp_path / "agent_config.yaml"
    config.write_text(yaml_text)
    args = ["rollout", "--dataset", str(DATASET), "--config", str(config)]
    result = CliRunner().invoke(cli, [*args, "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert line.startswith(f"Error: {config}: ") and expected in line
    assert "Traceback" not in result.output and "Extra inputs" not in line
