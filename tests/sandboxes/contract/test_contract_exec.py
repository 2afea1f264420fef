"""Contract: running commands (``Sandbox.exec``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import pytest

from sandlot import TIMEOUT_EXIT_CODE, ExecResult, Sandbox

if TYPE_CHECKING:
    from conftest import ContractTarget, ShortTimeout, TickProbe

pytestmark = pytest.mark.anyio


async def test_stdout_and_stderr_are_kept_apart(sandbox: Sandbox) -> None:
    r = await sandbox.exec("echo out; echo err >&2; echo out2")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nout2\n", "err\n")
    assert r.ok and not r.truncated and not r.timed_out


async def test_non_zero_exit_is_a_result(sandbox: Sandbox) -> None:
    for code in (1, 3, 42, 255):
        r = await sandbox.exec(f"echo before; exit {code}")
        assert (r.exit_code, r.stdout, r.ok) == (code, "before\n", False)


async def test_missing_program_exits_127(sandbox: Sandbox) -> None:
    r = await sandbox.exec("sandlot-no-such-program-xyz")
    assert r.exit_code == 127
    assert "sandlot-no-such-program-xyz" in r.stderr


async def test_killed_by_signal_reports_128_plus_n(sandbox: Sandbox) -> None:
    assert (await sandbox.exec("kill -TERM $$")).exit_code == 128 + 15
    assert (await sandbox.exec("kill -KILL $$")).exit_code == 128 + 9


async def test_argv_list_is_quoted(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["printf", "%s|", "a b", "$HOME", "it's", ""])
    assert r.stdout == "a b|$HOME|it's||"


async def test_duration_is_measured(sandbox: Sandbox) -> None:
    r = await sandbox.exec("sleep 0.3")
    assert 0.25 <= r.duration_s < 10


async def test_timeout_returns_partial_output(
    sandbox: Sandbox, short_timeout: ShortTimeout
) -> None:
    timeout = await short_timeout(lambda: sandbox.exec("true"), 1)
    started = time.monotonic()
    r = await sandbox.exec("echo started; echo warn >&2; sleep 300; echo never", timeout=timeout)
    assert r.timed_out and r.exit_code == TIMEOUT_EXIT_CODE and not r.ok
    assert r.stdout == "started\n" and r.stderr == "warn\n"
    # Far below the sleep, far above a loaded machine's kill time: it did not wait for it.
    assert time.monotonic() - started < 60


async def test_timeout_kills_the_whole_process_tree(
    sandbox: Sandbox, tick_probe: Callable[[Sandbox], TickProbe], short_timeout: ShortTimeout
) -> None:
    probe = tick_probe(sandbox)
    timeout = await short_timeout(lambda: sandbox.exec("true"), 0.5)
    r = await sandbox.exec(probe.command + "sleep 30", timeout=timeout)
    assert r.timed_out
    await probe.assert_stopped()


async def test_background_jobs_do_not_keep_exec_waiting(sandbox: Sandbox) -> None:
    started = time.monotonic()
    r = await sandbox.exec("sleep 300 & echo launched", timeout=120)
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "launched\n", False)
    assert time.monotonic() - started < 60


async def test_env_from_spec_and_per_exec(open_sandbox: Callable[..., Sandbox]) -> None:
    async with open_sandbox(env={"A": "spec", "B": "spec"}) as sb:
        r = await sb.exec('echo "$A $B $C"', env={"B": "exec", "C": "exec"})
        assert r.stdout == "spec exec exec\n"
        assert (await sb.exec('echo "$A $B $C"')).stdout == "spec spec \n"


async def test_state_does_not_persist_between_execs(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p sub && cd sub && export SANDLOT_X=1")
    r = await sandbox.exec('echo "${SANDLOT_X:-unset}"; ls -d sub')
    assert r.stdout.split() == ["unset", "sub"]


async def test_cwd_defaults_to_workdir(sandbox: Sandbox, target: ContractTarget) -> None:
    target.require_isolated()
    assert (await sandbox.exec("pwd")).stdout == f"{sandbox.spec.workdir}\n"
    assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"


async def test_relative_cwd_is_inside_workdir(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p a/b")
    assert (await sandbox.exec("pwd", cwd="a/b")).stdout.endswith("/a/b\n")
    absolute = f"{sandbox.spec.workdir}/a"
    assert (await sandbox.exec("pwd", cwd=absolute)).stdout.endswith("/a\n")


async def test_missing_cwd_is_a_failed_result(sandbox: Sandbox) -> None:
    r = await sandbox.exec("echo ran", cwd="no/such/dir")
    assert r.exit_code != 0 and "ran" not in r.stdout


async def test_stdin_bytes_and_text(sandbox: Sandbox) -> None:
    assert (await sandbox.exec("cat", stdin="héllo\n")).stdout == "héllo\n"
    payload = bytes(range(256)) * 1000
    assert (await sandbox.exec("wc -c", stdin=payload)).stdout.strip() == str(len(payload))
    assert (await sandbox.exec("cat | wc -c")).stdout.strip() == "0"


async def test_invalid_utf8_output_is_replaced(sandbox: Sandbox) -> None:
    r = await sandbox.exec(r"printf 'ok \377\376 end'")
    assert r.stdout.startswith("ok ") and r.stdout.endswith(" end") and "\ufffd" in r.stdout


async def test_large_output_is_capped_and_marked(sandbox: Sandbox) -> None:
    r = await sandbox.exec("head -c 50000000 /dev/zero | tr '\\0' a; echo small >&2", timeout=120)
    assert r.exit_code == 0 and r.truncated
    assert r.stdout.startswith("a" * 100_000)
    assert len(r.stdout) < 50_000_000
    assert r.stderr == "small\n"


async def test_truncation_note_is_the_same_on_every_backend(
    open_sandbox: Callable[..., Sandbox],
) -> None:
    async with open_sandbox(max_output_bytes=1000) as sb:
        r = await sb.exec("seq 1 100000; seq 1 5 >&2")
    full = "".join(f"{i}\n" for i in range(1, 100_001))
    assert r.exit_code == 0 and r.truncated
    assert r.stdout == full[:1000] + (
        "\n[sandlot: stdout truncated: kept the first 1000 bytes, "
        f"discarded the remaining {len(full) - 1000} bytes]\n"
    )
    assert r.stderr == "1\n2\n3\n4\n5\n"


async def test_concurrent_execs_in_one_sandbox(sandbox: Sandbox) -> None:
    # A barrier: each exec checks in, then waits (at most 60 s) until all six have. Run one
    # after another, the first would wait for the others in vain and fail.
    barrier = f"/tmp/sandlot-barrier-{secrets.token_hex(4)}"
    results: dict[int, ExecResult] = {}

    async def run(i: int) -> None:
        results[i] = await sandbox.exec(
            f"mkdir -p {barrier} && touch {barrier}/{i}; n=0; "
            f'while [ "$(ls {barrier} | wc -l)" -lt 6 ]; do '
            "n=$((n+1)); [ $n -gt 600 ] && exit 9; sleep 0.1; done; "
            f"echo {i}; echo e{i} >&2",
            timeout=120,
        )

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(run, i)
    for i, r in results.items():
        assert (r.exit_code, r.stdout, r.stderr) == (0, f"{i}\n", f"e{i}\n")


async def test_background_job_that_wiped_its_environment_does_not_keep_exec_waiting(
    sandbox: Sandbox,
) -> None:
    # No marker, a new session, and the process holding the output is the child of a shell
    # (not an orphan) that the exec's end kills first: it is found by the pipe it holds.
    started = time.monotonic()
    r = await sandbox.exec(
        "(setsid env -i sh -c 'sleep 300; :' &); (env -i sh -c 'sleep 301; :' &); echo launched",
        timeout=120,
    )
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "launched\n", False)
    assert time.monotonic() - started < 60


async def test_background_job_that_soon_lets_go_of_the_output_lives_on(sandbox: Sandbox) -> None:
    # `cmd >/dev/null &` holds the exec's output until the child applies its redirection; a
    # loaded machine can make that late. Such a job must not be frozen or killed for it.
    r = await sandbox.exec(
        "(sleep 0.05; exec >/dev/null 2>&1; while :; do printf . >> .late; sleep 0.05; done) &"
    )
    assert r.exit_code == 0, r
    await anyio.sleep(0.6)
    first = await sandbox.exec("wc -c < .late")
    await anyio.sleep(0.3)
    second = await sandbox.exec("wc -c < .late")
    assert first.exit_code == 0 and second.exit_code == 0, (first, second)
    assert 0 < int(first.stdout) < int(second.stdout), "the job was stopped when its exec ended"


async def test_background_process_lives_on_until_close(sandbox: Sandbox) -> None:
    # As with `docker exec`: what one exec leaves running, later execs see running.
    r = await sandbox.exec(
        "(while :; do printf . >> .alive; sleep 0.05; done) >/dev/null 2>&1 & echo $!"
    )
    pid = r.stdout.strip()
    assert r.exit_code == 0 and pid.isdigit()
    sizes = []
    for _ in range(2):
        await anyio.sleep(0.5)
        check = await sandbox.exec(f"kill -0 {pid} && wc -c < .alive")
        assert check.exit_code == 0, check
        sizes.append(int(check.stdout))
    assert 0 < sizes[0] < sizes[1], "the background loop stopped after its exec returned"
