"""sandlot.datasets.loaders: accepted shapes, repo_source resolution and located errors."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from requirements import EVAL, need_module

from sandlot.datasets.loaders import (
    DatasetError,
    instance_from_record,
    iter_instances,
    load_instances,
)


def record(instance_id: str = "acme__widget-1", **fields: Any) -> dict[str, Any]:
    base = {
        "instance_id": instance_id,
        "repo": "acme/widget",
        "base_commit": "0123abcd",
        "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        "FAIL_TO_PASS": '["tests/test_w.py::test_a"]',
        "PASS_TO_PASS": ["tests/test_w.py::test_b"],
    }
    base.update(fields)
    return base


def write_jsonl(path: Path, *lines: Any) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pa = need_module("pyarrow", EVAL)
    pq = need_module("pyarrow.parquet", EVAL)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ------------------------------------------------------------------------------ accepted shapes


def test_jsonl_records_in_order_blank_lines_skipped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", record("a-1"), "", "   ", record("a-2"))
    instances = load_instances(path)
    assert [i.instance_id for i in instances] == ["a-1", "a-2"]
    assert instances[0].FAIL_TO_PASS == ["tests/test_w.py::test_a"]  # JSON string decoded
    assert instances[0].PASS_TO_PASS == ["tests/test_w.py::test_b"]


def test_jsonl_with_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(record()).encode() + b"\n")
    assert [i.instance_id for i in load_instances(path)] == ["acme__widget-1"]


@pytest.mark.parametrize(
    "payload",
    [
        [record("a-1"), record("a-2")],
        {"instances": [record("a-1"), record("a-2")], "name": "metadata is ignored"},
        {"a-1": record("a-1"), "a-2": {k: v for k, v in record().items() if k != "instance_id"}},
    ],
    ids=["list", "instances-key", "id-mapping"],
)
def test_json_shapes(tmp_path: Path, payload: Any) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(payload))
    assert [i.instance_id for i in load_instances(path)] == ["a-1", "a-2"]


def test_parquet_rows_with_nulls(tmp_path: Path) -> None:
    rows = [
        record("a-1", version=3.0, test_cmd="pytest -rA", env={"X": "1"}),
        record("a-2", version=3.1, test_cmd=None, env=None),  # nulls where a row lacks a value
    ]
    instances = load_instances(write_parquet(tmp_path / "d.parquet", rows))
    assert [i.instance_id for i in instances] == ["a-1", "a-2"]
    assert instances[0].version == "3.0"
    assert instances[0].env == {"X": "1"}
    assert instances[1].test_cmd is None
    assert instances[1].env == {}


def test_parquet_needs_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "d.parquet", [record()])
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"sandlot\[eval\]"):
        load_instances(path)


def test_directory_reads_dataset_files_in_name_order(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", record("b-1"))
    (tmp_path / "a.json").write_text(json.dumps([record("a-1")]))
    (tmp_path / "notes.txt").write_text("not a dataset")
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "c.jsonl", record("c-1"))  # not recursive
    assert [i.instance_id for i in load_instances(tmp_path)] == ["a-1", "b-1"]


def test_iteration_is_lazy(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", record("a-1"), "{not json")
    instances = iter_instances(path)
    assert next(instances).instance_id == "a-1"
    with pytest.raises(DatasetError, match="line 2"):
        next(instances)


def test_null_declared_fields_are_absent_and_unknown_fields_kept(tmp_path: Path) -> None:
    raw = record(patch=None, image=None, created_at="2023-01-01", hints_text=None)
    instance = instance_from_record(raw, source=tmp_path / "d.jsonl", where="line 1")
    assert instance.patch == ""
    assert instance.image == "host"
    assert instance.model_extra == {"created_at": "2023-01-01", "hints_text": None}


# ------------------------------------------------------------------------------ repo_source


@pytest.mark.parametrize(
    ("given_source", "expected"),
    [
        ("repos/widget", "{base}/repos/widget"),
        ("./repos/../mirrors/widget.git", "{base}/mirrors/widget.git"),
        ("/srv/git/widget", "/srv/git/widget"),
        ("https://github.com/acme/widget.git", "https://github.com/acme/widget.git"),
        ("file:///srv/git/widget", "file:///srv/git/widget"),
        ("git@github.com:acme/widget.git", "git@github.com:acme/widget.git"),
        ("ssh://git@host:22/acme/widget", "ssh://git@host:22/acme/widget"),
    ],
)
def test_repo_source_resolution(tmp_path: Path, given_source: str, expected: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = write_jsonl(data_dir / "d.jsonl", record(repo_source=given_source))
    (instance,) = load_instances(path)
    assert instance.repo_source == expected.format(base=data_dir)


def test_repo_source_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write_jsonl(tmp_path / "d.jsonl", record(repo_source="~/git/widget"))
    (instance,) = load_instances(path)
    assert instance.repo_source == str(tmp_path / "home" / "git" / "widget")


def test_repo_source_relative_to_a_relative_dataset_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "d.jsonl", record(repo_source="repos/widget"))
    monkeypatch.chdir(tmp_path)
    (instance,) = load_instances("data/d.jsonl")
    assert instance.repo_source == str(tmp_path / "data" / "repos" / "widget")


# ------------------------------------------------------------------------------ errors


def test_missing_required_field_names_file_line_id_and_field(tmp_path: Path) -> None:
    bad = record("a-2")
    del bad["base_commit"]
    path = write_jsonl(tmp_path / "d.jsonl", record("a-1"), bad)
    with pytest.raises(DatasetError) as caught:
        load_instances(path)
    error = caught.value
    assert str(error) == (
        f"{path}, line 2 (instance_id 'a-2'): missing required field 'base_commit'"
    )
    assert (error.where, error.instance_id, error.fields) == ("line 2", "a-2", ("base_commit",))


def test_malformed_json_string_in_fail_to_pass(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([record("a-1"), record("a-2", FAIL_TO_PASS='["t1", ')]))
    with pytest.raises(DatasetError) as caught:
        load_instances(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, index 1 (instance_id 'a-2'): field 'FAIL_TO_PASS': ")
    assert "not valid JSON" in message
    assert caught.value.fields == ("FAIL_TO_PASS",)


def test_several_invalid_fields_are_all_reported(tmp_path: Path) -> None:
    bad = record(eval_timeout=-1, PASS_TO_PASS=[1, 2])
    del bad["test_patch"]
    with pytest.raises(DatasetError) as caught:
        instance_from_record(bad, source=tmp_path / "d.jsonl", where="line 9")
    assert set(caught.value.fields) == {"test_patch", "PASS_TO_PASS", "eval_timeout"}
    assert "missing required field 'test_patch'" in str(caught.value)
    assert "field 'eval_timeout'" in str(caught.value)


def test_invalid_json_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", record("a-1"), '{"instance_id": "a-2",')
    with pytest.raises(DatasetError, match=r"d\.jsonl, line 2: invalid JSON \(.* at column \d+\)"):
        load_instances(path)


def test_invalid_json_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[{"instance_id": "a-1"}')
    with pytest.raises(DatasetError, match=r"d\.json: invalid JSON \(.* at line 1, column \d+\)"):
        load_instances(path)


@pytest.mark.parametrize("line", ['["a", "b"]', '"text"', "42"])
def test_record_must_be_an_object(tmp_path: Path, line: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", line)
    with pytest.raises(DatasetError, match=r"line 1: record must be a JSON object"):
        load_instances(path)


def test_json_top_level_scalar(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text("3")
    with pytest.raises(DatasetError, match="top-level JSON must be a list of records"):
        load_instances(path)


def test_json_mapping_key_must_match_instance_id(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"a-1": record("a-9")}))
    with pytest.raises(DatasetError) as caught:
        load_instances(path)
    assert str(caught.value) == (
        f"{path}, key 'a-1' (instance_id 'a-1'): instance_id 'a-9' differs from its key"
    )


def test_duplicate_instance_id_in_one_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", record("a-1"), record("a-2"), record("a-1"))
    with pytest.raises(DatasetError) as caught:
        load_instances(path)
    assert str(caught.value) == (
        f"{path}, line 3 (instance_id 'a-1'): duplicate instance_id, first seen at {path}, line 1"
    )
    assert caught.value.fields == ("instance_id",)


def test_duplicate_instance_id_across_files(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", record("x-1"))
    write_parquet(tmp_path / "b.parquet", [record("x-2"), record("x-1")])
    with pytest.raises(DatasetError, match=rf"b\.parquet, row 1 .*first seen at {first}, line 1"):
        load_instances(tmp_path)


def test_parquet_row_errors_are_located(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "d.parquet", [record("a-1"), record("a-2", base_commit=None)])
    with pytest.raises(DatasetError, match=r"row 1 \(instance_id 'a-2'\): missing .*'base_commit'"):
        load_instances(path)


def test_unreadable_parquet(tmp_path: Path) -> None:
    need_module("pyarrow", EVAL)
    path = tmp_path / "d.parquet"
    path.write_text("not parquet")
    with pytest.raises(DatasetError, match=r"d\.parquet: unreadable parquet file"):
        load_instances(path)


def test_unsupported_suffix_empty_directory_and_missing_path(tmp_path: Path) -> None:
    csv = tmp_path / "d.csv"
    csv.write_text("instance_id\n")
    with pytest.raises(DatasetError, match=r"unsupported file type '\.csv'"):
        load_instances(csv)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="directory holds no dataset file"):
        load_instances(empty)
    with pytest.raises(FileNotFoundError, match="dataset not found"):
        load_instances(tmp_path / "missing.jsonl")


def test_dataset_error_survives_pickling(tmp_path: Path) -> None:
    error = DatasetError(
        tmp_path / "d.jsonl", "boom", where="line 4", instance_id="a-1", fields=("patch",)
    )
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, DatasetError)
    assert (str(copy), copy.where, copy.instance_id, copy.fields) == (
        str(error),
        "line 4",
        "a-1",
        ("patch",),
    )


# ------------------------------------------------------------------------------ round trips

_test_ids = st.lists(st.from_regex(r"tests/test_[a-z]{1,8}\.py::test_[a-z_]{1,12}", fullmatch=True))


@settings(max_examples=30, deadline=None)
@given(
    ids=st.lists(st.from_regex(r"[a-z]{1,6}__[a-z]{1,6}-[0-9]{1,4}", fullmatch=True), unique=True),
    f2p=_test_ids,
    as_json_string=st.booleans(),
    fmt=st.sampled_from(["jsonl", "json"]),
)
def test_round_trip(
    tmp_path_factory: pytest.TempPathFactory,
    ids: list[str],
    f2p: list[str],
    as_json_string: bool,
    fmt: str,
) -> None:
    rows = [record(i, FAIL_TO_PASS=json.dumps(f2p) if as_json_string else f2p) for i in ids]
    path = tmp_path_factory.mktemp("rt") / f"d.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, *rows)
    else:
        path.write_text(json.dumps(rows))
    instances = load_instances(path)
    assert [i.instance_id for i in instances] == ids
    assert [i.FAIL_TO_PASS for i in instances] == [f2p] * len(ids)
