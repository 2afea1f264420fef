"""Reward mode ``same``: what the agent left running is killed before its sandbox grades it
(``sandlot.rewards.lingering``), on ``local`` and ``docker``. The processes are the ones an
agent that has read the code would leave: one waiting for the test command's key pipe
(``/proc/<pid>/fd/3``), detached with ``setsid``, double-forked, renamed by ``exec -a``,
stopped, and a respawner that starts a new child every few milliseconds."""

from __future__ import annotations

from typing import Any

import pytest
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, need_module, needs
from rollout.scripted_policy import RunOnce

from sandlot.datasets.instance import Instance
from sandlot.rewards.instance_setup import instance_spec, prepare_repo
from sandlot.rewards.lingering import ProcessBaseline, stop_lingering
from sandlot.rollout import run_episode
from sandlot.rollout.config import parse_agent_config
from sandlot.sandboxes.open import open as open_sandbox

need_module("swebench", EVAL)
pytestmark = pytest.mark.anyio

BACKENDS = [
    pytest.param("local", marks=needs(bwrap_missing)),
    pytest.param("docker", marks=[needs(docker_engine_missing), pytest.mark.slow]),
]

# Each line leaves processes behind once its command has returned.
LEAVE = r"""
thief='while :; do for f in /proc/[0-9]*/fd/3; do cat "$f" >> /tmp/stolen 2>/dev/null; done; done'
setsid bash -c "$thief" </dev/null >/dev/null 2>&1 &
( ( exec -a kworker/0:1 sleep 1000 ) & ) </dev/null >/dev/null 2>&1
nohup sleep 1001 </dev/null >/dev/null 2>&1 & kill -STOP $!
setsid bash -c 'while :; do sleep 1002 & sleep 0.005; done' </dev/null >/dev/null 2>&1 &
sleep 0.3
"""

# Live processes (zombies are dead: a container's init may never reap them) whose PID is not
# in the baseline, but this command's own and its ancestors, with their command lines.
STRAYS = r"""
import os, sys
def field(pid, name):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(name + ":"):
            return line.split()[1]
mine, p = set(), str(os.getpid())
while p not in ("0", None):
    mine.add(p)
    p = field(p, "PPid")
kept = set(sys.argv[1].split())
for p in os.listdir("/proc"):
    if p.isdigit() and p != "1" and p not in mine | kept:
        try:
            if field(p, "State") != "Z":
                print(p, open(f"/proc/{p}/cmdline").read().replace("\0", " "))
        except OSError:
            pass
"""


def _on(backend: str, inst: Instance) -> Instance:
    if backend == "local":
        return inst
    return inst.model_copy(update={"image": TEST_IMAGE, "environment": None})


@pytest.mark.usefixtures("local_root")
@pytest.mark.parametrize("backend", BACKENDS)
async def test_every_process_the_agent_left_is_killed_and_the_sandbox_still_works(
    backend: str, instances: dict[str, Instance]
) -> None:
    inst = _on(backend, instances["textkit__textkit-2"])
    async with open_sandbox(backend, instance_spec(inst, backend)) as sb:
        await prepare_repo(sb, inst)
        baseline = await ProcessBaseline.take(sb)
        kept = "\n".join(line.split()[0] for line in baseline.processes.splitlines())
        assert (await sb.exec(LEAVE, timeout=30)).ok
        before = await sb.exec(["python3", "-c", STRAYS, kept])
        assert len(before.stdout.splitlines()) >= 5, before.stdout

        killed = await stop_lingering(sb, baseline)

        after = await sb.exec(["python3", "-c", STRAYS, kept])
        assert after.stdout.splitlines() == [], after.stdout
        assert killed >= 5
        # The sandbox's own processes are untouched: it still runs commands.
        assert (await sb.exec("echo still-here")).stdout == "still-here\n"


@pytest.mark.usefixtures("local_root")
async def test_a_sandbox_that_sees_the_callers_processes_gets_no_baseline(
    instances: dict[str, Instance],
) -> None:
    inst = instances["textkit__textkit-2"]
    async with open_sandbox("local", instance_spec(inst, "local"), isolation="none") as sb:
        assert await ProcessBaseline.take(sb) is None


@pytest.mark.usefixtures("local_root")
async def test_a_same_mode_episode_grades_after_killing_what_the_agent_left(
    make_row: Any,
) -> None:
    config = parse_agent_config(
        {
            "sandbox": {"backend": "local"},
            "interaction": {"max_turns": 3, "action_timeout": 60},
            "reward": {"mode": "same"},
        }
    )
    traj = await run_episode(make_row("textkit__textkit-2"), RunOnce(LEAVE), config)
    assert traj.eval is not None, traj.error
    # The thief, the renamed sleep, the stopped one, the respawner and its children, and the
    # agent's shell session: all started after the baseline.
    stopped = traj.eval.integrity.lingering_stopped
    assert stopped is not None and stopped >= 5, traj.eval.model_dump(exclude={"log"})
