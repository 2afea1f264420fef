"""Files made by uni-agent's preprocessing scripts: recognised, converted, and read as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dataprep_support import fixture_rows
from requirements import EVAL, need_module

from sandlot.cli.main import cli
from sandlot.datasets.images import IMAGE_PATH
from sandlot.datasets.loaders import DatasetError, load_instances
from sandlot.datasets.r2e_commit import gold_patch
from sandlot.datasets.r2e_gym import GRADED_PATHS, R2E_GYM_LOG_PARSER, SETUP_CMD, TEST_CMD
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.validate import validate_file
from sandlot.rollout.rows import load_rows
from sandlot.sandboxes.images import ImageFamily

pa = need_module("pyarrow", EVAL)
pq = need_module("pyarrow.parquet", EVAL)
need_module("swebench", EVAL)

SYSTEM = "You are a helpful assistant that can interact with a computer to solve tasks."
INSTALL = "python -m pip install --no-build-isolation --no-deps --no-index -q -e ."
PYTEST = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
VOLCES_R2E = "enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/bf63c81552:latest"
UNI_AGENT_RESET = (
    "git tag -d $(git tag -l) || true && git reflog expire --expire=now --all || true && "
    "git gc --prune=now || true"
)


def _sample(image: str, post_setup: str, name: str, metadata: dict[str, Any], issue: str) -> Any:
    """A row as uni-agent's examples/data_preprocess scripts build it (before its refactor)."""
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"<issue_description>\n{issue}\n</issue_description>"},
        ],
        "agent_name": "swe_agent",
        "extra_info": {
            "tools_kwargs": {
                "env": {"deployment": {"image": image}, "post_setup_cmd": post_setup},
                "reward": {"name": name, "metadata": metadata},
            }
        },
    }


def uni_agent_rows(name: str) -> list[dict[str, Any]]:
    """Our fixtures put through uni-agent's preprocessing, field for field."""
    if name == "swe_bench":
        return [
            _sample(
                f"swebench/sweb.eval.x86_64.{r['instance_id'].lower().replace('__', '_1776_')}",
                "",
                "swe_bench",
                r,
                r["problem_statement"],
            )
            for r in fixture_rows("swe_bench_verified")
        ]
    if name == "swe_rebench":
        out = []
        for r in fixture_rows("swe_rebench"):
            keep = ("instance_id", "base_commit", "patch", "problem_statement", "repo")
            metadata = {k: r[k] for k in keep}
            metadata.update(
                {k: r[k] for k in ("test_patch", "FAIL_TO_PASS", "FAIL_TO_FAIL")},
                PASS_TO_PASS=r["PASS_TO_PASS"],
                PASS_TO_FAIL=r["PASS_TO_FAIL"],
                install=r["install_config"]["install"],
                log_parser=r["install_config"]["log_parser"],
                test_cmd=r["install_config"]["test_cmd"],
            )
            key = r["instance_id"].lower().replace("__", "_1776_")
            image = f"swerebench/sweb.eval.x86_64.{key}"
            out.append(
                _sample(image, UNI_AGENT_RESET, "swe_rebench", metadata, r["problem_statement"])
            )
        return out
    [r] = fixture_rows("r2e_gym_subset")
    metadata = {
        "repo": r["repo_name"],
        "instance_id": f"{r['repo_name']}__{r['commit_hash'][:10]}",
        "patch": gold_patch(json.loads(r["parsed_commit_content"])),
        "expected_output_json": r["expected_output_json"],
    }
    return [_sample(VOLCES_R2E, "mv /r2e_tests /root/r2e_tests", "r2e_gym", metadata, "Support ^")]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)  # structs, as `datasets` writes them
    return path


@pytest.mark.parametrize("name", ["swe_bench", "swe_rebench", "r2e_gym"])
def test_validate_recognises_the_layout_and_says_so(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / f"{name}_modal.parquet", uni_agent_rows(name))
    report = validate_file(path)
    assert report.layout == "uni-agent" and report.ok, report.errors
    result = CliRunner().invoke(cli, ["data", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "uni-agent's row layout" in result.output
    assert "sandlot data convert --from uni-agent" in result.output


def _convert(source: Path, out: Path) -> list[TaskRow]:
    args = ["data", "convert", "--from", "uni-agent", str(source), str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = validate_file(out)
    assert report.layout == "sandlot" and report.ok, report.errors
    assert f"wrote {report.rows} rows to {out}" in result.output
    return [TaskRow.from_record(r) for r in pq.read_table(out).to_pylist()]


def test_convert_rewrites_into_sandlot_rows(tmp_path: Path) -> None:
    # One file of two datasets: Arrow gives the metadata struct the union of their keys.
    mixed = _write(
        tmp_path / "mixed.parquet", uni_agent_rows("swe_bench") + uni_agent_rows("r2e_gym")
    )
    converted = _convert(mixed, tmp_path / "out" / "mixed.parquet")
    assert [r.extra_info.index for r in converted] == [0, 1, 2]
    verified, r2e = converted[0], converted[2]
    source = _write(tmp_path / "rebench.parquet", uni_agent_rows("swe_rebench"))
    rebench = _convert(source, tmp_path / "out" / "rebench.parquet")[0]

    assert verified.data_source == "princeton-nlp/SWE-bench_Verified"
    assert (
        json.loads(fixture_rows("swe_bench_verified")[0]["FAIL_TO_PASS"])
        == verified.instance.FAIL_TO_PASS
    )
    assert verified.instance.env == {"PATH": IMAGE_PATH[ImageFamily.SWE_BENCH]}
    assert verified.extra_info.tools_kwargs.env.post_setup_cmd is None
    assert verified.extra_info.tools_kwargs.env.sandbox.backend == "docker"

    inst = rebench.instance
    assert rebench.extra_info.tools_kwargs.reward.name == "swe_rebench"
    assert inst.test_cmd == f"{INSTALL}\n{PYTEST} tests/test_evaluator.py"
    assert inst.post_setup_cmd is None  # prepare_repo removes the history after base_commit
    assert inst.log_parser == "parse_log_pytest"

    inst = r2e.instance
    assert r2e.extra_info.tools_kwargs.env.sandbox.backend == "vefaas"
    assert inst.image == VOLCES_R2E and inst.log_parser == R2E_GYM_LOG_PARSER
    assert inst.FAIL_TO_PASS == [
        "TestPrecedence.test_power_binds_tighter_than_multiplication",
        "test_addition",
        "test_power",
    ]
    assert (inst.test_cmd, inst.post_setup_cmd, inst.base_commit) == (TEST_CMD, SETUP_CMD, "HEAD")
    assert inst.graded_paths == list(GRADED_PATHS)


def test_convert_names_any_registered_backend(tmp_path: Path, fakecloud: str) -> None:
    source = _write(tmp_path / "verified.parquet", uni_agent_rows("swe_bench"))
    out = tmp_path / "out.parquet"
    args = ["data", "convert", "--from", "uni-agent", str(source), str(out)]
    result = CliRunner().invoke(cli, [*args, "--backend", fakecloud])
    assert result.exit_code == 0, result.output
    [row, *_] = [TaskRow.from_record(r) for r in pq.read_table(out).to_pylist()]
    assert row.extra_info.tools_kwargs.env.sandbox.backend == "fakecloud"
    refused = CliRunner().invoke(cli, [*args, "--backend", "nocloud"])
    assert refused.exit_code == 2 and "unknown sandbox backend 'nocloud'" in refused.output
    assert "fakecloud" in refused.output


def test_eval_and_the_agent_loop_read_both_layouts(tmp_path: Path) -> None:
    source = _write(tmp_path / "rebench.parquet", uni_agent_rows("swe_rebench"))
    out = tmp_path / "converted.parquet"
    assert (
        CliRunner()
        .invoke(cli, ["data", "convert", "--from", "uni-agent", str(source), str(out)])
        .exit_code
        == 0
    )
    # sandlot eval's loader
    assert load_instances(source) == load_instances(out)
    # sandlot rollout's loader
    direct = load_rows(source, backend="docker")
    assert [r.instance for r in direct] == [r.instance for r in load_rows(out, backend="docker")]
    assert direct[0].prompt[0].content == SYSTEM
    # the verl agent loop: keyword arguments as verl's RLHFDataset passes a row
    record = pq.read_table(source).to_pylist()[1]
    kwargs = {**record, "raw_prompt": record["prompt"], "index": 1, "tools_kwargs": {}}
    assert TaskRow.from_record(kwargs).instance == load_instances(out)[1]


def test_the_new_uni_agent_layout_is_read_too(tmp_path: Path) -> None:
    [old] = uni_agent_rows("r2e_gym")
    tools = old["extra_info"]["tools_kwargs"]
    task = {
        "name": "r2e_gym",
        "sandbox": {"image": VOLCES_R2E},
        "prompt": "x",
        "metadata": tools["reward"]["metadata"],
    }
    new = {
        "data_source": "R2E-Gym/R2E-Gym-Subset",
        "prompt": old["prompt"],
        "extra_info": {"tools_kwargs": {"task": task}},
    }
    path = _write(tmp_path / "new.parquet", [new])
    report = validate_file(path)
    assert report.layout == "uni-agent" and report.ok, report.errors
    [inst] = load_instances(path)
    assert inst.instance_id == "minicalc__bf63c81552" and inst.log_parser == R2E_GYM_LOG_PARSER


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "terminal_bench"}, "reward name 'terminal_bench' has no sandlot grader"),
        ({"metadata": {"FAIL_TO_PASS": []}}, "FAIL_TO_PASS: is empty"),
        ({"metadata": {"test_cmd": None}}, "metadata.test_cmd is missing"),
    ],
)
def test_bad_uni_agent_rows_are_named(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    rows = uni_agent_rows("swe_rebench")
    reward = rows[1]["extra_info"]["tools_kwargs"]["reward"]
    for key, value in change.items():
        if isinstance(value, dict):
            reward[key].update(value)
        else:
            reward[key] = value
    source = _write(tmp_path / "bad.parquet", rows)
    validated = CliRunner().invoke(cli, ["data", "validate", str(source)])
    assert validated.exit_code == 1 and "row 1:" in validated.output and message in validated.output
    out = tmp_path / "out.parquet"
    args = ["data", "convert", "--from", "uni-agent", str(source), str(out)]
    stopped = CliRunner().invoke(cli, args)
    assert stopped.exit_code == 1 and "row 1" in stopped.output and message in stopped.output
    assert "textkit__textkit-1" in stopped.output and not out.exists()
    skipped = CliRunner().invoke(cli, [*args, "--skip-invalid"])
    assert skipped.exit_code == 0, skipped.output
    assert pq.read_table(out).num_rows == 1
    [entry] = (tmp_path / "out.rejected.jsonl").read_text().splitlines()
    assert json.loads(entry)["where"] == "row 1"


def test_convert_refuses_a_file_that_is_not_uni_agent(tmp_path: Path) -> None:
    source = tmp_path / "plain.jsonl"
    source.write_text(json.dumps(fixture_rows("swe_rebench")[0]) + "\n")
    with pytest.raises(DatasetError, match="not a uni-agent row"):
        from sandlot.datasets.convert import convert_file

        convert_file(source, tmp_path / "out.parquet")
