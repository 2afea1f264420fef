"""Nothing graded in the agent's sandbox (``sandlot.rollout.graded``), for any dataset: the
instance's ``graded_paths``, the files its ``test_patch`` creates and the repository's symlinks
into them are gone before the model's first turn; what cannot go is reported; mode ``same``
gets them back, over whatever the agent planted, for the grading only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from requirements import EVAL, bwrap_missing, need_module, needs
from rollout.scripted_policy import RunOnce

from sandlot.datasets.instance import Instance
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rollout import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.graded import remove_graded, restore_graded
from sandlot.rollout.trajectory import ExitReason
from sandlot.sandboxes.local.jail import JAIL_HOME
from sandlot.sandboxes.open import open as open_sandbox

need_module("swebench", EVAL)
MakeRow = Callable[..., TaskRow]
pytestmark = [pytest.mark.anyio, needs(bwrap_missing), pytest.mark.usefixtures("local_root")]

# An environment that leaves graded files around: a directory of expected outputs in the
# repository and a link to it, the new test file of textkit__textkit-1's test_patch, a runner
# in $HOME.
LEAKY_SETUP = (
    'set -e\nmkdir -p .graded && echo \'{"test_wrap": "PASSED"}\' > .graded/expected.json\n'
    "ln -s .graded docs_expected\n"
    "printf 'def test_wrap_hidden():\\n    pass\\n' > tests/test_wrap.py\n"
    f"echo 'echo real-runner' > {JAIL_HOME}/run_graded.sh\n"
)
LOOK = (
    "ls -a; ls tests; ls $HOME; cat /proc/version >/dev/null && echo version-readable; "
    "grep -rl test_wrap_hid''den / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr "
    "2>/dev/null; echo look-done"
)


def _config(mode: str = "fresh") -> Any:
    return parse_agent_config(
        {
            "sandbox": {"backend": "local"},
            "interaction": {"max_turns": 3, "action_timeout": 300},
            "reward": {"mode": mode},
        }
    )


@pytest.mark.e2e
async def test_graded_files_are_gone_before_the_first_turn_and_survivors_are_reported(
    make_row: MakeRow, caplog: pytest.LogCaptureFixture
) -> None:
    row = make_row(
        "textkit__textkit-1",
        post_setup_cmd=LEAKY_SETUP,
        graded_paths=[".graded", f"{JAIL_HOME}/run_graded.sh", "/proc/version"],
    )
    assert row.instance.graded_artefacts() == [
        "/testbed/.graded",
        f"{JAIL_HOME}/run_graded.sh",
        "/proc/version",
        "/testbed/tests/test_wrap.py",
    ]
    with caplog.at_level(logging.WARNING, logger="sandlot.rollout"):
        traj = await run_episode(row, RunOnce(LOOK), _config())
    assert traj.exit_reason is ExitReason.NO_TOOL_CALL, traj.error
    seen = traj.steps[0].observations[0].output
    assert "look-done" in seen and "version-readable" in seen
    for gone in (".graded", "docs_expected", "test_wrap.py", "run_graded.sh", "/testbed"):
        assert gone not in seen, seen
    # /proc/version cannot be deleted: the trajectory and the log say the agent could read it.
    [leak] = traj.warnings
    assert "could read" in leak and "/proc/version" in leak and ".graded" not in leak
    assert any("GRADED FILES READABLE BY THE AGENT" in r.getMessage() for r in caplog.records)


async def test_same_mode_puts_the_real_files_back_over_what_the_agent_planted(
    instances: dict[str, Instance], tmp_path: Path
) -> None:
    instance = instances["textkit__textkit-2"].model_copy(
        update={
            "post_setup_cmd": LEAKY_SETUP.replace("tests/test_wrap.py", "tests/test_x.py"),
            "graded_paths": [".graded", f"{JAIL_HOME}/run_graded.sh", "docs_expected"],
        }
    )
    async with open_sandbox("local", instance_spec(instance, "local")) as sb:
        await prepare_repo(sb, instance)
        graded = await remove_graded(sb, instance, copy_to=tmp_path)
        assert sorted(graded.removed) == sorted(instance.graded_artefacts())
        assert graded.left == [] and set(graded.copies) == set(graded.removed)
        look = await sb.exec(f"ls -a; ls {JAIL_HOME}", cwd=instance.workdir)
        assert ".graded" not in look.stdout and "run_graded" not in look.stdout
        planted = f"echo 'echo PASSED fake' > {JAIL_HOME}/run_graded.sh; mkdir -p .graded"
        assert (await sb.exec(planted, cwd=instance.workdir)).ok
        await restore_graded(sb, graded)
        runner = await sb.exec(f"bash {JAIL_HOME}/run_graded.sh; cat .graded/expected.json")
        assert runner.stdout == 'real-runner\n{"test_wrap": "PASSED"}\n', runner.stdout
        assert (await sb.exec("test -d docs_expected", cwd=instance.workdir)).ok


async def test_rows_without_graded_files_keep_their_sandbox_as_it_was(make_row: MakeRow) -> None:
    traj = await run_episode(make_row("textkit__textkit-2"), RunOnce("ls tests"), _config("same"))
    assert traj.exit_reason is ExitReason.NO_TOOL_CALL and traj.warnings == []
    assert "test_" in traj.steps[0].observations[0].output
