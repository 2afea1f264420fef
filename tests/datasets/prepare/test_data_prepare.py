"""Each preprocessor turns its fixture (the source's own schema) into rows; bad input is named."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from dataprep_support import (
    FIXTURES,
    MINICALC_BASE,
    ROOT,
    fixture_rows,
    run_prepare,
    write_jsonl,
)
from requirements import EVAL, need_module

from sandlot.cli.main import cli
from sandlot.datasets.images import IMAGE_PATH
from sandlot.datasets.loaders import DatasetError, load_instances
from sandlot.datasets.local import LocalRowError
from sandlot.datasets.prepare import OutputDirError
from sandlot.datasets.r2e_gym import SETUP_CMD, TEST_CMD
from sandlot.datasets.rows import TaskRow
from sandlot.sandboxes.images import ImageFamily

pa = need_module("pyarrow", EVAL)
pq = need_module("pyarrow.parquet", EVAL)

INSTALL = "python -m pip install --no-build-isolation --no-deps --no-index -q -e ."
PYTEST = "python -m pytest --no-header -rA --tb=no -p no:cacheprovider"


def _rows(path: Path) -> list[TaskRow]:
    return [TaskRow.from_record(r) for r in pq.read_table(path).to_pylist()]


@pytest.mark.parametrize(
    ("name", "backend", "file_name", "image"),
    [
        (
            "swe_bench_verified",
            "modal",
            "swe_bench_verified_modal.parquet",
            "swebench/sweb.eval.x86_64.minicalc_1776_minicalc-1:latest",
        ),
        (
            "swe_rebench",
            "vefaas",
            "swe_rebench_filtered_vefaas.parquet",
            "enterprise-public-2-cn-beijing.cr.volces.com/swe-rebench/minicalc_1776_minicalc-1:latest",
        ),
        (
            "r2e_gym_subset",
            "docker",
            "r2e_gym_subset_docker.parquet",
            "namanjain12/minicalc_final:bf63c81552bef6782859a6a50551bc0c66a7be6e",
        ),
    ],
)
def test_fixture_becomes_valid_rows(
    name: str, backend: str, file_name: str, image: str, tmp_path: Path
) -> None:
    result = run_prepare(name, tmp_path, backend)  # type: ignore[arg-type]
    assert result.path == tmp_path / file_name
    assert result.report.ok and result.rows == len(fixture_rows(name))
    rows = _rows(result.path)
    first = rows[0]
    env = first.extra_info.tools_kwargs.env
    assert env.image == image
    assert env.sandbox.backend == backend and env.workdir == "/testbed"
    assert [r.extra_info.index for r in rows] == list(range(len(rows)))
    assert [m.role for m in first.prompt] == ["system", "user"]
    assert first.agent_name == "swe_agent"
    assert first.reward_model.model_dump() == {
        "style": "rule",
        "ground_truth": first.extra_info.instance_id,
    }
    for row in rows:
        text = "".join(m.content for m in row.prompt)
        assert row.instance.patch not in text
        assert not row.instance.test_patch or row.instance.test_patch not in text
    # What the evaluator reads from the file is the instance in the row.
    assert load_instances(result.path) == [r.instance for r in rows]


def test_swe_bench_rows_use_the_image_as_is(tmp_path: Path) -> None:
    rows = _rows(run_prepare("swe_bench_verified", tmp_path, "docker").path)
    inst = rows[0].instance
    source = fixture_rows("swe_bench_verified")[0]
    assert rows[0].data_source == "princeton-nlp/SWE-bench_Verified"
    assert rows[0].extra_info.tools_kwargs.reward.name == "swe_bench"
    # The fixture's repositories are not in swebench's specifications: its rows name their
    # test command, a field sandlot's instance files add to the SWE-bench columns.
    assert inst.post_setup_cmd is None and inst.test_cmd == source["test_cmd"]
    assert inst.env == {"PATH": IMAGE_PATH[ImageFamily.SWE_BENCH]}
    assert json.loads(source["FAIL_TO_PASS"]) == inst.FAIL_TO_PASS
    extras = inst.model_extra or {}
    assert extras["environment_setup_commit"] == source["environment_setup_commit"]
    assert extras["difficulty"] == source["difficulty"]


def test_swe_rebench_rows_run_the_dataset_test_command(tmp_path: Path) -> None:
    rows = _rows(run_prepare("swe_rebench", tmp_path, "modal").path)
    inst = rows[0].instance
    # The history after base_commit goes in every sandbox's set-up (prepare_repo), not here.
    assert inst.post_setup_cmd is None
    assert inst.test_cmd == f"{INSTALL}\n{PYTEST} tests/test_evaluator.py"
    assert inst.log_parser == "parse_log_pytest"
    extras = inst.model_extra or {}
    assert "requirements" not in extras and "environment" not in extras
    assert extras["FAIL_TO_FAIL"] == [] and extras["install_config"]["install"] == INSTALL
    assert rows[1].instance.test_cmd.endswith(f"{PYTEST} tests/test_wrap.py")  # type: ignore[union-attr]


def test_swe_rebench_local_rows_install_from_the_mirror(tmp_path: Path, mirror: Path) -> None:
    rows = _rows(run_prepare("swe_rebench", tmp_path, "local", repo_mirror=str(mirror)).path)
    inst = rows[0].instance
    assert inst.image == "host"
    assert inst.repo_source == str(mirror / "sandlot-examples__minicalc")
    assert inst.post_setup_cmd == INSTALL
    assert inst.test_cmd == f"{PYTEST} tests/test_evaluator.py"
    assert inst.env == {}


@pytest.mark.parametrize("name", ["swe_bench_verified", "swe_rebench", "r2e_gym_subset"])
def test_local_images_rows_are_the_docker_rows_on_the_local_backend(
    name: str, tmp_path: Path
) -> None:
    """--local-images: one file, the same instances as docker's, run by local (no mirror)."""
    docker = _rows(run_prepare(name, tmp_path / "docker", "docker").path)
    local = _rows(run_prepare(name, tmp_path / "local", "local", local_images=True).path)
    assert [r.instance for r in local] == [r.instance for r in docker]
    for row in local:
        env = row.extra_info.tools_kwargs.env
        assert env.sandbox.backend == "local" and env.repo_source is None
        assert env.image == row.instance.image_for("docker") != "host"


def test_local_images_changes_nothing_for_other_backends(tmp_path: Path) -> None:
    plain = _rows(run_prepare("swe_bench_verified", tmp_path / "a", "modal").path)
    flagged = _rows(
        run_prepare("swe_bench_verified", tmp_path / "b", "modal", local_images=True).path
    )
    assert [r.instance for r in flagged] == [r.instance for r in plain]


def test_r2e_rows_grade_with_the_hidden_tests(tmp_path: Path) -> None:
    rows = _rows(run_prepare("r2e_gym_subset", tmp_path, "vefaas").path)
    inst = rows[0].instance
    source = fixture_rows("r2e_gym_subset")[0]
    assert inst.instance_id == "minicalc__bf63c81552"
    assert inst.base_commit == MINICALC_BASE
    assert (
        inst.image == "enterprise-public-cn-beijing.cr.volces.com/r2e-gym-subset/bf63c81552:latest"
    )
    assert inst.patch.startswith("diff --git a/minicalc/ops.py b/minicalc/ops.py")
    assert "tests/" not in inst.patch and "README" not in inst.patch
    assert inst.test_patch == "" and inst.PASS_TO_PASS == []
    assert inst.FAIL_TO_PASS == [
        "TestPrecedence.test_power_binds_tighter_than_multiplication",
        "test_addition",
        "test_power",
    ]
    assert inst.log_parser == "r2e_gym"
    assert inst.problem_statement.startswith("Title: Support exponentiation")
    assert (inst.post_setup_cmd, inst.test_cmd) == (SETUP_CMD, TEST_CMD)
    assert inst.env == {"PATH": IMAGE_PATH[ImageFamily.R2E_GYM]}
    dumped = inst.model_dump_json()
    assert "parsed_commit_content" not in dumped and source["prompt"] not in dumped


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_json_and_parquet_inputs_give_the_same_rows(suffix: str, tmp_path: Path) -> None:
    for name in ("swe_bench_verified", "swe_rebench"):
        source = fixture_rows(name)
        converted = tmp_path / f"{name}{suffix}"
        if suffix == ".json":
            converted.write_text(json.dumps(source))
        else:
            pq.write_table(pa.Table.from_pylist(source), converted)
        expected = _rows(run_prepare(name, tmp_path / "a", "docker").path)
        assert _rows(run_prepare(name, tmp_path / "b", "docker", input=converted).path) == expected


def test_max_instances_and_seed(tmp_path: Path) -> None:
    ids = [r["instance_id"] for r in fixture_rows("swe_bench_verified")]
    first = run_prepare("swe_bench_verified", tmp_path / "a", "docker", max_instances=1)
    assert [r.extra_info.instance_id for r in _rows(first.path)] == ids[:1]
    for seed in (1, 2, 3):
        shuffled = list(ids)
        random.Random(seed).shuffle(shuffled)
        out = run_prepare("swe_bench_verified", tmp_path / f"s{seed}", "docker", seed=seed)
        assert [r.extra_info.instance_id for r in _rows(out.path)] == shuffled


def test_split_names_the_swe_rebench_output(tmp_path: Path) -> None:
    result = run_prepare("swe_rebench", tmp_path, "modal", split="test")
    assert result.path.name == "swe_rebench_test_modal.parquet"


def test_hugging_face_input_is_loaded_lazily_with_the_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []

    def load_dataset(dataset_id: str, split: str) -> list[dict[str, Any]]:
        calls.append((dataset_id, split))
        return fixture_rows("swe_bench_verified")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    result = run_prepare(
        "swe_bench_verified", tmp_path, "docker", input="princeton-nlp/SWE-bench_Verified"
    )
    assert calls == [("princeton-nlp/SWE-bench_Verified", "test")] and result.rows == 2
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ImportError, match=r"sandlot\[data\]"):
        run_prepare("swe_rebench", tmp_path, "docker", input="nebius/SWE-rebench")


# ---- bad input -------------------------------------------------------------------------------


def test_source_row_missing_fail_to_pass(tmp_path: Path) -> None:
    for name in ("swe_bench_verified", "swe_rebench"):
        rows = fixture_rows(name)
        del rows[1]["FAIL_TO_PASS"]
        source = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        with pytest.raises(DatasetError) as err:
            run_prepare(name, tmp_path / "out", "docker", input=source)
        assert err.value.fields == ("FAIL_TO_PASS",) and err.value.where == "line 2"
        assert "textkit__textkit-1" in str(err.value) and "missing required field" in str(err.value)
    assert not (tmp_path / "out" / "swe_bench_verified_docker.parquet").exists()


def test_fail_to_pass_given_as_malformed_json(tmp_path: Path) -> None:
    rows = fixture_rows("swe_bench_verified")
    rows[0]["FAIL_TO_PASS"] = '["tests/test_evaluator.py::test_division_is_true_division"'
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(DatasetError) as err:
        run_prepare("swe_bench_verified", tmp_path, "docker", input=source)
    assert err.value.fields == ("FAIL_TO_PASS",)
    assert "not valid JSON" in str(err.value) and "line 1" in str(err.value)


def _prepare_for(deployment: str, tmp_path: Path) -> Result:
    return CliRunner().invoke(
        cli,
        [
            "data",
            "prepare",
            "swe_bench_verified",
            "--input",
            str(FIXTURES / "swe_bench_verified.jsonl"),
            "--local-save-dir",
            str(tmp_path),
        ],
        env={"DEPLOYMENT": deployment},
    )


def test_unknown_deployment_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    result = _prepare_for("no-such-backend", tmp_path)
    assert result.exit_code == 2
    assert "unknown sandbox backend 'no-such-backend' (set by $DEPLOYMENT)" in result.output
    assert all(name in result.output for name in ("local", "docker", "modal", "vefaas"))


def test_a_backend_without_a_preparation_is_refused_with_the_supported_ones(
    tmp_path: Path,
) -> None:
    # kubernetes is a registered backend without a preparation of its own (docs/kubernetes.md).
    result = _prepare_for("kubernetes", tmp_path)
    assert result.exit_code == 2
    assert "cannot be prepared for 'kubernetes' (from $DEPLOYMENT)" in result.output
    assert "supported: local, docker, modal, vefaas" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_output_directory_that_is_not_writable(where: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out" if where == "under-a-file" else Path("/proc/sandlot-out")
    with pytest.raises(OutputDirError, match="not writable"):
        run_prepare("swe_bench_verified", out, "docker")
    result = CliRunner().invoke(
        cli,
        [
            "data",
            "prepare",
            "swe_bench_verified",
            "--input",
            str(FIXTURES / "swe_bench_verified.jsonl"),
            "--local-save-dir",
            str(out),
            "--deployment",
            "docker",
        ],
    )
    assert result.exit_code == 1 and "not writable" in result.output


def test_input_pointing_to_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="input file not found"):
        run_prepare("swe_rebench", tmp_path, "docker", input=tmp_path / "nope.jsonl")
    result = CliRunner().invoke(
        cli,
        [
            "data",
            "prepare",
            "swe_rebench",
            "--input",
            "./missing.parquet",
            "--local-save-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 1 and "input file not found" in result.output


def test_local_deployment_needs_a_mirror_with_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDLOT_REPO_MIRROR", raising=False)
    with pytest.raises(LocalRowError, match="SANDLOT_REPO_MIRROR"):
        run_prepare("swe_bench_verified", tmp_path, "local")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="git clone --mirror") as err:
        run_prepare("swe_bench_verified", tmp_path, "local", repo_mirror=str(tmp_path / "empty"))
    assert err.value.fields == ("repo",)
    with pytest.raises(LocalRowError, match="supported: docker, modal, vefaas"):
        run_prepare("r2e_gym_subset", tmp_path, "local", repo_mirror=str(tmp_path / "empty"))


def test_bad_r2e_rows(tmp_path: Path) -> None:
    cases: list[tuple[str, Any, str]] = [
        ("docker_image", None, "docker_image"),
        ("expected_output_json", json.dumps({"t": "FAILED"}), "no test is expected to pass"),
        ("parsed_commit_content", "{}", "ParsedCommit"),
    ]
    for field, value, message in cases:
        row = fixture_rows("r2e_gym_subset")[0]
        row[field] = value
        source = write_jsonl(tmp_path / "in.jsonl", [row])
        with pytest.raises(DatasetError, match=message) as err:
            run_prepare("r2e_gym_subset", tmp_path, "modal", input=source)
        assert err.value.fields == (field,)


def test_duplicate_instance_ids(tmp_path: Path) -> None:
    rows = fixture_rows("swe_rebench")
    source = write_jsonl(tmp_path / "in.jsonl", [rows[0], rows[1], rows[0]])
    with pytest.raises(DatasetError, match="duplicate instance_id, first seen at line 1"):
        run_prepare("swe_rebench", tmp_path, "docker", input=source)


def test_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandlot.datasets.swe_rebench",
            "--input",
            str(FIXTURES / "swe_rebench.jsonl"),
            "--local-save-dir",
            str(tmp_path),
            "--max-instances",
            "1",
        ],
        env={"DEPLOYMENT": "modal", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.strip() == f"wrote 1 rows to {tmp_path / 'swe_rebench_filtered_modal.parquet'}"
    )
