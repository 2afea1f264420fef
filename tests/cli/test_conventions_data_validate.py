"""``sandlot data validate`` on SWE-bench instances (.jsonl): checked as ``sandlot eval`` reads
them, never a literal ``<file>`` nor a parquet error."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sandlot.cli.main import cli

DATASET = Path(__file__).resolve().parents[2] / "examples" / "swe-mini" / "instances.jsonl"


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["data", "validate", str(path)])
    assert "Traceback" not in result.output and "<file>" not in result.output
    return result.exit_code, result.output


def test_instances_are_checked_as_instances() -> None:
    code, out = _validate(DATASET)
    assert (code, out) == (0, f"{DATASET}: 8 instances OK\n")


def test_a_bad_instance_names_its_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(DATASET.read_text().splitlines()[0] + '\n{"instance_id": "x"}\n')
    code, out = _validate(bad)
    [line] = [line for line in out.splitlines() if line.startswith("Error:")]
    assert code == 1 and line.startswith(f"Error: {bad}, line 2 (instance_id 'x'): missing")
    assert "parquet" not in out


def test_an_empty_instances_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _validate(empty) == (1, f"Error: {empty}: no instances (one JSON object per line)\n")


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "rows.parquet"
    junk.write_text("not parquet")
    code, out = _validate(junk)
    assert code == 1 and "✗ file: rows.parquet: not a parquet file" in out
