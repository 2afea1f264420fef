"""``write_subset``: the kept rows of a dataset, in its own format and order, as read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandlot.datasets.errors import DatasetError
from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import iter_records, load_instances
from sandlot.datasets.parquet import write_rows
from sandlot.datasets.rows import build_row
from sandlot.datasets.subset import write_subset

KEEP = {"o__r-1", "o__r-3"}


def _record(n: int) -> dict[str, object]:
    return {
        "instance_id": f"o__r-{n}",
        "base_commit": "abc",
        "patch": "diff",
        "test_patch": "",
        "FAIL_TO_PASS": ["t::f"],
        "PASS_TO_PASS": [],
        "extra_field": n,  # kept as read
    }


def test_jsonl_lines_are_kept_as_read(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(_record(n)) + "\n" for n in (1, 2, 3)))
    assert write_subset(source, KEEP, tmp_path / "kept.jsonl") == 2
    lines = (tmp_path / "kept.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [_record(1), _record(3)]


@pytest.mark.parametrize("shape", ["list", "wrapped", "keyed"])
def test_json_keeps_its_top_level_shape(tmp_path: Path, shape: str) -> None:
    records = [_record(n) for n in (1, 2, 3)]
    data: object = {
        "list": records,
        "wrapped": {"instances": records, "note": "metadata"},
        "keyed": {
            r["instance_id"]: {k: v for k, v in r.items() if k != "instance_id"} for r in records
        },
    }[shape]
    source = tmp_path / "rows.json"
    source.write_text(json.dumps(data))
    write_subset(source, KEEP, tmp_path / "kept.json")
    kept = json.loads((tmp_path / "kept.json").read_text())
    if shape == "list":
        assert kept == [records[0], records[2]]
    elif shape == "wrapped":
        assert kept == {"instances": [records[0], records[2]], "note": "metadata"}
    else:
        assert list(kept) == ["o__r-1", "o__r-3"] and "instance_id" not in kept["o__r-1"]


def test_verl_parquet_rows_stay_verl_rows(tmp_path: Path) -> None:
    rows = [
        build_row(
            Instance.model_validate(_record(n)),
            index=n,
            prompt=[{"role": "user", "content": f"task {n}"}],
            data_source="test",
            reward_name="swe",
            backend="local",
        )
        for n in (1, 2, 3)
    ]
    source = write_rows(rows, tmp_path / "rows.parquet")
    write_subset(source, KEEP, tmp_path / "kept.parquet")
    kept = [record for _, record in iter_records(tmp_path / "kept.parquet")]
    every = [record for _, record in iter_records(source)]
    assert kept == [every[0], every[2]]
    assert [i.instance_id for i in load_instances(tmp_path / "kept.parquet")] == sorted(KEEP)


def test_another_format_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(_record(1)) + "\n")
    with pytest.raises(DatasetError, match=r"\.jsonl"):
        write_subset(source, KEEP, tmp_path / "kept.parquet")
    assert not (tmp_path / "kept.parquet").exists()
