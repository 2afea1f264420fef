"""Reward mode ``same``: what the agent left running is killed before its sandbox grades it
(``sandlot.rewards.lingering``), on ``local`` and ``docker``. The processes are the ones an
agent that has read the code would leave: one waiting for the test command's key pipe
(``/proc/<pid>/fd/3``), detached with ``setsid``, double-forked, renamed by ``exec -a``,
stopped, and a respawner that starts a new child every few milliseconds; and two that look dead
to a reader of ``/proc/<pid>/stat``'s first line: a daemon named ``x) Z`` + newline, and one whose
main thread exited while another runs (the leader is a zombie, the process is not)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from requirements import EVAL, TEST_IMAGE, bwrap_missing, docker_engine_missing, need_module, needs
from rollout.scripted_policy import RunOnce

from sandlot.datasets.instance import Instance
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rewards.lingering import _BASELINE, ProcessBaseline, stop_lingering
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

# argv: "leader", or the command name to take; then the file it appends a byte to every 10 ms,
# once it looks dead. "leader": the main thread exits (the raw exit system call ends one thread),
# a thread goes on.
DAEMON = r"""
import ctypes, os, sys, threading, time
how, beat_file = sys.argv[1:3]
def state():
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0]
def beat():
    while how == "leader" and state() != b"Z":
        time.sleep(0.01)
    while True:
        with open(beat_file, "a") as f:
            f.write(".")
        time.sleep(0.01)
if how == "leader":
    threading.Thread(target=beat).start()
    ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)
# prctl(PR_SET_NAME), not /proc/self/comm: the docker backend's /proc is read-only on Podman.
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(how.encode()), 0, 0, 0)
beat()
"""

# Starts DAEMON ($1, $2) detached and returns once it beats.
HIDE = r"""
rm -f /tmp/beat
setsid python3 -c "$1" "$2" /tmp/beat </dev/null >/dev/null 2>&1 &
for _ in {1..200}; do [ -s /tmp/beat ] && exit 0; sleep 0.05; done
exit 1
"""

# How many beats in half a second.
BEATS = "a=$(stat -c %s /tmp/beat); sleep 0.5; b=$(stat -c %s /tmp/beat); echo $((b - a))"

LOOKS_DEAD = [
    pytest.param("x) Z\n", id="named-like-a-zombie"),
    pytest.param("leader", id="leader-exited"),
]


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
        assert baseline is not None
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


@pytest.mark.usefixtures("local_root")
@pytest.mark.parametrize("how", LOOKS_DEAD)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.e2e
async def test_a_process_that_looks_dead_is_killed_too(
    backend: str, how: str, instances: dict[str, Instance]
) -> None:
    inst = _on(backend, instances["textkit__textkit-2"])
    async with open_sandbox(backend, instance_spec(inst, backend)) as sb:
        await prepare_repo(sb, inst)
        baseline = await ProcessBaseline.take(sb)
        assert baseline is not None
        hide = await sb.exec(["bash", "-c", HIDE, "hide", DAEMON, how], timeout=30)
        assert hide.ok, hide
        # Control: it is alive, and would be beside the tests.
        assert int((await sb.exec(BEATS)).stdout) > 0

        killed = await stop_lingering(sb, baseline)

        assert int((await sb.exec(BEATS)).stdout) == 0
        assert killed >= 1


@pytest.mark.parametrize(
    "how",
    [*LOOKS_DEAD, pytest.param(") (a b)\n) S 9", id="parentheses-spaces-newline")],
)
def test_the_listing_names_a_process_by_what_the_kernel_wrote(how: str, tmp_path: Path) -> None:
    """On this machine's own ``/proc``: a live process that looks dead to a line reader is
    listed as ``"pid starttime"``; a zombie is not."""
    beat = tmp_path / "beat"
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, how, str(beat)])
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 30
        while not (beat.exists() and _is_zombie(zombie.pid)):
            assert time.monotonic() < deadline and daemon.poll() is None
            time.sleep(0.01)
        stat = Path(f"/proc/{daemon.pid}/stat").read_bytes()
        start = stat.rsplit(b")", 1)[1].split()[19].decode()

        listed = subprocess.run(
            ["bash", "-c", _BASELINE], capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()

        assert f"{daemon.pid} {start}" in listed
        assert str(zombie.pid) not in {line.split()[0] for line in listed}
    finally:
        daemon.kill()
        daemon.wait()
        zombie.wait()


def _is_zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
