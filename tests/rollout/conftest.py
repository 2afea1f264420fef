"""Fixtures of the rollout tests: the scripted model server, swe-mini rows, a watched
``SANDLOT_LOCAL_ROOT``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout.scripted_server import ScriptedServer

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.rows import TaskRow, build_row

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SWE_MINI = EXAMPLES / "swe-mini"
INSTANCES = SWE_MINI / "instances.jsonl"

MakeRow = Callable[..., TaskRow]


@pytest.fixture(scope="session")
def instance_records() -> list[dict[str, Any]]:
    """The swe-mini instances as JSON records (what the scripted server reads)."""
    return [json.loads(line) for line in INSTANCES.read_text().splitlines() if line.strip()]


@pytest.fixture
def server(instance_records: list[dict[str, Any]]) -> Iterator[ScriptedServer]:
    """The scripted OpenAI-compatible server on 127.0.0.1, stopped at teardown."""
    with ScriptedServer(instance_records, sleep_s=20.0) as running:
        yield running


@pytest.fixture(scope="session")
def swe_mini_repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/swe-mini/make_repos.py`` output, built once per session."""
    dest = tmp_path_factory.mktemp("swe-mini-repos")
    subprocess.run(
        [sys.executable, str(SWE_MINI / "make_repos.py"), "--dest", str(dest)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return dest


@pytest.fixture(scope="session")
def instances(swe_mini_repos: Path) -> dict[str, Instance]:
    """swe-mini instances by id, ``repo_source`` pointing at the session's repositories."""
    found = {}
    for instance in load_instances(INSTANCES):
        name = instance.repo.split("/")[-1]
        source = str(swe_mini_repos / name)
        found[instance.instance_id] = instance.model_copy(update={"repo_source": source})
    return found


def prompt_for(instance: Instance) -> list[dict[str, str]]:
    """A SWE-agent style prompt; the scripted server finds the instance by its id in it."""
    return [
        {"role": "system", "content": "You are a software engineer. Use the tools to fix bugs."},
        {
            "role": "user",
            "content": f"<task id={instance.instance_id}>\n{instance.problem_statement}\n</task>\n"
            f"The repository is in {instance.workdir}. Fix the issue, then call submit.",
        },
    ]


@pytest.fixture
def make_row(instances: dict[str, Instance]) -> MakeRow:
    """``make_row(instance_id, **instance_updates)``: the verl row of a swe-mini instance, its
    instance (``reward.metadata``, what the agent loop reads) changed by ``instance_updates``."""

    def make(instance_id: str, **updates: Any) -> TaskRow:
        instance = instances[instance_id]
        row = build_row(
            instance,
            index=0,
            prompt=prompt_for(instance),
            data_source="swe-mini",
            reward_name="swe",
            backend="local",
        )
        row.extra_info.tools_kwargs.reward.metadata = instance.model_copy(update=updates)
        return row

    return make


@pytest.fixture
def local_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``SANDLOT_LOCAL_ROOT`` in a fresh directory that must be empty when the test ends:
    every local sandbox the test opened was closed."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setenv("SANDLOT_LOCAL_ROOT", str(root))
    yield root
    left = sorted(p.name for p in root.iterdir())
    assert not left, f"sandboxes left open: {left}"
