"""Contract: moving files (``read_file``, ``write_file``, ``upload``, ``download``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandlot import Sandbox, SandboxFileError
from sandlot.sandboxes import DownloadLimitError

MiB = 1024 * 1024

pytestmark = pytest.mark.anyio


def _in_workdir(sb: Sandbox, name: str) -> str:
    return f"{sb.spec.workdir}/{name}"


async def test_text_and_bytes_round_trip(sandbox: Sandbox) -> None:
    await sandbox.write_file(_in_workdir(sandbox, "t.txt"), "héllo\nwörld")
    assert await sandbox.read_file(_in_workdir(sandbox, "t.txt")) == "héllo\nwörld".encode()


async def test_every_byte_value_round_trips(sandbox: Sandbox) -> None:
    data = bytes(range(256)) * 64 + b"\r\n\x00"
    await sandbox.write_file(_in_workdir(sandbox, "bin"), data)
    assert await sandbox.read_file(_in_workdir(sandbox, "bin")) == data


async def test_megabytes_round_trip(sandbox: Sandbox) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    await sandbox.write_file(_in_workdir(sandbox, "big.bin"), data)
    assert await sandbox.read_file(_in_workdir(sandbox, "big.bin")) == data


async def test_write_creates_parents_and_overwrites(sandbox: Sandbox) -> None:
    path = _in_workdir(sandbox, "a/b/c/file.txt")
    await sandbox.write_file(path, b"first version, longer")
    await sandbox.write_file(path, b"second")
    assert await sandbox.read_file(path) == b"second"


async def test_relative_paths_are_inside_workdir(sandbox: Sandbox) -> None:
    await sandbox.write_file("rel/x.txt", b"rel")
    assert await sandbox.read_file(_in_workdir(sandbox, "rel/x.txt")) == b"rel"


async def test_file_api_and_commands_see_the_same_files(sandbox: Sandbox) -> None:
    await sandbox.write_file(_in_workdir(sandbox, "from_api.txt"), b"api\n")
    assert (await sandbox.exec("cat from_api.txt")).stdout == "api\n"
    await sandbox.exec("printf 'cmd\\000' > from_cmd.bin")
    assert await sandbox.read_file(_in_workdir(sandbox, "from_cmd.bin")) == b"cmd\x00"


async def test_reading_a_missing_file_names_it(sandbox: Sandbox) -> None:
    path = _in_workdir(sandbox, "no/such/file.txt")
    with pytest.raises(SandboxFileError, match=r"no/such/file\.txt"):
        await sandbox.read_file(path)


async def test_reading_a_directory_fails(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p adir")
    with pytest.raises(SandboxFileError, match="adir"):
        await sandbox.read_file(_in_workdir(sandbox, "adir"))


async def test_writing_where_nothing_can_be_written_fails(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxFileError, match="/proc/sandlot-nope/x"):
        await sandbox.write_file("/proc/sandlot-nope/x", b"data")


async def test_writing_onto_a_directory_fails(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p adir")
    with pytest.raises(SandboxFileError):
        await sandbox.write_file(_in_workdir(sandbox, "adir"), b"data")


def _make_tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "empty_dir").mkdir()
    (root / "top.txt").write_text("top\n")
    (root / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "pkg" / "sub" / "data.bin").write_bytes(bytes(range(256)))
    script = root / "pkg" / "run.sh"
    script.write_text("#!/bin/sh\necho run\n")
    script.chmod(0o755)
    (root / "link_to_top").symlink_to("top.txt")
    (root / "pkg" / "dangling").symlink_to("../missing")


def _describe(root: Path) -> dict[str, tuple[str, str | bytes, bool]]:
    """relative path -> (kind, content or link target, executable)."""
    seen: dict[str, tuple[str, str | bytes, bool]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path), False)
            elif path.is_dir():
                seen[rel] = ("dir", "", False)
            else:
                executable = bool(path.stat().st_mode & stat.S_IXUSR)
                seen[rel] = ("file", path.read_bytes(), executable)
    return seen


async def test_directory_tree_round_trip(sandbox: Sandbox, tmp_path: Path) -> None:
    source, back = tmp_path / "source", tmp_path / "back" / "tree"
    source.mkdir()
    _make_tree(source)
    remote = _in_workdir(sandbox, "uploaded/tree")
    await sandbox.upload(source, remote)
    await sandbox.download(remote, back)
    assert _describe(back) == _describe(source)


async def test_uploaded_tree_is_visible_to_commands(sandbox: Sandbox, tmp_path: Path) -> None:
    _make_tree(tmp_path)
    await sandbox.upload(tmp_path, _in_workdir(sandbox, "proj"))
    r = await sandbox.exec(
        "cd proj && find . -mindepth 1 | sort && readlink link_to_top && pkg/run.sh"
    )
    assert r.exit_code == 0, r.stderr
    listed = r.stdout.split()
    assert "./empty_dir" in listed and "./pkg/sub/data.bin" in listed
    assert listed[-2:] == ["top.txt", "run"]


async def test_single_file_upload_and_download(sandbox: Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "tool.sh"
    source.write_text("#!/bin/sh\necho tool\n")
    source.chmod(0o755)
    await sandbox.upload(source, _in_workdir(sandbox, "bin/renamed.sh"))
    assert (await sandbox.exec("bin/renamed.sh")).stdout == "tool\n"
    target = tmp_path / "out" / "copy.sh"
    await sandbox.download(_in_workdir(sandbox, "bin/renamed.sh"), target)
    assert target.read_text() == "#!/bin/sh\necho tool\n"
    assert target.stat().st_mode & stat.S_IXUSR


async def test_command_output_can_be_downloaded(sandbox: Sandbox, tmp_path: Path) -> None:
    await sandbox.exec("mkdir -p out/deep && echo result > out/deep/r.txt && mkdir out/none")
    await sandbox.download(_in_workdir(sandbox, "out"), tmp_path / "got")
    assert (tmp_path / "got" / "deep" / "r.txt").read_text() == "result\n"
    assert (tmp_path / "got" / "none").is_dir()


async def test_download_of_missing_path_fails(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxFileError, match="nothing-here"):
        await sandbox.download(_in_workdir(sandbox, "nothing-here"), tmp_path / "x")
    assert not (tmp_path / "x").exists()


async def test_upload_of_missing_local_path_fails(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.upload(tmp_path / "missing", _in_workdir(sandbox, "x"))


# ----------------------------------------------------------------- hostile trees (issue 13)


def _host_bytes(root: Path) -> int:
    """Bytes of file content under ``root`` on the host (links not followed)."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total


async def test_a_planted_link_never_makes_a_later_download_write_outside(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    r = await sandbox.exec(
        "mkdir -p out && echo in > out/inside.txt && ln -s inside.txt out/ok && "
        f"ln -s {host_dir} out/logs && ln -s ../../../../../../../..{host_dir} out/rel && "
        "echo result > result.txt"
    )
    assert r.ok, r.stderr
    dest = tmp_path / "d" / "out"
    report = await sandbox.download(_in_workdir(sandbox, "out"), dest)
    assert os.readlink(dest / "ok") == "inside.txt"
    assert not (dest / "logs").is_symlink() and not (dest / "rel").is_symlink()
    assert not (dest / "logs").exists() and not (dest / "rel").exists()
    assert sorted(path for path, _ in report.skipped) == ["out/logs", "out/rel"]
    await sandbox.download(_in_workdir(sandbox, "result.txt"), dest / "logs" / "r.txt")
    assert list(host_dir.iterdir()) == []
    assert (dest / "logs" / "r.txt").read_text() == "result\n"


async def test_downloading_a_link_gives_what_it_leads_to_in_the_sandbox(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    assert (await sandbox.exec("ln -s /etc/passwd x")).ok
    report = await sandbox.download(_in_workdir(sandbox, "x"), tmp_path / "x")
    assert not (tmp_path / "x").is_symlink()
    assert (tmp_path / "x").read_bytes() == await sandbox.read_file("/etc/passwd")
    assert (report.files, report.skipped) == (1, [])


async def test_read_file_is_capped(sandbox: Sandbox) -> None:
    # Sparse: 65 MiB that take no disk in the sandbox, above the 64 MiB default cap.
    bomb, ten = _in_workdir(sandbox, "bomb"), _in_workdir(sandbox, "ten")
    r = await sandbox.exec("truncate -s 65M bomb && printf 0123456789 > ten")  # in the workdir
    assert r.ok, r.stderr
    with pytest.raises(DownloadLimitError, match="max_bytes"):
        await sandbox.read_file(bomb)
    with pytest.raises(DownloadLimitError, match=ten):
        await sandbox.read_file(ten, max_bytes=9)
    assert await sandbox.read_file(ten, max_bytes=10) == b"0123456789"


async def test_download_refuses_sparse_bombs_before_writing(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    r = await sandbox.exec("mkdir -p bombs && truncate -s 1G bombs/a bombs/b && echo ok > bombs/c")
    assert r.ok, r.stderr
    with pytest.raises(SandboxFileError, match="max_file_bytes"):
        await sandbox.download(_in_workdir(sandbox, "bombs"), tmp_path / "bombs")
    assert _host_bytes(tmp_path) < MiB


async def test_download_total_is_capped(sandbox: Sandbox, tmp_path: Path) -> None:
    r = await sandbox.exec(
        "mkdir -p two && head -c 600000 /dev/zero > two/a && head -c 600000 /dev/zero > two/b"
    )
    assert r.ok, r.stderr
    with pytest.raises(DownloadLimitError, match="max_bytes=1000000"):
        await sandbox.download(_in_workdir(sandbox, "two"), tmp_path / "two", max_bytes=1_000_000)
    assert _host_bytes(tmp_path) <= 1_000_000
    report = await sandbox.download(_in_workdir(sandbox, "two"), tmp_path / "ok")
    assert (report.files, report.bytes) == (2, 1_200_000)
