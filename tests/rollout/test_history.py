"""No future of the repository in a sandbox (``sandlot.datasets.git_history``): a
repository whose set-up left the fix reachable every way git keeps it (a branch, a tag, a
remote-tracking ref, a note, a stash, reflogs, a dangling commit, a linked worktree, an
alternate object store) shows none of it to the agent, by any git command or by reading every
object; ``HEAD``, its history and the set-up's uncommitted files stay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, need_module, needs
from rollout.scripted_policy import RunOnce

from sandlot.datasets.git_history import hide_future
from sandlot.datasets.instance import Instance
from sandlot.datasets.rows import TaskRow
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rollout import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.rollout.trajectory import ExitReason
from sandlot.sandboxes.open import open as open_sandbox

need_module("swebench", EVAL)
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("local_root")]
MakeRow = Callable[..., TaskRow]
MARKER = "THE_UPSTREAM_FIX_6f1c"

# Run in the repository after prepare_repo: every place git keeps a later commit.
FUTURE = f"""set -e
export GIT_AUTHOR_NAME=u GIT_AUTHOR_EMAIL=u@x GIT_COMMITTER_NAME=u GIT_COMMITTER_EMAIL=u@x
base=$(git rev-parse HEAD)
echo "{MARKER} branch" > fix.txt && git add fix.txt && git commit -qm "fix #42 {MARKER}"
git branch fix && git tag -a v2 -m "{MARKER} tag" && git update-ref refs/remotes/origin/main HEAD
git notes add -m "{MARKER} note" HEAD
echo "{MARKER} dangling" > fix.txt && git commit -qam "dangling {MARKER}"
git checkout -q --detach "$base"
echo "{MARKER} stash" > stashed.txt && git add stashed.txt && git stash -q
git worktree add -q --detach /tmp/wt fix
git init -q --bare /tmp/alt
echo "{MARKER} alternate" > /tmp/x.txt && GIT_DIR=/tmp/alt git hash-object -w /tmp/x.txt >/dev/null
echo /tmp/alt/objects >> .git/objects/info/alternates
echo "uncommitted set-up output" > setup_output.txt
"""

LOOK = (
    "git log --all --reflog --oneline | grep -c . ; "
    f"git cat-file --batch-all-objects --batch | grep -ac {MARKER}; "
    f"git log --all -S {MARKER} --oneline | grep -c . ; "
    "git status --porcelain; git log --oneline | grep -c ."
)


def _on(backend: str, inst: Instance) -> Instance:
    if backend == "local":
        return inst
    return inst.model_copy(update={"image": TEST_IMAGE, "environment": None})


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("local", marks=needs(bwrap_missing)),
        pytest.param("docker", marks=[needs(docker_engine_missing), pytest.mark.slow]),
    ],
)
async def test_no_git_command_reaches_the_fix(backend: str, instances: dict[str, Instance]) -> None:
    inst = _on(backend, instances["textkit__textkit-2"])
    async with open_sandbox(backend, instance_spec(inst, backend)) as sb:
        await prepare_repo(sb, inst)
        history = (await sb.exec("git log --oneline | grep -c .", cwd=inst.workdir)).stdout
        planted = await sb.exec(FUTURE, cwd=inst.workdir)
        assert planted.ok, planted.stderr
        before = await sb.exec(LOOK, cwd=inst.workdir)
        assert before.stdout.split()[1] != "0", before.stdout  # the fix is there to find

        await hide_future(sb, inst)

        after = await sb.exec(LOOK, cwd=inst.workdir)
        reachable, blobs, pickaxe, *status = after.stdout.split("\n")[:-1]
        assert (blobs, pickaxe) == ("0", "0"), after.stdout + after.stderr
        assert reachable == history.strip() == status[-1]
        assert status[:-1] == ["?? setup_output.txt"]
        assert not (await sb.exec("test -e /tmp/wt")).ok  # the linked worktree's files too
        head = await sb.exec("git rev-parse HEAD", cwd=inst.workdir)
        assert head.stdout.strip() == inst.base_commit


@pytest.mark.skipif(bwrap_missing() is not None, reason=str(bwrap_missing()))
@pytest.mark.e2e
async def test_an_episode_starts_without_the_future(make_row: MakeRow) -> None:
    row = make_row("textkit__textkit-2", post_setup_cmd=FUTURE)
    config = parse_agent_config(
        {"sandbox": {"backend": "local"}, "interaction": {"max_turns": 3, "action_timeout": 60}}
    )
    traj = await run_episode(row, RunOnce(LOOK), config)
    assert traj.exit_reason is ExitReason.NO_TOOL_CALL, traj.error
    seen = traj.steps[0].observations[0].output.split("\n")
    assert seen[1:3] == ["0", "0"], seen
