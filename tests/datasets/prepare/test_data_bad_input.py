"""Bad rows are caught at prepare time, named, and never cost the user a good output file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dataprep_support import FIXTURES, ROOT, fixture_rows, run_prepare, write_jsonl
from requirements import EVAL, need_module

from sandlot.cli.main import cli
from sandlot.datasets.loaders import DatasetError

pq = need_module("pyarrow.parquet", EVAL)
need_module("swebench", EVAL)


def _module(name: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run ``python -m sandlot.datasets.<name> ARGS`` as a user would."""
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [sys.executable, "-m", f"sandlot.datasets.{name}", *args],
        env={**base, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.e2e
def test_a_rejected_output_never_replaces_the_good_file(tmp_path: Path) -> None:
    good = _module(
        "swe_bench_verified",
        "--input",
        str(FIXTURES / "swe_bench_verified.jsonl"),
        "--local-save-dir",
        str(tmp_path),
        env={"DEPLOYMENT": "modal"},
    )
    assert good.returncode == 0, good.stderr
    target = tmp_path / "swe_bench_verified_modal.parquet"
    before = target.read_bytes()
    rows = fixture_rows("swe_bench_verified")
    rows[1]["FAIL_TO_PASS"] = "[]"
    bad = _module(
        "swe_bench_verified",
        "--input",
        str(write_jsonl(tmp_path / "rows.jsonl", rows)),
        "--local-save-dir",
        str(tmp_path),
        env={"DEPLOYMENT": "modal"},
    )
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    [error] = [line for line in bad.stderr.splitlines() if line.startswith("Error:")]
    assert "line 2" in error and "textkit__textkit-1" in error and "FAIL_TO_PASS" in error
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["rows.jsonl", "swe_bench_verified_modal.parquet"]
    )


def test_a_file_failing_validation_after_writing_is_not_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: validation of the written file, before it replaces the old."""
    first = run_prepare("swe_rebench", tmp_path, "docker")
    before = first.path.read_bytes()
    import sandlot.datasets.prepare as prepare_module
    from sandlot.datasets.validate import Problem, ValidationReport

    def rejecting(path: Path) -> ValidationReport:
        report = ValidationReport(path=Path(path), rows=2)
        report.errors.append(Problem(0, "prompt", "made up", "nothing"))
        return report

    monkeypatch.setattr(prepare_module, "validate_file", rejecting)
    with pytest.raises(DatasetError, match="fail validation, not written: row 0: prompt"):
        run_prepare("swe_rebench", tmp_path, "docker")
    assert first.path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_output_files_honour_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        rows = fixture_rows("swe_rebench")
        rows[1]["install_config"] = "not an object"
        source = write_jsonl(tmp_path / "in.jsonl", rows)
        result = run_prepare(
            "swe_rebench", tmp_path / "out", "docker", input=source, skip_invalid=True
        )
    finally:
        os.umask(old)
    for path in (result.path, result.rejected_path):
        assert path is not None
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def _bad(tmp_path: Path, name: str, change: dict[str, Any], row: int = 0) -> Path:
    rows = fixture_rows(name)
    rows[row].update(change)
    return write_jsonl(tmp_path / f"{name}-bad.jsonl", rows)


@pytest.mark.parametrize(
    ("name", "change", "field", "message"),
    [
        ("swe_rebench", {"install_config": None}, "install_config", "missing required"),
        (
            "swe_bench_verified",
            {"log_parser": "parse_log_nose2"},
            "log_parser",
            "unknown log_parser 'parse_log_nose2'",
        ),
        (
            "swe_bench_verified",
            {"test_cmd": None, "repo": "psf/requests", "version": "9.9"},
            "test_cmd",
            "no version '9.9'",
        ),
        (
            "swe_bench_verified",
            {"test_cmd": None},
            "test_cmd",
            "'sandlot-examples/minicalc'",
        ),
        ("swe_bench_verified", {"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "is empty"),
    ],
)
def test_rows_that_would_not_run_are_named_at_prepare_time(
    tmp_path: Path, name: str, change: dict[str, Any], field: str, message: str
) -> None:
    source = _bad(tmp_path, name, change)
    with pytest.raises(DatasetError, match=message) as err:
        run_prepare(name, tmp_path / "out", "docker", input=source)
    assert err.value.where == "line 1" and err.value.instance_id == "minicalc__minicalc-1"
    assert any(f.endswith(field) for f in err.value.fields), err.value.fields
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_known_repo_and_version_needs_no_test_cmd(tmp_path: Path) -> None:
    source = _bad(
        tmp_path, "swe_bench_verified", {"test_cmd": None, "repo": "psf/requests", "version": "2.0"}
    )
    result = run_prepare("swe_bench_verified", tmp_path / "out", "docker", input=source)
    assert result.rows == 2


@pytest.mark.parametrize(
    ("backend", "image", "message"),
    [
        (
            "modal",
            "enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/x:v2",
            "veFaaS registry, which modal cannot pull from",
        ),
        ("vefaas", "ghcr.io/me/private:1", "neither in the veFaaS registry"),
        ("docker", "host", "only exists on the local backend"),
    ],
)
def test_an_image_that_does_not_fit_the_deployment(
    tmp_path: Path, backend: str, image: str, message: str
) -> None:
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({"textkit__textkit-1": image}))
    args = [
        "data",
        "prepare",
        "swe_bench_verified",
        "--input",
        str(FIXTURES / "swe_bench_verified.jsonl"),
    ]
    args += ["--local-save-dir", str(tmp_path / "out"), "--backend", backend]
    result = CliRunner().invoke(cli, [*args, "--image-overrides", str(overrides)])
    assert result.exit_code == 1, result.output
    assert message in result.output and "line 2" in result.output
    assert "textkit__textkit-1" in result.output and "tools_kwargs.env.image" in result.output


def test_skip_invalid_writes_the_good_rows_and_reports_the_bad(tmp_path: Path) -> None:
    source = _bad(tmp_path, "swe_bench_verified", {"log_parser": "nope"}, row=1)
    args = [
        "data",
        "prepare",
        "swe_bench_verified",
        "--input",
        str(source),
        "--deployment",
        "docker",
    ]
    args += ["--local-save-dir", str(tmp_path / "out")]
    stopped = CliRunner().invoke(cli, args)
    assert stopped.exit_code == 1 and "unknown log_parser 'nope'" in stopped.output
    assert not (tmp_path / "out" / "swe_bench_verified_docker.parquet").exists()
    result = CliRunner().invoke(cli, [*args, "--skip-invalid"])
    assert result.exit_code == 0, result.output
    written = pq.read_table(tmp_path / "out" / "swe_bench_verified_docker.parquet").to_pylist()
    assert [r["extra_info"]["instance_id"] for r in written] == ["minicalc__minicalc-1"]
    assert [r["extra_info"]["index"] for r in written] == [0]
    report = tmp_path / "out" / "swe_bench_verified_docker.rejected.jsonl"
    [entry] = [json.loads(line) for line in report.read_text().splitlines()]
    assert entry["where"] == "line 2" and entry["instance_id"] == "textkit__textkit-1"
    assert "unknown log_parser 'nope'" in entry["problem"]
    assert "skipped 1 invalid rows" in result.output and str(report) in result.output
    # A later clean run leaves no stale report behind.
    clean = [*args[:4], str(FIXTURES / "swe_bench_verified.jsonl"), *args[5:], "--skip-invalid"]
    assert CliRunner().invoke(cli, clean).exit_code == 0
    assert not report.exists()


def test_skip_invalid_with_no_valid_row_left_is_an_error(tmp_path: Path) -> None:
    rows = fixture_rows("swe_rebench")
    for row in rows:
        row["FAIL_TO_PASS"] = []
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(DatasetError, match="all 2 rows are invalid"):
        run_prepare("swe_rebench", tmp_path / "out", "docker", input=source, skip_invalid=True)


def test_validate_names_the_row_whose_tests_cannot_run(tmp_path: Path) -> None:
    path = run_prepare("swe_rebench", tmp_path, "docker").path
    table = pq.read_table(path).to_pylist()
    meta = json.loads(table[1]["extra_info"]["tools_kwargs"]["reward"]["metadata"])
    meta["log_parser"] = "parse_log_unknown"
    table[1]["extra_info"]["tools_kwargs"]["reward"]["metadata"] = json.dumps(meta)
    import pyarrow as pa

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(table), bad)
    result = CliRunner().invoke(cli, ["data", "validate", str(bad)])
    assert result.exit_code == 1
    assert "row 1: extra_info.tools_kwargs.reward.metadata.log_parser" in result.output
    assert "parse_log_unknown" in result.output


def test_r2e_help_offers_only_the_deployments_it_accepts(tmp_path: Path) -> None:
    shown = _module("r2e_gym_subset", "--help")
    assert shown.returncode == 0
    assert "docker | modal | vefaas" in " ".join(shown.stdout.split())
    assert "local" not in shown.stdout.split("--backend", 1)[1].split("--repo-mirror")[0]
    refused = _module(
        "r2e_gym_subset", "--local-save-dir", str(tmp_path), env={"DEPLOYMENT": "local"}
    )
    assert refused.returncode == 2 and "supported: docker, modal, vefaas" in refused.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_prepare_says_which_deployment_it_chose(tmp_path: Path) -> None:
    args = ["--input", str(FIXTURES / "swe_rebench.jsonl"), "--local-save-dir", str(tmp_path)]
    chosen = _module("swe_rebench", *args)
    assert chosen.returncode == 0, chosen.stderr
    assert "backend: docker (from the default); choose with --backend" in chosen.stderr
    assert (tmp_path / "swe_rebench_filtered_docker.parquet").exists()
    told = _module("swe_rebench", *args, env={"DEPLOYMENT": "modal"})
    assert told.returncode == 0 and "backend: modal (from $DEPLOYMENT)" in told.stderr
    both = _module("swe_rebench", *args, env={"DEPLOYMENT": "modal", "SANDLOT_BACKEND": "vefaas"})
    assert both.returncode == 0 and "backend: vefaas (from $SANDLOT_BACKEND)" in both.stderr
    assert (tmp_path / "swe_rebench_filtered_vefaas.parquet").exists()


def test_module_entry_points_do_not_import_the_cli() -> None:
    code = (
        "import sys, runpy\n"
        "sys.argv = ['x', '--help']\n"
        "try:\n    runpy.run_module('sandlot.datasets.swe_rebench', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('sandlot.cli')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_dataset_error_has_one_root_and_survives_pickling() -> None:
    import pickle

    from sandlot.datasets.errors import DatasetError as Root
    from sandlot.datasets.images import ImageNameError
    from sandlot.datasets.local import LocalRowError
    from sandlot.datasets.prepare import SourceError
    from sandlot.datasets.prompts import PromptLeakError
    from sandlot.datasets.swebench_specs import SpecError
    from sandlot.datasets.uni_agent import UniAgentRowError

    errors: list[Root] = [
        DatasetError("in.jsonl", "bad", where="line 2", instance_id="x", fields=("f",)),
        SourceError("install_config", "must be an object"),
        ImageNameError("no image"),
        LocalRowError("no mirror"),
        PromptLeakError("leak"),
        SpecError("no spec"),
        UniAgentRowError("no grader"),
    ]
    for error in errors:
        assert isinstance(error, Root) and isinstance(error, ValueError)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert (copy.problem, copy.where, copy.fields) == (error.problem, error.where, error.fields)
