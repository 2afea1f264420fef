"""Contract: shell sessions (``Sandbox.shell`` / ``BashSession``) on every backend.

``session`` is the backend's own session (a ``ChannelSession`` where the backend has a
channel). Tests marked ``generic`` also run against the exec fallback
(``ExecSession``), which every backend gets for free; the others need a live shell.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import anyio
import pytest

from sandlot import Sandbox
from sandlot.result import TIMEOUT_EXIT_CODE
from sandlot.runtimes import BashSession, ExecSession, SessionClosedError, SessionConfig
from sandlot.runtimes.observation import INTERRUPTED_EXIT_CODE

if TYPE_CHECKING:
    from conftest import ContractTarget, ShortTimeout, TickProbe

pytestmark = pytest.mark.anyio

# Short grace periods keep the escalation tests quick; nothing here depends on their length.
CONFIG = SessionConfig(interrupt_grace_s=0.3)


@pytest.fixture  # parametrized by conftest.py (native, exec)
async def any_session(
    request: pytest.FixtureRequest, sandbox: Sandbox
) -> AsyncIterator[BashSession]:
    """The backend's session, then the exec fallback, for behaviour both must have."""
    if request.param == "native":
        session = await sandbox.shell("contract", config=CONFIG)
    else:
        session = ExecSession("contract-exec", CONFIG, sandbox, sandbox.spec.workdir)
    async with session:
        yield session


@pytest.fixture
async def session(sandbox: Sandbox, target: ContractTarget) -> BashSession:
    """The backend's live shell; skipped where the backend only has the exec fallback."""
    shell = await sandbox.shell("contract", config=CONFIG)
    if isinstance(shell, ExecSession):
        pytest.skip(f"{target.id} has no streaming shell channel (exec fallback only)")
    return shell


async def test_state_persists_between_commands(any_session: BashSession) -> None:
    r = await any_session.run("mkdir -p sub/dir && cd sub && export SANDLOT_A='x y'")
    assert (r.exit_code, r.output) == (0, "")
    r = await any_session.run('echo "$SANDLOT_A"; pwd')
    assert r.output.splitlines()[0] == "x y"
    assert r.output.splitlines()[1].endswith("/sub")


async def test_shell_variables_and_functions_persist(session: BashSession) -> None:
    await session.run('declare -A m=([k]=v); n=5; greet() { echo hello "$1"; }')
    assert (await session.run('echo "${m[k]} $n"; greet you')).output == "v 5\nhello you\n"


async def test_exit_codes_and_output_without_newline(any_session: BashSession) -> None:
    for code in (0, 1, 42, 255):
        r = await any_session.run(f"printf 'out{code}'; (exit {code})")
        assert (r.output, r.exit_code, r.ok) == (f"out{code}", code, code == 0)


async def test_stderr_is_interleaved_with_stdout(any_session: BashSession) -> None:
    r = await any_session.run("echo one; echo two >&2; echo three")
    assert r.output == "one\ntwo\nthree\n"


async def test_binary_output_is_decoded_with_replacement(any_session: BashSession) -> None:
    r = await any_session.run(r"printf 'a\000b\377c\037d'")
    assert r.output == "a\x00b\ufffdc\x1fd"


async def test_syntax_error_is_reported_without_running(any_session: BashSession) -> None:
    r = await any_session.run("touch ran.txt\nif then fi")
    assert r.exit_code == 2
    assert "syntax error" in r.output
    assert (await any_session.run("test -e ran.txt")).exit_code == 1


async def test_multiline_script_with_heredoc(any_session: BashSession) -> None:
    script = (
        "cat > h.txt <<'EOF'\nline $1 `x`\n  indented\nEOF\n"
        "for i in 1 2; do\n  echo $i\ndone\ncat h.txt"
    )
    r = await any_session.run(script)
    assert r.output == "1\n2\nline $1 `x`\n  indented\n"


async def test_set_e_stops_the_command_not_the_session(any_session: BashSession) -> None:
    await any_session.run("cd /tmp")
    r = await any_session.run("set -e\necho before\nfalse\necho after")
    assert (r.exit_code, r.output, r.shell_restarted) == (1, "before\n", False)
    r = await any_session.run("pwd; (exit 3); echo still")
    assert r.output.startswith("/tmp\n")


async def test_set_e_inside_a_function(session: BashSession) -> None:
    await session.run("cd /tmp")
    r = await session.run("f() { set -e; false; echo no; }; f; echo no")
    assert (r.exit_code, r.output, r.shell_restarted) == (1, "", False)
    assert (await session.run("set +e; pwd")).output == "/tmp\n"


async def test_exit_in_subshell_keeps_the_shell(any_session: BashSession) -> None:
    await any_session.run("cd /tmp")
    r = await any_session.run("(exit 7); echo $?; pwd")
    assert (r.output, r.shell_restarted) == ("7\n/tmp\n", False)


async def test_top_level_exit_restarts_the_shell(
    any_session: BashSession, sandbox: Sandbox
) -> None:
    await any_session.run("cd /tmp && export SANDLOT_B=1")
    r = await any_session.run("echo bye; exit 5")
    assert (r.exit_code, r.output, r.shell_restarted) == (5, "bye\n", True)
    r = await any_session.run('echo "${SANDLOT_B:-unset}"')
    assert (r.output, r.exit_code) == ("unset\n", 0)


async def test_stdin_is_empty(any_session: BashSession) -> None:
    r = await any_session.run("cat; read -r x || echo no-input")
    assert r.output == "no-input\n"


async def test_pager_and_terminal_variables(any_session: BashSession) -> None:
    r = await any_session.run('echo "$PAGER $GIT_PAGER $TERM"')
    assert r.output == "cat cat dumb\n"


async def test_config_env_and_startup(sandbox: Sandbox) -> None:
    config = SessionConfig(env={"SANDLOT_C": "c"}, startup=["SANDLOT_D=d; cd /tmp"])
    session = await sandbox.shell("configured", config=config)
    assert (await session.run('echo "$SANDLOT_C $SANDLOT_D $PWD"')).output == "c d /tmp\n"


async def test_long_output_keeps_head_and_tail(sandbox: Sandbox) -> None:
    session = await sandbox.shell("capped", config=SessionConfig(max_output_chars=1000))
    r = await session.run("seq 1 100000")
    assert r.truncated and r.exit_code == 0
    assert r.output.startswith("1\n2\n3\n") and r.output.endswith("99999\n100000\n")
    assert "characters omitted" in r.output and len(r.output) < 1200


async def test_timeout_returns_partial_output_and_keeps_state(
    session: BashSession, short_timeout: ShortTimeout
) -> None:
    await session.run("cd /tmp && export SANDLOT_E=kept")
    timeout = await short_timeout(lambda: session.run("true"), 0.5)
    started = time.monotonic()
    r = await session.run("echo started; sleep 300; echo never", timeout=timeout)
    assert (r.timed_out, r.interrupted, r.exit_code) == (True, True, TIMEOUT_EXIT_CODE)
    assert r.output.startswith("started\n") and "never" not in r.output
    assert not r.shell_restarted
    assert time.monotonic() - started < 60  # far below the sleep: it did not wait for it
    assert (await session.run('echo "$SANDLOT_E $PWD"')).output == "kept /tmp\n"


async def test_timeout_of_a_busy_loop(session: BashSession) -> None:
    r = await session.run("while :; do :; done", timeout=0.5)
    assert r.timed_out and not r.shell_restarted
    assert (await session.run("echo alive")).output == "alive\n"


async def test_timeout_escalates_past_an_ignored_sigint(
    session: BashSession, short_timeout: ShortTimeout
) -> None:
    timeout = await short_timeout(lambda: session.run("python3 -c pass"), 0.5)
    r = await session.run(
        "python3 -c 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        'print("up", flush=True); time.sleep(60)\'',
        timeout=timeout,
    )
    assert r.timed_out and r.output.startswith("up\n") and not r.shell_restarted
    assert (await session.run("echo alive")).output == "alive\n"


async def test_timeout_of_a_command_slow_to_start(session: BashSession) -> None:
    # 7.5 MB of command text take the shell seconds to read and check, with SIGINT ignored
    # until the command starts, and the timeout falls in that time. The stop must wait for the
    # start, then interrupt the command like any other: it neither loses its SIGINTs there (and
    # reaches SIGTERM: "Terminated", the rest of the command running) nor gives the shell up.
    await session.run("export SANDLOT_G=kept")
    padding = "#" + "x" * 99 + "\n"
    r = await session.run(padding * 75_000 + "sleep 300; echo never", timeout=0.3)
    assert (r.timed_out, r.exit_code) == (True, TIMEOUT_EXIT_CODE)
    assert "never" not in r.output and "Terminated" not in r.output
    assert not r.shell_restarted
    assert (await session.run('echo "$SANDLOT_G"')).output == "kept\n"


async def test_idle_timeout(session: BashSession) -> None:
    r = await session.run("echo tick; sleep 60", timeout=30, idle_timeout=0.5)
    assert r.timed_out and r.output.startswith("tick\n")
    assert r.duration_s < 15


async def test_interrupt_from_another_task(session: BashSession) -> None:
    result = []

    async def run() -> None:
        result.append(await session.run("echo go; sleep 60"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        # interrupt() does nothing before the command runs, so repeat it until run() returns.
        while not result:
            await anyio.sleep(0.3)
            await session.interrupt()
    (r,) = result
    assert (r.interrupted, r.timed_out, r.exit_code) == (True, False, INTERRUPTED_EXIT_CODE)
    assert r.output == "go\n"
    assert (await session.run("echo alive")).output == "alive\n"


async def test_background_job_does_not_block_and_survives(session: BashSession) -> None:
    started = time.monotonic()
    r = await session.run("sleep 300 >/dev/null 2>&1 & echo $! > bg.pid; echo launched")
    assert r.output == "launched\n" and time.monotonic() - started < 60
    r = await session.run("sleep 30", timeout=0.5)  # interrupting later commands spares it
    assert r.timed_out
    assert (await session.run('kill -0 "$(cat bg.pid)" && echo running')).output == "running\n"


async def test_background_server_is_reachable_from_later_commands(session: BashSession) -> None:
    start = (
        "python3 -m http.server 0 --bind 127.0.0.1 >srv.log 2>&1 & "
        "for i in $(seq 50); do grep -q 'port' srv.log && break; sleep 0.1; done; "
        "sed -E 's/.*port ([0-9]+).*/\\1/;q' srv.log > srv.port"
    )
    assert (await session.run(start, timeout=20)).exit_code == 0
    fetch = (
        "python3 -c 'import sys, urllib.request; "
        'print(urllib.request.urlopen("http://127.0.0.1:" + sys.argv[1]).status)\' '
        '"$(cat srv.port)"'
    )
    assert (await session.run(fetch, timeout=20)).output == "200\n"


async def test_sessions_are_independent(sandbox: Sandbox) -> None:
    one, two = await sandbox.shell("one"), await sandbox.shell("two")
    assert await sandbox.shell("one") is one
    await one.run("cd /tmp && export SANDLOT_F=one")
    r = await two.run('echo "${SANDLOT_F:-unset}"')
    assert r.output == "unset\n"
    assert (await one.run("echo $SANDLOT_F")).output == "one\n"


async def test_commands_of_one_session_run_one_at_a_time(session: BashSession) -> None:
    outputs: list[str] = []

    async def run(i: int) -> None:
        outputs.append((await session.run(f"echo start{i}; sleep 0.2; echo end{i}")).output)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(run, i)
    assert sorted(outputs) == [f"start{i}\nend{i}\n" for i in range(3)]


async def test_closing_the_session_kills_its_processes(
    sandbox: Sandbox, session: BashSession, tick_probe: Callable[[Sandbox], TickProbe]
) -> None:
    probe = tick_probe(sandbox)
    await session.run(probe.command + "echo started")
    await anyio.sleep(0.3)
    await session.close()
    await probe.assert_stopped()
    with pytest.raises(SessionClosedError):
        await session.run("echo no")
    assert (await (await sandbox.shell("contract")).run("echo new")).output == "new\n"


async def test_closing_the_sandbox_closes_its_sessions(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    async with open_sandbox() as sb:
        session = await sb.shell()
        await session.run("sleep 60 &")
    assert session.closed
    with pytest.raises(SessionClosedError):
        await session.run("echo no")
