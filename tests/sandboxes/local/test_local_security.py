"""What a hostile command in a ``local`` sandbox can and cannot do.

Nothing here sends traffic off this machine: network checks use a listener on the host's
loopback, which a jail without network cannot reach and one with network can.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from local_helpers import (
    needs_bwrap,
    needs_pids_cgroup,
    open_local,
    wait_until_no_process_has,
    wait_until_some_process_has,
)

from sandlot import BackendUnavailableError, SandboxError, SandboxFileError, SandboxStartError
from sandlot.sandboxes.local import LocalSandbox
from sandlot.sandboxes.local.reaper import LocalReaper

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------- filesystem


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_cannot_write_outside_its_own_directories(zygote: bool) -> None:
    name = f"sandlot-pwn-{uuid.uuid4().hex[:8]}"
    targets = [f"/etc/{name}", f"/root/{name}", f"/usr/{name}", f"/{name}", f"/var/tmp/{name}"]
    async with open_local(zygote=zygote) as sb:
        for target in targets:
            r = await sb.exec(f"echo pwned > {target}")
            assert r.exit_code != 0, target
        r = await sb.exec(f"echo private > /tmp/{name}; cat /tmp/{name}")
        assert r.stdout == "private\n"
    for target in [*targets, f"/tmp/{name}"]:
        assert not await anyio.Path(target).exists(), target


@needs_bwrap
@pytest.mark.parametrize("root_dir", ["default", "visible"])
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_cannot_touch_another_sandbox(root_dir: str, zygote: bool, visible_dir: Path) -> None:
    fields: dict[str, object] = {"zygote": zygote}
    if root_dir == "visible":
        fields["root_dir"] = str(visible_dir)
    async with open_local(**fields) as a, open_local(**fields) as b:
        assert b.host_dir is not None and b.host_workdir is not None
        await b.write_file("secret.txt", b"b's data")
        r = await a.exec(
            f"cat {b.host_workdir}/secret.txt; echo pwned > {b.host_workdir}/pwn; "
            f"ls -A {b.host_dir.parent}"
        )
        assert "b's data" not in r.stdout and b.id not in r.stdout
        assert not (b.host_workdir / "pwn").exists()
        assert await b.read_file("secret.txt") == b"b's data"


@needs_bwrap
async def test_write_file_through_a_planted_symlink_stays_inside(
    visible_dir: Path, tmp_path: Path
) -> None:
    visible_victim = visible_dir / "victim.txt"  # seen read-only inside the jail
    hidden_victim = tmp_path / "victim.txt"  # under the host's /tmp: not seen at all
    for victim in (visible_victim, hidden_victim):
        victim.write_text("original")
    async with open_local() as sb:
        await sb.exec(f"ln -s {visible_victim} visible_link; ln -s {hidden_victim} hidden_link")
        with pytest.raises(SandboxFileError):
            await sb.write_file("visible_link", b"pwned")
        # The target's directory does not exist in the jail: an error, or at most a file in
        # the jail's private /tmp; either way the host file stays as it was.
        with contextlib.suppress(SandboxFileError):
            await sb.write_file("hidden_link", b"pwned")
        # tar replaces the link with the uploaded file instead of writing through it.
        await sb.upload(tmp_path / "victim.txt", "/testbed/visible_link")
        assert (await sb.exec("test -L visible_link")).exit_code == 1
    assert visible_victim.read_text() == "original"
    assert hidden_victim.read_text() == "original"


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_minimal_host_view_shows_no_user_data(
    zygote: bool, visible_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dataset with gold patches, a run log, credentials under a home pointed elsewhere.
    secrets = [visible_dir / "gold_predictions.jsonl", visible_dir / "run.log"]
    home = visible_dir / "home"
    for name in (".config/openai/key", ".kaggle/kaggle.json", ".env", ".gitconfig"):
        secrets.append(home / name)
    for path in secrets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("SECRET")
    monkeypatch.setenv("HOME", str(home))
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    host_only = [Path.cwd() / "pyproject.toml", Path("/etc/shadow"), real_home / ".gitconfig"]
    host_only += [Path("/var/lib/containers"), Path("/home"), Path("/opt"), Path("/srv")]
    async with open_local(zygote=zygote) as sb:
        for path in secrets + host_only:
            r = await sb.exec(f"cat {path} || ls -A {path}")
            assert "SECRET" not in r.stdout, path
            if path.exists() and path != Path("/etc/shadow"):
                assert r.exit_code != 0, f"{path} is visible: {r.stdout[:200]}"
        assert (await sb.exec("cat /etc/shadow")).stdout == ""
        # What the sandbox needs is there: system tools, and the interpreter its init runs on.
        assert (await sb.exec("git --version && ls /usr/bin/env")).exit_code == 0
        assert (await sb.exec([sys.executable, "-c", "print(1)"])).stdout == "1\n"


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_full_host_view_masks_credentials_of_the_real_home(
    zygote: bool, visible_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_home, elsewhere = visible_dir / "real", visible_dir / "elsewhere"
    for home in (real_home, elsewhere):
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
        (home / ".netrc").write_text("machine x password hunter2")
        (home / ".kaggle").mkdir()
        (home / ".kaggle" / "kaggle.json").write_text("hunter2")
        (home / "notes.txt").write_text("not a secret")
    # HOME pointed elsewhere must not unmask the home the password database names.
    entry = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((*entry[:5], str(real_home), *entry[6:]))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    monkeypatch.setenv("HOME", str(elsewhere))
    async with open_local(host_view="full", zygote=zygote) as sb:
        for home in (real_home, elsewhere):
            r = await sb.exec(
                f"ls -A {home}/.ssh; cat {home}/.netrc {home}/.kaggle/kaggle.json "
                f"{home}/notes.txt /etc/shadow"
            )
            assert "id_ed25519" not in r.stdout and "hunter2" not in r.stdout, home
            assert "not a secret" in r.stdout  # the rest of the host is visible
            assert "root:" not in r.stdout  # /etc/shadow reads as empty


# ----------------------------------------------------------------- privileges


@needs_bwrap
async def test_no_capabilities_and_read_only_kernel_knobs() -> None:
    async with open_local() as sb:
        caps = await sb.exec("grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status")
        assert caps.stdout.split()[1::2] == ["0000000000000000"] * 3
        # Harmless even if it worked: the jail has its own UTS namespace.
        assert (await sb.exec("echo x > /proc/sys/kernel/domainname")).exit_code != 0
        assert (await sb.exec("mount -t tmpfs none /mnt")).exit_code != 0
        assert (await sb.exec("test -e /sys/kernel")).exit_code != 0


_PROC_WRITES = """
import os, stat
opened, chmodded, tried = [], [], set()
def attempt(path):
    tried.add(path.rsplit("/", 1)[0])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # nothing is written
    except OSError:
        return
    os.close(fd)
    opened.append(path)
for name in os.listdir("/proc"):
    path = "/proc/" + name
    if name.isdigit() or os.path.islink(path):  # a process's own (self, thread-self, mounts, net)
        continue
    try:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode))  # its own mode: no change if allowed
        chmodded.append(path)
    except OSError:
        pass
    if not os.path.isdir(path):
        attempt(path)
    for root, _, files in os.walk(path):
        for file in files:
            attempt(os.path.join(root, file))
for path in ("/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname",
             "/proc/irq/default_smp_affinity", "/proc/pressure/cpu", "/proc/mtrr"):
    if os.path.exists(path):
        attempt(path)
        print("checked", path)
print("opened", *opened)
print("chmodded", *chmodded)
print("tried", *sorted(tried))
"""


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_no_host_wide_knob_under_proc_is_writable(zygote: bool) -> None:
    async with open_local(zygote=zygote) as sb:
        r = await sb.exec([sys.executable, "-c", _PROC_WRITES], timeout=60)
        assert r.exit_code == 0, r.stderr
        lines = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
        assert lines["opened"] == [] and lines["chmodded"] == []
        checked = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("checked")]
        assert "/proc/sys/kernel/core_pattern" in checked
        # The walk reached every file of these directories (nothing hid them from it).
        for directory in ("/proc/sys/kernel", "/proc/sys/vm", "/proc/irq", "/proc/pressure"):
            if await anyio.Path(directory).exists():
                assert directory in lines["tried"], directory
        sysrq = await anyio.Path("/proc/sysrq-trigger").exists()
        assert ("/proc/sysrq-trigger" in checked) == sysrq
        # The same from the shell, and through another path to the same files.
        for path in ("/proc/sys/kernel/hostname", "/proc/self/root/proc/irq/default_smp_affinity"):
            assert (await sb.exec(f"echo x > {path}")).exit_code != 0, path
        # Docker's masked paths read as nothing; the processes' own entries stay writable.
        masked = await sb.exec("cat /proc/keys /proc/timer_list /proc/interrupts; ls -A /proc/acpi")
        assert masked.stdout == ""
        own = await sb.exec("echo 500 > /proc/self/oom_score_adj && echo renamed > /proc/self/comm")
        assert own.exit_code == 0, own.stderr


_TRACE_INIT = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
def attach(pid):
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        os.waitpid(pid, 0) if pid != 1 else time.sleep(0.1)
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH: leave it running
        return "attached"
    return os.strerror(ctypes.get_errno())
print("init", attach(1))
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
print("own-child", attach(child))  # a debugger still works on what the command started
os.kill(child, 9)
for path in ("/proc/1/mem", "/proc/1/task/1/mem", "/proc/1/environ", "/proc/1/fd/0"):
    try:
        with open(path, "rb") as f:
            f.read(1)
        print("read", path)
    except OSError:
        pass
for path in ("/proc/1/fd", "/proc/1/task/1/fd", "/proc/1/fdinfo"):
    try:
        print("listed", path, *os.listdir(path))
    except OSError:
        pass
pidfd = os.pidfd_open(1)
for fd in range(16):
    got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
    if got >= 0:
        print("took fd", fd)
print("done")
"""


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_a_command_cannot_trace_its_init(zygote: bool) -> None:
    async with open_local(zygote=zygote) as sb:
        r = await sb.exec([sys.executable, "-c", _TRACE_INIT], timeout=60)
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "init Operation not permitted"
        assert lines[1] == "own-child attached"
        # Nothing read, no descriptor number listed, none taken.
        assert lines[2:] in (["listed /proc/1/fd", "listed /proc/1/task/1/fd", "done"], ["done"])
        assert (await sb.exec("echo alive")).stdout == "alive\n"  # the init was never stopped


_KEYRINGS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
add_key, keyctl = calls
for keyring in (-4, -3, -5):  # uid 0's user keyring (the host root's too), session, user session
    key = libc.syscall(add_key, b"user", b"sandlot-probe", b"data", 4, ctypes.c_int(keyring))
    print("add_key", keyring, "refused" if key < 0 else "added")
    if key >= 0:
        libc.syscall(keyctl, 21, ctypes.c_int(key), ctypes.c_int(keyring))  # KEYCTL_UNLINK
buf = ctypes.create_string_buffer(4096)
read = libc.syscall(keyctl, 11, ctypes.c_int(-4), buf, 4096)  # KEYCTL_READ of the user keyring
print("keyctl read", "refused" if read < 0 else "read")
"""


@needs_bwrap
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_no_kernel_keyring_shared_with_the_host(zygote: bool) -> None:
    # Keyrings belong to a uid, not a namespace: uid 0's is the host root's and every sandbox's.
    async with open_local(zygote=zygote) as sb:
        r = await sb.exec([sys.executable, "-c", _KEYRINGS])
        assert r.stdout.split("\n")[:4] == [
            "add_key -4 refused",
            "add_key -3 refused",
            "add_key -5 refused",
            "keyctl read refused",
        ], r.stdout + r.stderr
        # Everything else still runs under the filter.
        assert (await sb.exec("git --version && echo ok")).stdout.endswith("ok\n")


_REMOUNT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
def report(what, result):
    print(what, "ok" if result == 0 else "refused")
    sys.stdout.flush()
os.makedirs("/tmp/m", exist_ok=True)
# Without capabilities, then with all of them in a new user namespace (no exec: they stay).
for stage in ("plain", "userns"):
    if stage == "userns":
        report("unshare", libc.unshare(0x10000000 | 0x20000 | 0x20000000 | 0x40000000))
    report(stage + " umount", libc.umount2(b"/proc/irq", 2))
    report(stage + " remount-rw", libc.mount(None, b"/proc/irq", None, 32 | 4096, None))
    report(stage + " remount-proc-rw", libc.mount(None, b"/proc", None, 32 | 4096, None))
    report(stage + " sysfs", libc.mount(b"sysfs", b"/tmp/m", b"sysfs", 1, None))
child = os.fork()
if child == 0:  # PID 1 of the new PID namespace, owned by our user namespace
    report("child proc", libc.mount(b"proc", b"/tmp/m", b"proc", 2 | 4 | 8, None))
    report("child proc-ro", libc.mount(b"proc", b"/tmp/m", b"proc", 1 | 2 | 4 | 8, None))
    report("child bind", libc.mount(b"/proc", b"/tmp/m", None, 4096 | 16384, None))
    try:
        open("/tmp/m/irq/default_smp_affinity", "w").close()
        print("child wrote")
    except OSError:
        pass
    sys.stdout.flush()
    os._exit(0)
os.waitpid(child, 0)
"""


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
async def test_proc_cannot_be_remounted_from_inside(zygote: bool) -> None:
    async with open_local(zygote=zygote) as sb:
        r = await sb.exec([sys.executable, "-c", _REMOUNT], timeout=60)
    results = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    # A user namespace can be made (docker's seccomp profile forbids it; we have none), but
    # the mounts it copies are locked: /proc stays read-only where it was.
    assert results.pop("unshare") == "ok"
    assert results.pop("child bind") == "ok"
    assert set(results.values()) == {"refused"}, r.stdout


# ----------------------------------------------------------------- environment


@pytest.mark.parametrize("isolation", [pytest.param("bwrap", marks=needs_bwrap), "none"])
async def test_host_environment_does_not_leak(
    isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("SANDLOT_FAKE_API_KEY", secret)
    async with open_local(isolation=isolation, env={"VISIBLE": "yes"}) as sb:
        r = await sb.exec("env; cat /proc/self/environ /proc/1/environ 2>/dev/null")
    assert secret not in r.stdout and "SANDLOT_FAKE_API_KEY" not in r.stdout
    assert "VISIBLE=yes" in r.stdout


# ----------------------------------------------------------------- network


@pytest.fixture
def loopback_listener() -> Iterator[int]:
    """A TCP port listening on the host's 127.0.0.1 (the connection is never accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


@needs_bwrap
async def test_network_is_cut_unless_allowed(loopback_listener: int) -> None:
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_listener} && echo connected"
    async with open_local() as sb:
        r = await sb.exec(connect, timeout=20)
        assert r.exit_code != 0 and "connected" not in r.stdout
        assert (await sb.exec("cat /proc/net/route | wc -l")).stdout.strip() == "1"
    async with open_local(network=True) as sb:
        assert (await sb.exec(connect, timeout=20)).stdout == "connected\n"


_LISTEN = """
import socket, sys, time
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
abstract = socket.socket(socket.AF_UNIX)
abstract.bind("\\0" + sys.argv[1])  # abstract: no file
abstract.listen()
open("port", "w").write(str(tcp.getsockname()[1]))
time.sleep(120)
"""

_CONNECT = """
import socket, sys
def reach(family, address):
    with socket.socket(family) as s:
        s.settimeout(5)
        try:
            s.connect(address)
            return "yes"
        except OSError:
            return "no"
host_port, host_abstract, host_path, sibling_port, sibling_abstract = sys.argv[1:]
print(reach(socket.AF_INET, ("127.0.0.1", int(host_port))),
      reach(socket.AF_UNIX, "\\0" + host_abstract), reach(socket.AF_UNIX, host_path),
      reach(socket.AF_INET, ("127.0.0.1", int(sibling_port))),
      reach(socket.AF_UNIX, "\\0" + sibling_abstract))
"""


@needs_bwrap
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "own-bwrap"])
@pytest.mark.parametrize("network", [True, False])
async def test_what_a_sandbox_reaches_on_this_machine(
    network: bool, zygote: bool, loopback_listener: int, visible_dir: Path
) -> None:
    """The README's table: with ``network=True`` the host's loopback and abstract Unix
    sockets, and those of every other such sandbox; a Unix socket file it can see (here with
    ``host_view="full"``) whatever ``network`` says."""
    tag = uuid.uuid4().hex
    host_abstract, sibling_abstract = f"sandlot-host-{tag}", f"sandlot-sibling-{tag}"
    with (
        socket.socket(socket.AF_UNIX) as abstract,
        socket.socket(socket.AF_UNIX) as path_socket,
    ):
        abstract.bind(f"\0{host_abstract}")
        abstract.listen()
        path_socket.bind(str(visible_dir / "service.sock"))
        path_socket.listen()
        fields: dict[str, object] = {"network": network, "zygote": zygote, "host_view": "full"}
        async with open_local(**fields) as sibling, open_local(**fields) as sb:
            listen = f"{sys.executable} -c {shlex.quote(_LISTEN)} {shlex.quote(sibling_abstract)}"
            started = f"{listen} >/dev/null 2>&1 & until [ -s port ]; do sleep 0.05; done"
            port = (await sibling.exec(f"{started}; cat port", timeout=20)).stdout
            args = [loopback_listener, host_abstract, visible_dir / "service.sock", port]
            r = await sb.exec([sys.executable, "-c", _CONNECT, *map(str, args), sibling_abstract])
    assert r.exit_code == 0, r.stderr
    reached = dict(zip(["tcp", "abstract", "path", "sibling tcp", "sibling abstract"],
                       r.stdout.split(), strict=True))  # fmt: skip
    expected = "yes" if network else "no"
    assert reached == {
        "tcp": expected,
        "abstract": expected,
        "path": "yes",
        "sibling tcp": expected,
        "sibling abstract": expected,
    }, r.stderr


# ----------------------------------------------------------------- processes


@needs_bwrap
async def test_cannot_see_host_or_other_sandbox_processes(marker: str) -> None:
    # "ab[c]d" matches "abcd" but not itself: the search does not find its own grep.
    pattern = f"{marker[:10]}[{marker[10]}]{marker[11:]}"
    look = (
        f"cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '{pattern}'; "
        "ls /proc | grep -c '^[0-9]'"
    )
    async with await anyio.open_process(["bash", "-c", f"exec -a {marker}-host sleep 60"]) as host:
        try:
            async with open_local() as a, open_local() as b, anyio.create_task_group() as tg:
                tg.start_soon(b.exec, f"exec -a {marker}-b sleep 3")
                await anyio.to_thread.run_sync(wait_until_some_process_has, f"{marker}-b")
                count, visible_pids = (await a.exec(look)).stdout.split()
                assert count == "0"
                assert int(visible_pids) < 10
                tg.cancel_scope.cancel()
        finally:
            host.kill()


async def _observe_then_vanish(sb: LocalSandbox, cmd: str, marker: str) -> None:
    """Run ``cmd`` (which starts processes carrying ``marker``), see them on the host while it
    runs, then require them gone once it has returned."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(sb.exec, cmd + "; sleep 1.5")
        await anyio.to_thread.run_sync(wait_until_some_process_has, marker)
    assert await anyio.to_thread.run_sync(wait_until_no_process_has, marker) == []


_DAEMONS = (
    "(exec -a {m}-bg sleep 1000) & "
    "(setsid bash -c '(exec -a {m}-daemon sleep 1000) &' </dev/null >/dev/null 2>&1 &) ; "
    "(trap '' TERM; exec -a {m}-stubborn sleep 1000) & "
)


@needs_bwrap
async def test_background_processes_live_until_close(marker: str) -> None:
    async with open_local() as sb:
        r = await sb.exec(_DAEMONS.format(m=marker) + "echo started")
        assert r.stdout == "started\n"
        for kind in ("bg", "daemon", "stubborn"):
            await anyio.to_thread.run_sync(wait_until_some_process_has, f"{marker}-{kind}")
        seen = await sb.exec(f"cat /proc/[0-9]*/cmdline | tr '\\0' '\\n' | grep -c '^{marker}'")
        assert seen.stdout == "3\n"
        init_pid = sb.init_pid
    assert await anyio.to_thread.run_sync(wait_until_no_process_has, marker) == []
    assert init_pid is not None and not await anyio.Path(f"/proc/{init_pid}").exists()


@needs_bwrap
async def test_timed_out_tree_is_killed_on_the_host(marker: str) -> None:
    daemon = f"(setsid bash -c 'exec -a {marker} sleep 1000' </dev/null >/dev/null 2>&1 &)"
    async with open_local() as sb:
        r = await sb.exec(f"{daemon}; sleep 1000", timeout=1)
        assert r.timed_out
        assert await anyio.to_thread.run_sync(wait_until_no_process_has, marker) == []


async def test_isolation_none_processes_live_until_close(marker: str) -> None:
    async with open_local(isolation="none") as sb:
        await sb.exec(_DAEMONS.format(m=marker))
        for kind in ("bg", "daemon", "stubborn"):
            await anyio.to_thread.run_sync(wait_until_some_process_has, f"{marker}-{kind}")
    assert await anyio.to_thread.run_sync(wait_until_no_process_has, marker) == []


# ----------------------------------------------------------------- limits


_FORK_COUNTER = """
import os, sys, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print("unbounded", n)
except OSError:
    print("capped", n)
sys.stdout.flush()
os.killpg(0, 9)  # the children would outlive us and hold the sandbox's process slots
"""


@needs_bwrap
@needs_pids_cgroup
@pytest.mark.e2e
async def test_process_cap_holds_even_for_root() -> None:
    async with open_local(max_processes=64) as sb:
        r = await sb.exec([sys.executable, "-c", _FORK_COUNTER], timeout=60)
        verdict, count = r.stdout.split()
        assert verdict == "capped" and int(count) < 64
        assert sb.pids_cgroup is not None
        # A shell fork bomb hits the same wall. Once it runs, forking fails, so the shell waits
        # and counts with builtins only (a FIFO opened read-write gives `read -t` a timer).
        # The bomb outlives its shell (as on docker), so the command waits (`read -t`) until
        # its timeout, whose tree kill ends the bomb.
        bomb = await sb.exec(
            "mkfifo timer && exec 9<>timer; :(){ :|:& };:; read -t 1 -u 9; "
            "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n; read -t 60 -u 9",
            timeout=5,
        )
        assert bomb.timed_out
        assert 0 < int(bomb.stdout) <= 64  # the init is in the cgroup too
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        assert (await anyio.Path(sb.pids_cgroup / "pids.current").read_text()).strip() == "1"


@needs_bwrap
async def test_file_size_limit(tmp_path: Path) -> None:
    async with open_local(max_file_size_mb=1) as sb:
        r = await sb.exec("head -c 3000000 /dev/zero > big; echo status=$?")
        assert "status=153" in r.stdout  # SIGXFSZ
        assert sb.host_workdir is not None
        assert (await anyio.Path(sb.host_workdir / "big").stat()).st_size == 1024 * 1024


@needs_bwrap
async def test_cpu_time_limit() -> None:
    async with open_local(cpu_time_s=1) as sb:
        r = await sb.exec("while :; do :; done", timeout=30)
    assert (r.exit_code, r.timed_out) == (128 + 24, False)  # SIGXCPU


@needs_bwrap
async def test_memory_limit() -> None:
    async with open_local(memory_mb=256) as sb:
        r = await sb.exec([sys.executable, "-c", "b = bytearray(1 << 30)"], timeout=60)
    assert r.exit_code == 1 and "MemoryError" in r.stderr


@needs_bwrap
async def test_limits_cannot_be_raised_again() -> None:
    async with open_local(max_file_size_mb=1) as sb:
        r = await sb.exec("ulimit -f unlimited")
    assert r.exit_code != 0


# ----------------------------------------------------------------- setup


async def test_missing_bwrap_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    sb = open_local()
    with pytest.raises(BackendUnavailableError) as info:
        await sb.start()
    message = str(info.value)
    assert "apt-get install bubblewrap" in message and "dnf install bubblewrap" in message
    assert 'isolation="none"' in message
    assert sb.closed
    with pytest.raises(BackendUnavailableError, match="/opt/no/bwrap"):
        await open_local(bwrap_path="/opt/no/bwrap").start()


async def test_isolation_none_warns_once_per_sandbox(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sandlot.sandboxes.local")
    for _ in range(2):
        async with open_local(isolation="none") as sb:
            await sb.exec("true")
            await sb.exec("true")
    warnings = [r for r in caplog.records if "NOTHING IS ISOLATED" in r.getMessage()]
    assert len(warnings) == 2


@pytest.mark.parametrize("plant", ["another user's", "a symlink", "writable by all"])
async def test_a_sandboxes_directory_planted_by_someone_else_is_refused(
    plant: str, tmp_path: Path
) -> None:
    # As another user of the machine could do first at the guessable default,
    # $TMPDIR/sandlot-local-<uid>.
    planted = tmp_path / "sandlot-local"
    if plant == "a symlink":
        (tmp_path / "theirs").mkdir()
        planted.symlink_to(tmp_path / "theirs")
    else:
        planted.mkdir(mode=0o700)
        if plant == "writable by all":
            planted.chmod(0o777)
        elif os.geteuid() == 0:
            os.chown(planted, 65534, 65534)
        else:
            pytest.skip("making a directory of another user needs root")
    with pytest.raises(SandboxStartError, match="sandboxes' directory") as caught:
        async with open_local(root_dir=str(planted)):
            pass
    assert "root_dir" in str(caught.value)
    with pytest.raises(SandboxError, match="sandboxes' directory"):
        await LocalReaper(str(planted)).list_sandboxes()
    assert [p.name for p in planted.iterdir()] == []
