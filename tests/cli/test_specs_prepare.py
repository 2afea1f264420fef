"""``sandlot data prepare swe_bench_verified --backend local``: a spec ``local`` cannot build, or
a requirements file the mirror cannot give, is one ``Error:`` line with the fix."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from requirements import EVAL, need_module

from sandlot.cli.main import cli

constants = need_module("swebench.harness.constants", EVAL)


def _mirror(root: Path, repo: str) -> str:
    """A bare mirror of ``repo`` under ``root`` with one commit and no requirements file."""
    work = root / "work"
    work.mkdir()
    (work / "README").write_text("x\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    mirror = root / "mirrors" / repo.replace("/", "__")
    subprocess.run(["git", "clone", "-q", "--mirror", str(work), str(mirror)], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _prepare(tmp_path: Path, repo: str, version: str, commit: str) -> tuple[int, str]:
    row = {
        "instance_id": f"{repo.replace('/', '__')}-1",
        "repo": repo,
        "version": version,
        "base_commit": commit,
        "environment_setup_commit": commit,
        "patch": "",
        "test_patch": "",
        "problem_statement": "p",
        "FAIL_TO_PASS": json.dumps(["t"]),
        "PASS_TO_PASS": "[]",
    }
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    mirrors, out = str(tmp_path / "mirrors"), str(tmp_path / "out")
    args = ["data", "prepare", "swe_bench_verified", "--backend", "local", "--input", str(rows)]
    result = CliRunner().invoke(cli, [*args, "--repo-mirror", mirrors, "--local-save-dir", out])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("repo", "version", "says"),
    [
        ("pallets/flask", "2.3", r"requirements/dev\.txt\) exists at commit"),
        ("pydata/xarray", "0.12", r"environment\.yml.*--local-images"),
    ],
)
def test_a_spec_local_cannot_build_is_one_error_line(
    tmp_path: Path, repo: str, version: str, says: str
) -> None:
    assert constants.MAP_REPO_VERSION_TO_SPECS[repo][version]
    commit = _mirror(tmp_path, repo)
    code, output = _prepare(tmp_path, repo, version, commit)
    assert code != 0
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output
    assert re.search(says, output.replace("\n", " ")), output
