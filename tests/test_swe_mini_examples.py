"""examples/swe-mini: reproducible repositories, and every instance behaves as labelled.

Runs on the host with plain git and pytest subprocesses (no sandbox): for every instance, base +
``test_patch`` fails every FAIL_TO_PASS test and passes every PASS_TO_PASS test; the gold patch
passes all; the wrong prediction does not; the empty prediction leaves FAIL_TO_PASS failing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from requirements import EVAL, need_module

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances

swebench_python = need_module("swebench.harness.log_parsers.python", EVAL)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "swe-mini"
MAKE_REPOS = EXAMPLE / "make_repos.py"
INSTANCES = load_instances(EXAMPLE / "instances.jsonl")
BY_ID = {instance.instance_id: instance for instance in INSTANCES}


def _predictions(name: str) -> dict[str, str]:
    rows = [json.loads(line) for line in (EXAMPLE / "predictions" / name).read_text().splitlines()]
    assert {row["model_name_or_path"] for row in rows} == {name.removesuffix(".jsonl")}
    return {row["instance_id"]: row["model_patch"] for row in rows}


GOLD = _predictions("gold.jsonl")
EMPTY = _predictions("empty.jsonl")
WRONG = _predictions("wrong.jsonl")


def _run(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, text=True, check=False)


def _make_repos(dest: Path, script: Path = MAKE_REPOS) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, str(script), "--dest", str(dest), cwd=dest.parent)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("swe-mini") / "repos"
    result = _make_repos(dest)
    assert result.returncode == 0, result.stderr
    return dest


@pytest.fixture(scope="module")
def python_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ``python`` is this interpreter, as the evaluator puts it on PATH."""
    bin_dir = tmp_path_factory.mktemp("bin")
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def test_instances_cover_the_advertised_cases() -> None:
    assert len(INSTANCES) >= 6
    assert len({instance.repo for instance in INSTANCES}) >= 3
    assert set(GOLD) == set(EMPTY) == set(WRONG) == set(BY_ID)
    for instance in INSTANCES:
        assert GOLD[instance.instance_id] == instance.patch
        assert EMPTY[instance.instance_id] == ""
        assert instance.FAIL_TO_PASS
        assert Path(instance.repo_source or "").parent == EXAMPLE / "repos"
        assert instance.test_cmd and instance.test_cmd.startswith("python3 -m pytest ")
        for patch in (instance.patch, instance.test_patch, WRONG[instance.instance_id]):
            assert patch.startswith("diff --git a/")
    assert "new file mode" in BY_ID["textkit__textkit-1"].test_patch
    assert len({instance.base_commit for instance in INSTANCES if "minicalc" in instance.repo}) == 2


def test_make_repos_is_reproducible_and_idempotent(repos: Path) -> None:
    for instance in INSTANCES:
        repo = repos / Path(instance.repo_source or "").name
        kind = _run("git", "cat-file", "-t", instance.base_commit, cwd=repo).stdout.strip()
        assert kind == "commit"
    heads = {p.name: _run("git", "rev-parse", "HEAD", cwd=p).stdout for p in repos.iterdir()}
    again = _make_repos(repos)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("up to date") == len(heads)
    assert heads == {
        p.name: _run("git", "rev-parse", "HEAD", cwd=p).stdout for p in repos.iterdir()
    }


def test_make_repos_fails_when_sources_drift(tmp_path: Path) -> None:
    copy = tmp_path / "swe-mini"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("repos", "__pycache__"))
    ops = copy / "projects" / "minicalc" / "minicalc" / "ops.py"
    ops.write_text(ops.read_text() + "\n# drift\n")
    result = _make_repos(tmp_path / "repos", copy / "make_repos.py")
    assert result.returncode == 1
    assert "minicalc: instances.jsonl pins commits" in result.stderr
    assert [p.name for p in (tmp_path / "repos").iterdir()] == []  # nothing installed


def _checkout(repos: Path, instance: Instance, work: Path) -> Path:
    source = repos / Path(instance.repo_source or "").name
    repo = work / "testbed"
    assert _run("git", "clone", "--quiet", str(source), str(repo), cwd=work).returncode == 0
    assert _run("git", "checkout", "--quiet", instance.base_commit, cwd=repo).returncode == 0
    return repo


def _test_statuses(
    repo: Path, instance: Instance, python_bin: Path, *patches: str
) -> dict[str, str]:
    """Reset ``repo`` to base, apply ``patches`` then the test patch, run ``test_cmd``, parse."""
    applied = [patch for patch in (*patches, instance.test_patch) if patch]
    assert _run("git", "reset", "--quiet", "--hard", instance.base_commit, cwd=repo).returncode == 0
    assert _run("git", "clean", "-fdxq", cwd=repo).returncode == 0
    patched: set[str] = set()
    for patch in applied:
        result = _run("git", "apply", "-", cwd=repo, stdin=patch)
        assert result.returncode == 0, result.stderr
        numstat = _run("git", "apply", "--numstat", "-", cwd=repo, stdin=patch).stdout
        patched |= {line.split("\t")[2] for line in numstat.splitlines()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env.update(instance.env, PATH=f"{python_bin}{os.pathsep}{env.get('PATH', '')}")
    assert instance.test_cmd is not None
    result = subprocess.run(
        ["bash", "-c", instance.test_cmd],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=instance.eval_timeout,
        check=False,
    )
    # The run writes nothing: only the patched files differ from the base commit.
    status = _run("git", "status", "--porcelain", "--ignored", "--untracked-files=all", cwd=repo)
    touched = {line[3:] for line in status.stdout.splitlines()}
    assert touched <= patched, touched - patched
    statuses: dict[str, str] = swebench_python.parse_log_pytest(result.stdout, None)
    return statuses


@pytest.mark.parametrize("instance_id", sorted(BY_ID))
def test_instance_behaves_as_labelled(
    instance_id: str, repos: Path, python_bin: Path, tmp_path: Path
) -> None:
    instance = BY_ID[instance_id]
    repo = _checkout(repos, instance, tmp_path)
    tests = instance.FAIL_TO_PASS + instance.PASS_TO_PASS

    def passed(statuses: dict[str, str], names: list[str]) -> list[bool]:
        return [statuses.get(name) == "PASSED" for name in names]

    # The empty prediction changes nothing, so its run is the base + test_patch run.
    base = _test_statuses(repo, instance, python_bin, EMPTY[instance_id])
    assert not any(passed(base, instance.FAIL_TO_PASS)), base
    assert all(passed(base, instance.PASS_TO_PASS)), base

    gold = _test_statuses(repo, instance, python_bin, GOLD[instance_id])
    assert all(passed(gold, tests)), gold

    wrong = _test_statuses(repo, instance, python_bin, WRONG[instance_id])
    assert not all(passed(wrong, tests)), wrong
