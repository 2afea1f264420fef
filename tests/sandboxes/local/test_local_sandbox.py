"""Behaviour specific to the ``local`` backend (the shared behaviour: tests/sandboxes/contract)."""

from __future__ import annotations

import _ctypes
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from local_helpers import needs_bwrap, needs_pids_cgroup, open_local, wait_until_no_process_has
from repo_paths import REPO

import sandlot
from sandlot import SandboxDeadError, SandboxStartError
from sandlot.sandboxes.local import LocalOptions
from sandlot.sandboxes.local import sandbox as local_sandbox

pytestmark = pytest.mark.anyio


async def test_open_routes_option_keywords() -> None:
    sb = open_local(isolation="none", max_output_bytes=123, image="host")
    assert sb.options == LocalOptions(isolation="none", max_output_bytes=123)
    with pytest.raises(ValueError, match="max_output_bytes"):
        sandlot.open("local", max_output_bytes=0)


async def test_small_output_cap_keeps_head_and_says_so() -> None:
    async with open_local(max_output_bytes=1000) as sb:
        r = await sb.exec("seq 1 100000; seq 1 5 >&2")
    head, _, note = r.stdout.partition("\n[sandlot: stdout truncated")
    assert head == "\n".join(str(i) for i in range(1, 100_001))[:1000]
    assert "kept the first 1000 bytes" in note and r.truncated
    assert r.stderr == "1\n2\n3\n4\n5\n"


@needs_bwrap
@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_python_is_offered_and_path_lists_only_shown_directories(isolation: str) -> None:
    async with open_local(isolation=isolation) as sb:
        python = await sb.exec('python -c "print(0, 2)"')
        listed = await sb.exec(
            'IFS=:; for d in $PATH; do [ -d "$d" ] && echo "shown $d" || echo "absent $d"; done'
        )
    assert (python.exit_code, python.stdout) == (0, "0 2\n")
    absent = [line.split(" ", 1)[1] for line in listed.stdout.splitlines() if line[0] == "a"]
    # An entry may be absent only when the host lacks it too (e.g. /usr/local/sbin).
    assert _host_directories(absent) == []


def _host_directories(paths: list[str]) -> list[str]:
    return [p for p in paths if Path(p).is_dir()]


@needs_bwrap
async def test_host_dir_layout_and_removal_on_close() -> None:
    async with open_local() as sb:
        assert sb.host_dir is not None and sb.host_workdir is not None
        await sb.exec("echo hi > f; mkdir -p ro/deep && touch ro/deep/x && chmod -R a-w ro")
        assert (sb.host_workdir / "f").read_text() == "hi\n"
        r = await sb.exec('echo "$HOME $SANDLOT_WORKDIR"; touch ~/h /tmp/t && echo ok')
        assert r.stdout == "/sandlot/home /testbed\nok\n"
        host_dir = sb.host_dir
    assert not host_dir.exists()


@needs_bwrap
async def test_custom_workdir() -> None:
    async with open_local(workdir="/work_here") as sb:
        assert (await sb.exec("pwd")).stdout == "/work_here\n"
        await sb.write_file("/work_here/a", b"a")
        assert (await sb.exec("cat a")).stdout == "a"


@needs_bwrap
async def test_unusable_workdir_or_image_fails_to_start() -> None:
    with pytest.raises(SandboxStartError, match="does not exist in the image"):
        await open_local(workdir="/usr/sandlot-no-such-dir").start()
    with pytest.raises(SandboxStartError, match="reserved"):
        await open_local(workdir="/proc").start()
    with pytest.raises(SandboxStartError, match="not a directory"):
        await open_local(image="/sandlot-no-such-rootfs").start()


@needs_bwrap
async def test_rootfs_without_python_says_so(tmp_path: Path) -> None:
    (tmp_path / "rootfs/usr/bin").mkdir(parents=True)
    with pytest.raises(SandboxStartError, match="no python3"):
        await open_local(image=str(tmp_path / "rootfs")).start()


def _hardlink_or_copy(source: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _link_tree(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["cp", "-al", str(source), str(dest)], check=False).returncode != 0:
        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)


def _minimal_rootfs(root: Path) -> None:
    """bash and the coreutils the file API uses (cat, head, basename, mkdir, tar, ls), this
    machine's Python (which runs the sandbox's init; its standard library found from
    ``/usr/bin/python3`` as ``/usr/lib/pythonX.Y``) and their shared libraries (also those of
    ``_ctypes``, which the init needs) under ``root``."""
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    stdlib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    _link_tree(stdlib, root / "usr/lib" / stdlib.name)
    _hardlink_or_copy(python, root / "usr/bin/python3")
    programs = [
        shutil.which(p) for p in ("bash", "cat", "head", "basename", "mkdir", "tar", "ls")
    ] + [python, _ctypes.__file__]
    libraries: set[str] = set()
    for program in programs:
        assert program is not None
        ldd = subprocess.run(["ldd", program], capture_output=True, text=True, check=True)
        libraries.update(w for w in ldd.stdout.split() if w.startswith("/"))
        if program not in (python, _ctypes.__file__):
            _hardlink_or_copy(os.path.realpath(program), root / "usr/bin" / Path(program).name)
    for lib in libraries:
        _hardlink_or_copy(os.path.realpath(lib), root / lib.lstrip("/"))
    for name in ("bin", "lib", "lib64"):
        if not (root / name).exists():
            (root / name).symlink_to(f"usr/{name}")
    (root / "etc").mkdir()
    (root / "etc/marker").write_text("rootfs\n")
    (root / "testbed").mkdir()
    (root / "testbed/seed.txt").write_text("seed\n")


@needs_bwrap
@pytest.mark.e2e
async def test_rootfs_directory_image(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    _minimal_rootfs(rootfs)
    async with open_local(image=str(rootfs)) as sb:
        r = await sb.exec("cat /etc/marker seed.txt; ls /root /work 2>&1; echo $PATH")
        assert r.stdout.startswith("rootfs\nseed\n")
        assert "No such file" in r.stdout  # host directories are not there
        assert "/usr/bin" in r.stdout
        await sb.write_file("seed.txt", b"changed")
        assert await sb.read_file("/testbed/seed.txt") == b"changed"
    assert (rootfs / "testbed/seed.txt").read_text() == "seed\n"


async def test_isolation_none_maps_the_workdir() -> None:
    async with open_local(isolation="none") as sb:
        assert sb.host_workdir is not None
        r = await sb.exec('pwd; echo "$SANDLOT_WORKDIR"; echo "$TMPDIR"')
        workdir, advertised, tmpdir = r.stdout.split()
        assert workdir == advertised == str(sb.host_workdir)
        assert tmpdir != "/tmp" and await anyio.Path(tmpdir).is_dir()
        await sb.write_file("/testbed/sub/f.txt", b"mapped")
        assert await anyio.Path(sb.host_workdir / "sub/f.txt").read_bytes() == b"mapped"
        assert (await sb.exec("pwd", cwd="/testbed/sub")).stdout == f"{sb.host_workdir}/sub\n"


async def test_lifetime_ends_the_sandbox() -> None:
    async with open_local(timeout_s=1.0) as sb:
        with pytest.raises(SandboxDeadError, match="lifetime"):
            await sb.exec("sleep 20")
        assert not await sb.is_alive()
        with pytest.raises(SandboxDeadError, match="lifetime"):
            await sb.exec("true")


@pytest.mark.parametrize("isolation", [pytest.param("bwrap", marks=needs_bwrap), "none"])
async def test_a_cgroup_the_init_cannot_join_fails_the_start_and_leaves_nothing(
    isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Unjoinable:
        procs_file = tmp_path / "removed-cgroup" / "cgroup.procs"
        join_file = procs_file

        async def destroy(self) -> None:
            pass

    monkeypatch.setattr(local_sandbox, "create_cgroups", lambda *_: [Unjoinable()])
    sb = open_local(isolation=isolation, start_limits={"max_attempts": 1})
    with pytest.raises(SandboxStartError) as info:
        await sb.start()
    assert "cannot put the sandbox's init in its cgroup" in str(info.value)
    assert "removed-cgroup/cgroup.procs" in str(info.value)
    assert wait_until_no_process_has(sb.id) == []
    assert not await sb.is_alive()


@needs_bwrap
@needs_pids_cgroup
async def test_pids_cgroup_holds_the_commands_and_goes_away() -> None:
    async with open_local() as sb:
        cgroup = sb.pids_cgroup
        assert cgroup is not None
        assert (cgroup / "pids.max").read_text().strip() == "4096"
        r = await sb.exec("cat /proc/self/cgroup")
        assert f"pids:/{cgroup.name}" in r.stdout or f"::/{cgroup.name}" in r.stdout
    assert not cgroup.exists()


@needs_bwrap
async def test_many_sandboxes_at_once() -> None:
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        async with open_local() as sb:
            results[i] = (await sb.exec(f"echo {i}")).stdout

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(one, i)
    assert results == {i: f"{i}\n" for i in range(40)}


@needs_bwrap
def test_python_from_a_virtualenv_under_tmp_is_visible(tmp_path: Path) -> None:
    # pytest's tmp_path is under /tmp, which is private inside the jail.
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    # The new venv sees the base installation's packages only; when this interpreter is itself a
    # venv, sandlot's dependencies are in its own site-packages: a .pth file adds those.
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dirs = [
        *site.getsitepackages(),
        *([site.getusersitepackages()] if site.ENABLE_USER_SITE else []),
    ]
    Path(purelib, "outer_site_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    )
    script = (
        "import anyio, sys, sandlot\n"
        "async def main():\n"
        "    async with sandlot.open('local') as sb:\n"
        "        r = await sb.exec([sys.executable, '-c', 'import sys; print(sys.prefix)'])\n"
        "        print(r.exit_code, r.stdout.strip())\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run(
        [python, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout
    assert out.split() == ["0", str(venv)]


@needs_bwrap
async def test_removed_host_directory_kills_the_sandbox() -> None:
    async with open_local() as sb:
        assert sb.host_dir is not None
        await anyio.to_thread.run_sync(shutil.rmtree, sb.host_dir)
        with pytest.raises(SandboxDeadError, match="removed"):
            await sb.exec("true")
        assert not await sb.is_alive()
