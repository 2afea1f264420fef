"""Nothing graded in the agent's sandbox: an R2E-Gym row converted from the fixture, its image's
layout played on the local backend, an agent that searches the whole filesystem for the hidden
tests, then the gold patch graded in a fresh sandbox (and in the agent's own, mode ``same``)."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest
from dataprep_support import MINICALC_BASE, run_prepare
from requirements import EVAL, bwrap_missing, need_module, needs

from sandlot.datasets.git_history import strip_future_history_cmd
from sandlot.datasets.instance import Instance
from sandlot.datasets.r2e_gym import GRADED_PATHS, SETUP_CMD
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rewards.result import EvalStatus
from sandlot.rollout.agent import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.policy import Message, PolicyTurn
from sandlot.rollout.rows import load_rows
from sandlot.rollout.trajectory import ExitReason
from sandlot.sandboxes.local.jail import JAIL_HOME
from sandlot.sandboxes.open import open as open_sandbox

need_module("swebench", EVAL)
pytestmark = needs(bwrap_missing)

HIDDEN_TESTS = """\
from minicalc import evaluate


def test_power():
    assert evaluate("2 ^ 10") == 1024


class TestPrecedence:
    def test_power_binds_tighter_than_multiplication(self):
        assert evaluate("3 * 2 ^ 2") == 12


def test_addition():
    assert evaluate("1 + 2") == 3


def test_modulo():
    assert evaluate("7 % 4") == 3
"""

# Names only the hidden tests and the row's expected_output_json hold (neither the repository at
# base_commit nor the host's system directories have them). Split in the shell so the agent's
# command text, which the bash tool may keep in a file, does not match itself.
_NEEDLES = ("TestPrec''edence", "binds_tigh''ter", "r2e_te''sts")
SEARCH = (
    "for d in /* /.[!.]*; do case $d in /proc|/sys|/dev) continue ;; esac\n"
    '  [ -e "$d" ] && grep -rlIF '
    + " ".join(f"-e {n}" for n in _NEEDLES)
    + ' -- "$d" 2>/dev/null\n'
    "done\n"
    "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( "
    "-name 'expected_output_json*' -o -name 'r2e_te''sts' -o -name 'run_te''sts.sh' "
    "-o -lname '*r2e_te''sts*' -o -lname '*run_te''sts.sh' \\) -print 2>/dev/null\n"
    "echo search-done"
)
"""Every file of the sandbox's view holding a test name, every file named like a graded file
and every symlink to one."""
NOTHING_FOUND = "search-done\n"


def r2e_local_instance(tmp_path: Path, swe_mini_repos: Path) -> Instance:
    """The fixture's R2E-Gym row as ``sandlot data prepare`` writes it, run on ``local``: the
    image's layout (``r2e_tests/`` and ``run_tests.sh`` in the repository, and a symlink of the
    repository into the tests, as R2E-Gym's runtime makes) is written by ``post_setup_cmd``,
    then R2E-Gym's set-up moves them, with the jail's ``$HOME`` standing for the image's
    ``/root`` (read-only on the host image)."""
    [row] = load_rows(run_prepare("r2e_gym_subset", tmp_path, "docker").path, backend="docker")
    r2e = row.instance
    assert r2e.graded_paths == list(GRADED_PATHS)
    assert r2e.base_commit == MINICALC_BASE
    moves = SETUP_CMD[SETUP_CMD.index("if [ -e /testbed/run_tests.sh ]") :]
    image = "\n".join(
        [
            strip_future_history_cmd(r2e.base_commit),
            "mkdir -p r2e_tests",
            f"printf %s {shlex.quote(HIDDEN_TESTS)} > r2e_tests/test_1.py",
            "printf %s "
            + shlex.quote("python -m pytest -rA -p no:cacheprovider r2e_tests\n")
            + " > run_tests.sh",
        ]
    )
    layout = f"set -e\n{image}\n{moves}\nln -s /root/r2e_tests tests/hidden_cases\n"
    return Instance.model_validate(
        {
            **r2e.model_dump(),
            "image": {"local": "host"},
            "repo_source": str(swe_mini_repos / "minicalc"),
            "environment": {"pip_packages": ["pytest"]},
            "env": {},
            "post_setup_cmd": layout.replace("/root", JAIL_HOME),
            "test_cmd": (r2e.test_cmd or "").replace("/root", JAIL_HOME),
            "graded_paths": [p.replace("/root", JAIL_HOME) for p in r2e.graded_paths],
        }
    )


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class SearchThenGold:
    """A policy that searches the filesystem for the graded files, applies the gold patch and
    submits."""

    def __init__(self, gold: str) -> None:
        encoded = base64.b64encode(gold.encode()).decode()
        self.turns = [
            _call("bash", {"command": SEARCH}),
            _call("bash", {"command": f"echo {encoded} | base64 -d | git apply -"}),
            _call("submit", {}),
        ]

    async def generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        return PolicyTurn(content=self.turns.pop(0))

    def secrets(self) -> list[str]:
        return []


def _row(instance: Instance, tmp_path: Path) -> TaskRow:
    [row] = load_rows(run_prepare("r2e_gym_subset", tmp_path, "docker").path, backend="docker")
    row.extra_info.tools_kwargs.reward.metadata = instance
    return row


async def _search_after_prepare_repo(instance: Instance) -> str:
    async with open_sandbox("local", instance_spec(instance, "local")) as sb:
        await prepare_repo(sb, instance)
        r = await sb.exec(SEARCH, timeout=600, cwd=instance.workdir)
        return r.stdout


@pytest.mark.slow
def test_the_search_finds_the_graded_files_the_set_up_leaves(
    tmp_path: Path, swe_mini_repos: Path
) -> None:
    """The control: the evaluation's set-up (``prepare_repo``) keeps them, the search sees them."""
    instance = r2e_local_instance(tmp_path, swe_mini_repos)
    found = anyio.run(_search_after_prepare_repo, instance)
    assert f"{JAIL_HOME}/r2e_tests/test_1.py" in found.splitlines(), found
    assert f"{JAIL_HOME}/run_tests.sh" in found.splitlines(), found
    assert "/testbed/tests/hidden_cases" in found.splitlines(), found


@pytest.mark.parametrize("mode", ["fresh", "same"])
@pytest.mark.e2e
def test_the_agent_finds_nothing_graded_and_the_gold_patch_resolves(
    tmp_path: Path, swe_mini_repos: Path, mode: str
) -> None:
    instance = r2e_local_instance(tmp_path, swe_mini_repos)
    config = parse_agent_config(
        {
            "sandbox": {"backend": "local"},
            "interaction": {"max_turns": 5, "action_timeout": 600},
            "reward": {"mode": mode},
        }
    )
    traj = anyio.run(
        lambda: run_episode(_row(instance, tmp_path), SearchThenGold(instance.patch), config)
    )
    assert traj.exit_reason is ExitReason.SUBMITTED, traj.error
    search = traj.steps[0].observations[0]
    assert search.status == "ok" and search.output == NOTHING_FOUND, search.output
    assert traj.eval is not None
    assert traj.eval.status == EvalStatus.RESOLVED, traj.eval.error or traj.eval.log
    assert traj.eval.tests_status["test_modulo"] == "FAILED"
    assert traj.eval.tests_status[
        "TestPrecedence.test_power_binds_tighter_than_multiplication"
    ] == ("PASSED")
    assert "hidden_cases" not in traj.model_patch and "r2e_tests" not in traj.model_patch
    leaks = [w for w in traj.warnings if "could read" in w]
    assert leaks == []
    if mode == "same":
        assert any("reward mode 'same'" in w for w in traj.warnings), traj.warnings
    else:
        assert traj.warnings == []
