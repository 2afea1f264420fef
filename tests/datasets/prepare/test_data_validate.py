"""`sandlot data validate` / `show`: every row checked, problems named with their fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dataprep_support import run_prepare
from requirements import EVAL, need_module

from sandlot.cli.main import cli
from sandlot.datasets.loaders import DatasetError, load_instances
from sandlot.datasets.validate import validate_file

pa = need_module("pyarrow", EVAL)
pq = need_module("pyarrow.parquet", EVAL)


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    return run_prepare("swe_rebench", tmp_path, "modal").path


def _records(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def _write(path: Path, records: list[dict[str, Any]], schema: Any = None) -> Path:
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path)
    return path


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["data", *args])
    return result.exit_code, result.output


def test_prepared_file_passes_with_a_summary(prepared: Path) -> None:
    code, out = _invoke("validate", str(prepared))
    assert code == 0, out
    assert f"{prepared}: 2 rows OK" in out
    for line in (
        "rows",
        "repos",
        "images",
        "backends",
        "modal (2)",
        "sandlot-examples/minicalc",
    ):
        assert line in out


def test_every_row_problem_names_row_field_and_fix(prepared: Path, tmp_path: Path) -> None:
    records = _records(prepared)
    records[0]["reward_model"]["ground_truth"] = "someone-else"
    metadata = json.loads(records[1]["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    records[1]["prompt"][1]["content"] += "\n" + metadata["patch"]
    records[1]["extra_info"]["index"] = 0
    broken = _write(tmp_path / "broken.parquet", records, pq.read_schema(prepared))
    report = validate_file(broken)
    found = {(p.row, p.field) for p in report.errors}
    assert found == {
        (0, "reward_model.ground_truth"),
        (1, "prompt"),
        (1, "extra_info.index"),
    }, report.errors
    code, out = _invoke("validate", str(broken))
    assert code == 1
    assert "row 1: prompt: contains the gold patch (fix: remove it from the prompt template" in out
    assert "row 0: reward_model.ground_truth: 'someone-else' differs" in out
    assert "3 problem(s) in 2 rows" in out


def test_metadata_problems_point_into_the_instance(prepared: Path, tmp_path: Path) -> None:
    records = _records(prepared)
    info = records[0]["extra_info"]["tools_kwargs"]
    metadata = json.loads(info["reward"]["metadata"])
    metadata["FAIL_TO_PASS"] = "[not json"
    info["reward"]["metadata"] = json.dumps(metadata)
    info["env"]["image"] = "other/image"
    broken = _write(tmp_path / "broken.parquet", records, pq.read_schema(prepared))
    errors = {(p.row, p.field): p for p in validate_file(broken).errors}
    assert set(errors) == {(0, "extra_info.tools_kwargs.reward.metadata.FAIL_TO_PASS")}
    assert (
        "not valid JSON"
        in errors[0, "extra_info.tools_kwargs.reward.metadata.FAIL_TO_PASS"].problem
    )
    metadata["FAIL_TO_PASS"] = ["t"]
    info["reward"]["metadata"] = json.dumps(metadata)
    broken = _write(tmp_path / "broken2.parquet", records, pq.read_schema(prepared))
    assert {(p.row, p.field) for p in validate_file(broken).errors} == {
        (0, "extra_info.tools_kwargs.env.image")
    }
    # The evaluator refuses the ambiguous row the same way.
    with pytest.raises(DatasetError, match=r"env\.image") as err:
        load_instances(broken)
    assert err.value.where == "row 0"


def test_file_from_another_tool_with_an_extra_column_is_kept(
    prepared: Path, tmp_path: Path
) -> None:
    records = _records(prepared)
    for r in records:
        r["ability"] = "software-engineering"
        r["extra_info"]["split"] = "train"
    # Written without sandlot's schema: Arrow infers the types, as pandas or datasets would.
    other = _write(tmp_path / "other.parquet", records)
    report = validate_file(other)
    assert report.ok, report.errors
    assert report.extra_columns == ["ability", "extra_info.split"]
    code, out = _invoke("validate", str(other))
    assert code == 0 and "ability, extra_info.split" in out
    assert load_instances(other) == load_instances(prepared)


def test_file_from_another_tool_with_a_wrong_type_is_named(prepared: Path, tmp_path: Path) -> None:
    records = _records(prepared)
    for r in records:
        r["extra_info"]["index"] = str(r["extra_info"]["index"])
        r["prompt"] = json.dumps(r["prompt"])
    other = _write(tmp_path / "other.parquet", records)
    report = validate_file(other)
    assert {(p.row, p.field) for p in report.errors} == {
        (None, "prompt"),
        (None, "extra_info.index"),
    }
    code, out = _invoke("validate", str(other))
    assert code == 1
    assert "file: extra_info.index: has type string, expected int64" in out
    assert (
        "file: prompt: has type string, expected list<item: struct<role: string, content: string>>"
        in out
    )


def test_missing_column_and_unreadable_file(prepared: Path, tmp_path: Path) -> None:
    table = pq.read_table(prepared).drop_columns(["reward_model"])
    pq.write_table(table, tmp_path / "no_reward.parquet")
    code, out = _invoke("validate", str(tmp_path / "no_reward.parquet"))
    assert code == 1 and "reward_model: required column is missing" in out
    (tmp_path / "junk.parquet").write_text("not parquet")
    code, out = _invoke("validate", str(tmp_path / "junk.parquet"))
    assert code == 1 and "not a parquet file" in out


def test_local_rows_need_their_mirror_on_this_machine(tmp_path: Path, mirror: Path) -> None:
    result = run_prepare("swe_bench_verified", tmp_path, "local", repo_mirror=str(mirror))
    records = _records(result.path)
    moved = str(tmp_path / "gone" / "sandlot-examples__minicalc")
    for part in ("env",):
        records[0]["extra_info"]["tools_kwargs"][part]["repo_source"] = moved
    metadata = json.loads(records[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    metadata["repo_source"] = moved
    records[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"] = json.dumps(metadata)
    broken = _write(tmp_path / "moved.parquet", records, pq.read_schema(result.path))
    [problem] = validate_file(broken).errors
    assert (problem.row, problem.field) == (0, "extra_info.tools_kwargs.env.repo_source")
    assert (
        "does not exist on this machine" in problem.problem and "git clone --mirror" in problem.fix
    )


def test_show_prints_one_row(prepared: Path) -> None:
    code, out = _invoke("show", str(prepared), "--index", "1")
    assert code == 0, out
    assert "textkit__textkit-1" in out and "prompt: user" in out and "post_setup_cmd" in out
    assert "wrap() breaks lines" in out
    code, out = _invoke("show", str(prepared), "--index", "2")
    assert code == 2 and "has 2 rows" in out
