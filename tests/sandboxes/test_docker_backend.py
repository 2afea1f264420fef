"""The docker backend against a real engine (Docker Engine or Podman's Docker API).

Without the docker SDK, an engine or the test image these tests skip with instructions (see
``tests/requirements.py``); with ``CI=true`` they fail instead. Tests that need no engine
(options, unreachable engine, missing SDK, archive safety) always run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from repo_paths import REPO
from requirements import DOCKER, ENGINE, TEST_IMAGE, docker_engine, missing, need_module

import sandlot
from sandlot.errors import (
    BackendUnavailableError,
    SandboxDeadError,
    SandboxError,
    SandboxFileError,
    SandboxStartError,
)
from sandlot.sandboxes.capped import CappedOutput
from sandlot.sandboxes.docker import DockerOptions, DockerSandbox, EngineUnreachableError
from sandlot.sandboxes.docker.proc import DOCKER_READONLY_PATHS, proc_fields
from sandlot.sandboxes.docker.stream import AttachedProcess
from sandlot.sandboxes.scale.backoff import poll
from sandlot.sandboxes.shared.status_tail import StatusTail
from sandlot.sandboxes.shared.streamed_exec import _feed, _pump
from sandlot.sandboxes.spec import SandboxSpec

MiB = 1024 * 1024
# Generous: the machine has two cores shared with other test runs.
CALL_BUDGET_S = 120


@pytest.fixture(scope="module")
def engine() -> Any:
    return docker_engine()


@pytest.fixture
def run_id(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh ``sandlot.run_id`` label value for this test's containers."""
    value = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("SANDLOT_RUN_ID", value)
    return value


def containers_of(engine: Any, run_id: str) -> list[dict[str, Any]]:
    return engine.api.containers(all=True, filters={"label": f"sandlot.run_id={run_id}"})


def make(**overrides: Any) -> DockerSandbox:
    options = {"pull": "never", **overrides.pop("options", {})}
    spec = SandboxSpec(image=TEST_IMAGE, **overrides)
    return DockerSandbox(spec, DockerOptions(**options))


@pytest.fixture
async def sb(engine: Any) -> AsyncIterator[DockerSandbox]:
    sandbox = make()
    async with sandbox:
        yield sandbox


async def processes(sandbox: DockerSandbox, pattern: str) -> list[str]:
    """Command lines of live (non-zombie) processes in the sandbox matching ``pattern``."""
    r = await sandbox.exec("ps -eo stat=,args=")
    return [line for line in r.stdout.splitlines() if pattern in line and not line.startswith("Z")]


# --------------------------------------------------------------------------- no engine needed


def test_registered_and_options_validated() -> None:
    assert sandlot.get_backend("docker") is DockerSandbox
    sb = sandlot.open("docker", image="x", pull="never", max_output_bytes=5)
    assert isinstance(sb.options, DockerOptions)
    assert (sb.options.pull, sb.options.max_output_bytes) == ("never", 5)
    with pytest.raises(ValueError, match="pull"):
        sandlot.open("docker", pull="sometimes")
    with pytest.raises(ValueError, match="bogus"):
        sandlot.open("docker", bogus=1)


def test_import_without_sdk_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['docker'] = None\n"
        "import anyio, sandlot\n"
        "from sandlot.errors import BackendUnavailableError\n"
        "async def main():\n"
        "    try:\n"
        "        await sandlot.open('docker', image='x').start()\n"
        "    except BackendUnavailableError as e:\n"
        "        print(e)\n"
        "anyio.run(main)\n"
    )
    root = REPO
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert "pip install 'sandlot[docker]'" in out.stdout


@pytest.mark.anyio
async def test_unreachable_engine_names_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_module("docker", DOCKER)
    monkeypatch.setenv("SANDLOT_START_ATTEMPTS", "1")  # retryable; one attempt keeps it short
    sandbox = make(options={"base_url": f"unix://{tmp_path}/no-engine.sock"})
    with pytest.raises(EngineUnreachableError) as info:
        await sandbox.start()
    err = info.value
    assert isinstance(err, SandboxStartError) and isinstance(err, BackendUnavailableError)
    assert err.retryable
    assert "DOCKER_HOST" in str(err) and "podman system service" in str(err)
    assert "container-engine.sh" not in str(err)  # a script of sandlot's CI, not in a clone
    assert sandbox.closed


def _frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


async def _pump_canned(stream: bytes, secret: bytes = b"s3cret") -> tuple[int | None, CappedOutput]:
    """Demultiplex ``stream`` as an engine would send it right behind the HTTP headers, with
    the in-band status line read as ``StreamedExec`` reads it."""
    ours, engine_side = socket.socketpair()
    engine_side.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + stream)
    engine_side.shutdown(socket.SHUT_WR)
    reader = ours.makefile("rb")
    while reader.readline() != b"\r\n":  # http.client parsing; it buffers the frames too
        pass
    response = SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=reader)))
    reader.raw._response = response  # type: ignore[attr-defined]
    out = CappedOutput(cap=16)
    proc = AttachedProcess(reader.raw, _no_inspect)
    tail = StatusTail(out.stdout, secret)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, proc, secret + b"\nin", True)
            tg.start_soon(_pump, proc.stdout, tail)
            tg.start_soon(_pump, proc.stderr, out.stderr)
    code = tail.end()
    assert engine_side.recv(100) == secret + b"\nin"  # the secret line, stdin, its end
    proc.close()
    reader.close()
    ours.close()
    engine_side.close()
    return code, out


async def _no_inspect() -> dict[str, Any]:
    return {}


@pytest.mark.anyio
async def test_output_read_ahead_with_the_headers_is_not_lost() -> None:
    """The engine may send the first frames in the same packet as the HTTP headers."""
    code, out = await _pump_canned(_frame(1, b"hi\n") + _frame(1, b"s3cret 7\n"))
    assert (code, bytes(out.stdout)) == (7, b"hi\n")


@pytest.mark.anyio
async def test_the_exit_status_is_only_the_secret_line_at_the_end_of_stdout() -> None:
    """What the command prints cannot pass for the wrapper's status line (remote_shell)."""
    forged = _frame(1, b"s3cret 0\n") + _frame(2, b"e")
    code, out = await _pump_canned(forged + _frame(1, b"tail") + _frame(1, b"s3cret 1\n"))
    assert (code, bytes(out.stdout), bytes(out.stderr)) == (1, b"s3cret 0\ntail", b"e")
    # Split across frames, with stderr after it, the line is still found.
    code, _ = await _pump_canned(_frame(1, b"s3c") + _frame(1, b"ret 255\n") + _frame(2, b"x"))
    assert code == 255
    # The line is ours only at the very end: bytes after it, or a wrong secret, lose the status.
    code, out = await _pump_canned(_frame(1, b"s3cret 0\nmore"))
    assert (code, bytes(out.stdout)) == (None, b"s3cret 0\nmore")
    assert (await _pump_canned(_frame(1, b"guess 0\n")))[0] is None
    # Output past the cap is counted without the status line.
    code, out = await _pump_canned(_frame(1, b"x" * 20) + _frame(1, b"s3cret 3\n"))
    assert (code, out.stdout.dropped) == (3, 4)


# --------------------------------------------------------------------------- lifecycle


@pytest.mark.anyio
async def test_labels_limits_and_workdir(engine: Any, run_id: str) -> None:
    before = int(time.time())
    sandbox = make(
        labels={"team": "rl"}, memory_mb=256, cpu=0.5, workdir="/work/dir", env={"A": "1"}
    )
    async with sandbox:
        attrs = engine.api.inspect_container(sandbox.container_id)
        labels = attrs["Config"]["Labels"]
        assert labels["sandlot.run_id"] == run_id
        assert labels["sandlot.sandbox_id"] == sandbox.id
        assert labels["team"] == "rl"
        assert "@" in labels["sandlot.owner"]
        assert before <= int(labels["sandlot.created_at"]) <= int(time.time())
        host = attrs["HostConfig"]
        assert host["Memory"] == 256 * MiB
        assert host["NanoCpus"] == 500_000_000
        assert host["NetworkMode"] == "none"
        assert host["PidsLimit"] == 4096
        r = await sandbox.exec("pwd; echo $A")
        assert r.stdout == "/work/dir\n1\n"


@pytest.mark.anyio
async def test_network_is_off_by_default(sb: DockerSandbox) -> None:
    r = await sb.exec(["python3", "-c", "import socket; print(socket.if_nameindex())"])
    assert r.stdout.strip() == "[(1, 'lo')]"


@pytest.mark.anyio
async def test_missing_image_with_pull_never(engine: Any, run_id: str) -> None:
    image = f"localhost/sandlot-missing-{uuid.uuid4().hex[:8]}:none"
    sandbox = DockerSandbox(SandboxSpec(image=image), DockerOptions(pull="never"))
    with pytest.raises(SandboxStartError) as info:
        await sandbox.start()
    assert image in str(info.value) and "pull='never'" in str(info.value)
    assert not info.value.retryable
    assert containers_of(engine, run_id) == []


@pytest.mark.anyio
async def test_missing_image_that_cannot_be_pulled(
    engine: Any, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDLOT_START_ATTEMPTS", "1")  # a refused registry may be retried
    image = f"localhost/sandlot-missing-{uuid.uuid4().hex[:8]}:none"
    sandbox = DockerSandbox(SandboxSpec(image=image), DockerOptions(pull="missing"))
    with anyio.fail_after(CALL_BUDGET_S), pytest.raises(SandboxStartError) as info:
        await sandbox.start()
    assert image in str(info.value) and "pull='missing'" in str(info.value)
    assert containers_of(engine, run_id) == []


@pytest.mark.anyio
async def test_a_fork_whose_snapshot_image_was_removed_fails_at_once_without_a_pull(
    engine: Any, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the fork pulled the set-up's base image (the snapshot's spec.image) three times
    # and failed with a retryable pull error naming that image, not the missing snapshot.
    pulled: list[str] = []
    monkeypatch.setattr(DockerSandbox, "_pull", lambda self: pulled.append(self.spec.image))
    async with make(post_setup_cmd="echo set-up > a.txt", options={"pull": "missing"}) as sb:
        snap = await sb.snapshot()
    assert snap.handle is not None
    engine.api.remove_image(snap.handle, force=True)  # as `sandlot gc` of another process does
    try:
        with anyio.fail_after(CALL_BUDGET_S), pytest.raises(SandboxStartError) as info:
            await sandlot.open(snapshot=snap).start()
    finally:
        await snap.delete()
    assert snap.handle[:19] in str(info.value) and "new snapshot" in str(info.value)
    assert not info.value.retryable
    assert pulled == []
    assert containers_of(engine, run_id) == []


@pytest.mark.anyio
async def test_32_concurrent_sandboxes_leave_nothing_behind(engine: Any, run_id: str) -> None:
    n = 32
    seen: dict[int, str] = {}
    running: list[int] = []
    all_up = anyio.Event()

    async def one(i: int) -> None:
        async with make() as sandbox:
            seen[i] = (await sandbox.exec(f"echo {i}")).stdout
            running.append(i)
            if len(running) == n:  # the last one in counts them before anyone leaves
                up = await anyio.to_thread.run_sync(containers_of, engine, run_id)
                assert len(up) == n
                all_up.set()
            await all_up.wait()

    with anyio.fail_after(4 * CALL_BUDGET_S):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    assert seen == {i: f"{i}\n" for i in range(n)}
    assert containers_of(engine, run_id) == []


@pytest.mark.anyio
async def test_lifetime_ends_the_sandbox(engine: Any) -> None:
    async with make(timeout_s=1) as sandbox:
        await anyio.sleep(2.5)
        with pytest.raises(SandboxDeadError, match="lifetime"):
            await sandbox.exec("true")
        assert not await sandbox.is_alive()


# --------------------------------------------------------------------------- exec


@pytest.mark.anyio
async def test_exec_streams_stdin_env_cwd(sb: DockerSandbox) -> None:
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    big = os.urandom(3 * MiB)
    r = await sb.exec("sha256sum", stdin=big)
    assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
    r = await sb.exec(["printf", "%s|", "a b", "$HOME", "it's"], cwd="/tmp", env={"X": "y"})
    assert r.stdout == "a b|$HOME|it's|"
    assert (await sb.exec("echo $X; pwd", cwd="/tmp", env={"X": "y"})).stdout == "y\n/tmp\n"
    r = await sb.exec("pwd", cwd="/no/such/dir")
    assert r.exit_code != 0 and "/no/such/dir" in r.stderr
    assert (await sb.exec("cat")).stdout == ""  # no stdin given: immediate end of input


@pytest.mark.anyio
async def test_exec_falls_back_to_sh_without_bash(sb: DockerSandbox) -> None:
    assert (await sb.exec("echo ${BASH_VERSION:+bash}")).stdout == "bash\n"
    await sb.exec("mv /usr/bin/bash /usr/bin/bash.off")
    r = await sb.exec("echo ${BASH_VERSION:-sh}")
    assert (r.exit_code, r.stdout) == (0, "sh\n")


@pytest.mark.anyio
async def test_50_mb_of_output_is_capped_in_bounded_memory(engine: Any) -> None:
    async with make(options={"max_output_bytes": MiB}) as sandbox:
        tracemalloc.start()
        try:
            r = await sandbox.exec("head -c 50000000 /dev/zero; echo tail >&2")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert r.exit_code == 0 and r.truncated
    kept, _, note = r.stdout.partition("\n[sandlot: stdout truncated")
    assert len(kept) == MiB and r.stderr == "tail\n"
    dropped = 50_000_000 - MiB
    assert note == f": kept the first {MiB} bytes, discarded the remaining {dropped} bytes]\n"
    # Kept: 1 MiB of bytes, its str copy and receive buffers; 50 MB would show up here.
    assert peak < 16 * MiB


@pytest.mark.anyio
async def test_timeout_kills_command_that_ignores_sigterm(engine: Any) -> None:
    async with make(options={"stop_grace_s": 0.5}) as sandbox:
        cmd = "trap '' TERM; echo started; (setsid sleep 301 &); sleep 302 & sleep 303"
        r = await sandbox.exec(cmd, timeout=1)
        assert (r.timed_out, r.exit_code, r.stdout) == (
            True,
            sandlot.TIMEOUT_EXIT_CODE,
            "started\n",
        )
        assert await processes(sandbox, "sleep 30") == []


@pytest.mark.anyio
async def test_timeout_sends_sigterm_before_sigkill(sb: DockerSandbox) -> None:
    cmd = "trap 'echo term > /tmp/got; exit 0' TERM; sleep 300 & wait"
    r = await sb.exec(cmd, timeout=0.5)
    assert r.timed_out
    assert await sb.read_file("/tmp/got") == b"term\n"


@pytest.mark.anyio
async def test_cancelling_the_caller_kills_the_command(sb: DockerSandbox) -> None:
    with anyio.move_on_after(1):
        await sb.exec("sleep 304; echo never > /tmp/never")
    assert await processes(sb, "sleep 304") == []
    assert (await sb.exec("test -e /tmp/never")).exit_code == 1


@pytest.mark.anyio
async def test_container_killed_from_outside_mid_command(engine: Any) -> None:
    async with make() as sandbox:

        async def kill_soon() -> None:
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(engine.api.kill, sandbox.container_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with anyio.fail_after(CALL_BUDGET_S), pytest.raises(SandboxDeadError):
                await sandbox.exec("sleep 30")
        with pytest.raises(SandboxDeadError):
            await sandbox.exec("true")
        with pytest.raises(SandboxDeadError):
            await sandbox.read_file("/etc/hostname")
        assert not await sandbox.is_alive()
    assert sandbox.closed


@pytest.mark.anyio
async def test_container_removed_from_outside(engine: Any, run_id: str) -> None:
    async with make() as sandbox:
        engine.api.remove_container(sandbox.container_id, force=True)
        with pytest.raises(SandboxDeadError, match="removed"):
            await sandbox.exec("true")
        with pytest.raises(SandboxDeadError):
            await sandbox.write_file("/tmp/x", b"x")
    assert containers_of(engine, run_id) == []


@pytest.mark.anyio
async def test_execs_do_not_leak_file_descriptors(sb: DockerSandbox) -> None:
    for _ in range(5):
        await sb.exec("true")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(30):
        await sb.exec("echo x", stdin=b"y")
    # A few pooled keep-alive connections may come and go; 30 leaked attachments would not.
    assert len(os.listdir("/proc/self/fd")) <= before + 3


# --------------------------------------------------------------------------- files


@pytest.mark.anyio
async def test_files_are_byte_exact_and_create_parents(sb: DockerSandbox) -> None:
    data = bytes(range(256)) * 1000
    await sb.write_file("/tmp/a/b/c.bin", data)
    assert await sb.read_file("/tmp/a/b/c.bin") == data
    await sb.write_file("/tmp/a/b/c.bin", "héllo")
    assert await sb.read_file("/tmp/a/b/c.bin") == "héllo".encode()
    await sb.exec("ln -s /tmp/a/b/c.bin /tmp/link")
    assert await sb.read_file("/tmp/link") == "héllo".encode()


@pytest.mark.anyio
async def test_file_errors_name_the_path(sb: DockerSandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxFileError, match="/no/such/file"):
        await sb.read_file("/no/such/file")
    with pytest.raises(SandboxFileError, match="directory"):
        await sb.read_file("/tmp")
    with pytest.raises(SandboxFileError, match="/etc/hostname/x"):
        await sb.write_file("/etc/hostname/x", b"x")
    with pytest.raises(SandboxFileError, match="/no/such/dir"):
        await sb.download("/no/such/dir", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        await sb.upload(tmp_path / "absent", "/tmp/absent")


@pytest.mark.anyio
async def test_directory_trees_both_ways(sb: DockerSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.bin").write_bytes(b"\x00\xff" * 5000)
    (src / "py").symlink_to("/usr/bin/python3")
    await sb.upload(src, "/work/deep/tree")
    r = await sb.exec("cat tree/a.txt; readlink tree/py; wc -c < tree/sub/b.bin", cwd="/work/deep")
    assert r.stdout == "A/usr/bin/python3\n10000\n"

    report = await sb.download("/work/deep/tree", tmp_path / "back")
    assert (tmp_path / "back" / "a.txt").read_text() == "A"
    assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == b"\x00\xff" * 5000
    # An absolute link would point into the host: skipped, and said so.
    assert not (tmp_path / "back" / "py").is_symlink()
    assert [path for path, _ in report.skipped] == ["back/py"]

    await sb.download("/work/deep/tree/a.txt", tmp_path / "single.txt")
    assert (tmp_path / "single.txt").read_text() == "A"
    await sb.upload(tmp_path / "single.txt", "/new/dir/copy.txt")
    assert await sb.read_file("/new/dir/copy.txt") == b"A"


@pytest.mark.anyio
async def test_write_creates_parent_when_engine_answers_404(
    sb: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker Engine answers 404 for a missing destination where Podman creates it."""
    import docker

    from sandlot.sandboxes.docker import sandbox as module

    real_put = module.put_archive
    calls: list[str] = []

    def docker_like_put(api: Any, container: str, path: str, data: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise docker.errors.NotFound(f"Could not find the file {path} in container")
        real_put(api, container, path, data)

    monkeypatch.setattr(module, "put_archive", docker_like_put)
    await sb.write_file("/fresh/parent/f.txt", b"ok")
    assert calls == ["/fresh/parent", "/fresh/parent"]
    assert (await sb.exec("cat /fresh/parent/f.txt")).stdout == "ok"


@pytest.mark.anyio
async def test_no_directory_is_replaced_by_a_file_or_back(
    sb: DockerSandbox, tmp_path: Path
) -> None:
    await sb.exec("mkdir -p /w/adir && echo keep > /w/adir/inner && echo f > /w/afile")
    with pytest.raises(SandboxFileError, match="/w/adir"):
        await sb.write_file("/w/adir", b"data")
    (tmp_path / "afile").mkdir()
    with pytest.raises(SandboxFileError, match="/w/afile"):
        await sb.upload(tmp_path / "afile", "/w/afile")
    assert (await sb.exec("cat /w/adir/inner /w/afile")).stdout == "keep\nf\n"


@pytest.mark.anyio
async def test_background_jobs_end_with_the_exec(sb: DockerSandbox) -> None:
    r = await sb.exec("sleep 305 & (setsid sleep 306 &); echo launched", timeout=60)
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "launched\n", False)
    assert await processes(sb, "sleep 30") == []


@pytest.mark.anyio
async def test_signal_exit_codes_and_relative_paths(sb: DockerSandbox) -> None:
    assert (await sb.exec("kill -TERM $$")).exit_code == 128 + 15
    await sb.write_file("rel/x.txt", b"rel")
    assert await sb.read_file(f"{sb.spec.workdir}/rel/x.txt") == b"rel"
    assert (await sb.exec("cat x.txt", cwd="rel")).stdout == "rel"


# --------------------------------------------------------------------------- hostile processes


@pytest.mark.anyio
async def test_a_command_cannot_forge_its_exit_status(sb: DockerSandbox) -> None:
    """The status line needs the wrapper's secret and must end stdout (remote_shell)."""
    forge = 'for f in /proc/$PPID/cmdline /proc/$PPID/environ; do tr "\\0" " " <$f; done'
    r = await sb.exec(f"{forge}; echo; printf '%s 0\\n' $SANDLOT_EXEC_ID; exit 3")
    assert r.exit_code == 3 and r.stdout.endswith(" 0\n")
    # Killing the wrapper loses the status: an error, not a result.
    with pytest.raises(SandboxError, match="exit status was lost"):
        await sb.exec("kill -9 $PPID; echo 0")
    assert (await sb.exec("exit 4")).exit_code == 4


async def _count_processes(sandbox: DockerSandbox) -> int:
    """Live processes in the container other than PID 1, its sleep and this probe."""
    r = await sandbox.exec("ls -d /proc/[0-9]* | wc -l")
    return int(r.stdout) - 2 - 3  # init + its sleep; the probe's wrapper, bash, ls|wc


@pytest.mark.anyio
async def test_fork_bomb_is_bounded_and_killed(engine: Any) -> None:
    async with make(options={"pids_limit": 64}) as sandbox:
        host = engine.api.inspect_container(sandbox.container_id)["HostConfig"]
        assert host["PidsLimit"] == 64
        # Returns at once (the bomb backgrounds itself): the wrapper must still kill it all.
        r = await sandbox.exec("bomb() { bomb | bomb & }; bomb", timeout=60)
        assert not r.timed_out
        after = await sandbox.exec("echo alive")
        assert after.stdout == "alive\n", after
        assert await _count_processes(sandbox) <= 1
        # In the foreground, killed at the timeout; the sandbox stays usable.
        r = await sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 600", timeout=3)
        assert r.timed_out
        assert (await sandbox.exec("echo alive")).stdout == "alive\n"
        assert await _count_processes(sandbox) <= 1


@pytest.mark.anyio
async def test_a_daemon_that_wipes_its_environment_does_not_outlive_the_exec(
    sb: DockerSandbox,
) -> None:
    r = await sb.exec("(setsid env -i sleep 307 &); (setsid env -i sh -c 'sleep 308' &); echo ok")
    assert r.stdout == "ok\n"
    assert await processes(sb, "sleep 30") == []
    r = await sb.exec("(setsid env -i sleep 309 &); sleep 300", timeout=1)
    assert r.timed_out
    assert await processes(sb, "sleep 30") == []


@pytest.mark.anyio
async def test_timeouts_still_kill_after_grep_and_sleep_are_deleted(engine: Any) -> None:
    async with make(options={"stop_grace_s": 0.3}) as sandbox:
        r = await sandbox.exec("rm -f /usr/bin/grep /usr/bin/sleep /bin/grep /bin/sleep")
        assert r.ok and (await sandbox.exec("command -v grep sleep")).stdout == ""
        r = await sandbox.exec("trap '' TERM; while :; do :; done", timeout=1)
        assert r.timed_out
        assert await processes(sandbox, "while :") == []


@pytest.mark.anyio
async def test_when_the_in_container_killer_cannot_run_the_engine_empties_the_container(
    engine: Any,
) -> None:
    async with make(options={"stop_grace_s": 0}) as sandbox:
        # Without /bin/sh no killer can start in the container; the command keeps its copy.
        cmd = (
            "cp /bin/dash /tmp/keep && rm -f /bin/sh /usr/bin/sh /bin/dash /usr/bin/dash && "
            "exec /tmp/keep -c 'trap \"\" TERM; while :; do :; done'"
        )
        r = await sandbox.exec(cmd, timeout=2)
        assert r.timed_out
        top = await anyio.to_thread.run_sync(engine.api.top, sandbox.container_id)
        commands = [" ".join(map(str, row)) for row in top["Processes"]]
        assert not any("/tmp/keep" in c for c in commands), commands
        assert await sandbox.is_alive()


# The top-level /proc entries that are not a process's and whose mount is procfs and writable
# (mountinfo: 5th field the mount point, 6th its options, the type after " - "); an entry the
# engine masks with its own /dev/null or an empty tmpfs is not the kernel's entry.
_WRITABLE_PROC = r"""
import os
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields, fstype = line.split(), line.split(" - ")[1].split()[0]
    mounts[fields[4]] = fstype == "proc" and "ro" not in fields[5].split(",")
for name in sorted(os.listdir("/proc")):
    path = "/proc/" + name
    if name.isdigit() or os.path.islink(path):
        continue
    holder = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)
    if mounts[holder]:
        print(name)
"""


@pytest.mark.anyio
async def test_container_root_cannot_chmod_a_proc_entry_every_container_shares(
    sb: DockerSandbox,
) -> None:
    """The kernel keeps a top-level /proc entry's mode in the entry: a chmod by container root
    reached the engine's next container (docs/docker.md)."""
    r = await sb.exec("chmod 440 /proc/buddyinfo")
    if r.ok:  # the fence is missing: put the mode back for the engine's other containers
        await sb.exec("chmod 444 /proc/buddyinfo")
    assert not r.ok and "Read-only file system" in r.stderr, r
    # A normal command still reads them, and writes through /dev/stdout (/proc/self/fd/1).
    r = await sb.exec(
        "stat -c %a /proc/buddyinfo && head -1 /proc/meminfo && cut -d' ' -f3 /proc/self/stat"
        " && exec 3>/tmp/out && echo fd > /proc/self/fd/3 && cat /tmp/out > /dev/stdout"
    )
    mode, meminfo, state, fd = r.stdout.splitlines()
    assert (mode, meminfo.split(":")[0], state, fd) == ("444", "MemTotal", "R", "fd"), r
    r = await sb.exec(["python3", "-c", _WRITABLE_PROC])
    assert r.ok and r.stdout == "", f"top-level /proc entries still writable: {r}"


def test_proc_fields_by_engine() -> None:
    """Docker gets ReadonlyPaths (its defaults kept), Podman, whose Docker API ignores them, a
    read-only /proc mount, unless it labels processes (SELinux, AppArmor)."""
    docker = {"Components": [{"Name": "Engine"}, {"Name": "containerd"}]}
    fields = proc_fields(docker, lambda: pytest.fail("info asked of Docker"))
    paths = fields["ReadonlyPaths"]
    assert set(DOCKER_READONLY_PATHS) <= set(paths) and "/proc/buddyinfo" in paths
    assert not any(p.startswith(("/proc/self", "/proc/net", "/proc/1")) for p in paths)
    podman = {"Components": [{"Name": "Podman Engine"}]}
    info = {"SecurityOptions": ["name=seccomp,profile=default"]}
    assert proc_fields(podman, lambda: info) == {
        "SecurityOpt": ["proc-opts=ro,nosuid,noexec,nodev"]
    }
    info = {"SecurityOptions": ["name=seccomp,profile=default", "name=selinux"]}
    assert proc_fields(podman, lambda: info) == {}


# --------------------------------------------------------------------------- Podman exec sessions


@pytest.fixture
def podman_without_exec_delay(engine: Any, tmp_path: Path) -> Any:
    """``base_url`` of a second Podman service, on the shared engine's storage (so it has the
    test image), whose containers.conf adds ``exit_command_delay = 0``; stopped afterwards."""
    docker = need_module("docker", DOCKER)
    if "podman" not in str(engine.version().get("Components", "")).lower():
        pytest.skip("Podman's exec sessions: the engine at DOCKER_HOST is not Podman")
    podman = shutil.which("podman")
    if podman is None:
        missing(f"the podman command is not installed here; see {ENGINE}")
    base = os.environ.get("CONTAINERS_CONF")
    conf = Path(base).read_text() if base else ""
    if "[engine]" not in conf:
        conf += "\n[engine]\n"
    (tmp_path / "containers.conf").write_text(
        conf.replace("[engine]", "[engine]\nexit_command_delay = 0", 1)
    )
    url = f"unix://{tmp_path}/podman.sock"
    env = {**os.environ, "CONTAINERS_CONF": str(tmp_path / "containers.conf")}
    service = subprocess.Popen(
        [podman, "system", "service", "--time=0", url], env=env, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(300):  # creating a client asks the engine for its version
            with contextlib.suppress(docker.errors.DockerException):
                docker.DockerClient(base_url=url).close()
                break
            time.sleep(0.1)
        yield url
    finally:
        service.terminate()
        service.wait(timeout=30)


def conmons_of(container_id: str) -> int:
    """Live ``conmon`` processes serving ``container_id`` (its own, one or two per exec
    session it keeps), whatever other engines run on this machine."""
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            count += argv[0].endswith(b"conmon") and container_id.encode() in argv
    return count


@pytest.mark.anyio
async def test_no_conmon_is_left_per_exec_on_podman_with_exit_command_delay_0(
    podman_without_exec_delay: str,
) -> None:
    """Podman keeps each finished exec, and its conmon, ``exit_command_delay`` seconds for a
    later ``exec_inspect``; the exit status now comes with the output, so 0 works."""
    async with make(options={"base_url": podman_without_exec_delay}) as sandbox:
        cid = sandbox.container_id
        assert cid is not None
        before = conmons_of(cid)
        assert before >= 1  # the container's own: the count sees this engine's conmons
        for i in range(50):
            r = await sandbox.exec(f"echo {i}; exit {i % 3}")
            assert (r.exit_code, r.stdout) == (i % 3, f"{i}\n")

        # The last exec's conmon exits right after its cleanup, which may still be running.
        async def settled() -> bool | None:
            return True if conmons_of(cid) <= before else None

        with anyio.move_on_after(CALL_BUDGET_S):
            await poll(settled, first_s=0.05, max_s=1)
        assert conmons_of(cid) == before
        # Timeouts still kill, with no exec left to inspect.
        r = await sandbox.exec("trap '' TERM; sleep 300", timeout=1)
        assert r.timed_out and await processes(sandbox, "sleep 300") == []
