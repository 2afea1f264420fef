"""``str_replace_editor``: SWE-agent's behaviour and messages, over the sandbox's files."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot import Sandbox
from sandlot.tools import Toolbox, ToolResult

pytestmark = pytest.mark.anyio

SOURCE = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"


async def edit(toolbox: Toolbox, **args: Any) -> ToolResult:
    return await toolbox.call("str_replace_editor", args)


@pytest.fixture
async def src(sandbox: Sandbox) -> str:
    path = f"{sandbox.spec.workdir}/pkg/mod.py"
    await sandbox.write_file(path, SOURCE)
    return path


async def test_view_file_is_numbered_like_cat_n(toolbox: Toolbox, src: str) -> None:
    r = await edit(toolbox, command="view", path=src)
    assert r.status == "ok"
    assert r.output == (
        f"Here's the result of running `cat -n` on {src}:\n"
        "     1\tdef f():\n     2\t    return 1\n     3\t\n     4\t\n"
        "     5\tdef g():\n     6\t    return 1\n     7\t\n"
    )


async def test_view_range(toolbox: Toolbox, src: str) -> None:
    r = await edit(toolbox, command="view", path=src, view_range=[5, -1])
    assert r.output.endswith("     5\tdef g():\n     6\t    return 1\n     7\t\n")
    r = await edit(toolbox, command="view", path=src, view_range=[9, 10])
    assert r.status == "error"
    assert r.output == (
        "Invalid `view_range`: [9, 10]. Its first element `9` should be within the range of "
        "lines of the file: [1, 7]"
    )
    r = await edit(toolbox, command="view", path=src, view_range=[3, 2])
    assert "should be larger or equal than its first `3`" in r.output


async def test_view_directory_two_levels_without_hidden(
    toolbox: Toolbox, sandbox: Sandbox, src: str
) -> None:
    root = sandbox.spec.workdir
    await sandbox.exec("mkdir -p pkg/sub/deep .hidden && touch pkg/sub/deep/x .hidden/y pkg/.h")
    r = await edit(toolbox, command="view", path=root)
    assert r.output.startswith(
        f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden items:\n"
    )
    listed = set(r.output.splitlines()[1:])
    assert {root, f"{root}/pkg", src, f"{root}/pkg/sub"} <= listed
    assert not any(".hidden" in line or "deep" in line or ".h" in line for line in listed)


async def test_str_replace_shows_a_snippet(toolbox: Toolbox, src: str, sandbox: Sandbox) -> None:
    r = await edit(
        toolbox,
        command="str_replace",
        path=src,
        old_str="def g():\n    return 1",
        new_str="def g():\n    return 2",
    )
    assert r.status == "ok"
    assert r.output == (
        f"The file {src} has been edited. Here's the result of running `cat -n` on a snippet "
        f"of {src}:\n     1\tdef f():\n     2\t    return 1\n     3\t\n     4\t\n     5\tdef g():\n"
        "     6\t    return 2\nReview the changes and make sure they are as expected. "
        "Edit the file again if necessary."
    )
    assert await sandbox.read_file(src) == b"def f():\n    return 1\n\n\ndef g():\n    return 2\n"


async def test_str_replace_needs_a_unique_match(toolbox: Toolbox, src: str) -> None:
    r = await edit(toolbox, command="str_replace", path=src, old_str="return 1", new_str="return 3")
    assert r.status == "error"
    assert r.output == (
        "No replacement was performed. Multiple occurrences of old_str `return 1` in lines "
        "[2, 6]. Please ensure it is unique"
    )
    r = await edit(toolbox, command="str_replace", path=src, old_str="return 9", new_str="x")
    assert r.output == (
        f"No replacement was performed, old_str `return 9` did not appear verbatim in {src}."
    )


async def test_insert_and_undo(toolbox: Toolbox, src: str, sandbox: Sandbox) -> None:
    r = await edit(toolbox, command="insert", path=src, insert_line=2, new_str="# added")
    assert r.status == "ok" and "     3\t# added" in r.output
    assert (await sandbox.read_file(src)).decode().splitlines()[2] == "# added"
    r = await edit(toolbox, command="undo_edit", path=src)
    assert r.output.startswith(f"Last edit to {src} undone successfully. ")
    assert (await sandbox.read_file(src)).decode() == SOURCE
    r = await edit(toolbox, command="undo_edit", path=src)
    assert (r.status, r.output) == ("error", f"No edit history found for {src}.")
    r = await edit(toolbox, command="insert", path=src, insert_line=99, new_str="x")
    assert "It should be within the range of lines of the file: [0, 7]" in r.output


async def test_create(toolbox: Toolbox, sandbox: Sandbox, src: str) -> None:
    new = f"{sandbox.spec.workdir}/pkg/new.py"
    r = await edit(toolbox, command="create", path=new, file_text="x = 1\n")
    assert (r.status, r.output) == ("ok", f"File created successfully at: {new}")
    assert await sandbox.read_file(new) == b"x = 1\n"
    r = await edit(toolbox, command="create", path=src, file_text="")
    assert (
        r.output == f"File already exists at: {src}. Cannot overwrite files using command `create`."
    )
    r = await edit(
        toolbox, command="create", path=f"{sandbox.spec.workdir}/no/dir/f.py", file_text=""
    )
    assert "The parent directory" in r.output and "does not exist" in r.output


async def test_path_errors(toolbox: Toolbox, sandbox: Sandbox) -> None:
    root = sandbox.spec.workdir
    r = await edit(toolbox, command="view", path="pkg/mod.py")
    assert r.output == (
        f"The path pkg/mod.py is not an absolute path, it should start with `/`. "
        f"Maybe you meant {root}/pkg/mod.py?"
    )
    r = await edit(toolbox, command="view", path=f"{root}/missing.py")
    assert r.output == f"The path {root}/missing.py does not exist. Please provide a valid path."
    r = await edit(toolbox, command="str_replace", path=root, old_str="a", new_str="b")
    assert "is a directory and only the `view` command can be used" in r.output
    r = await edit(toolbox, command="create", path=f"{root}/f.py")
    assert r.output == "Parameter `file_text` is required for command: create"


async def test_tabs_are_kept_when_old_str_matches_as_is(toolbox: Toolbox, sandbox: Sandbox) -> None:
    path = f"{sandbox.spec.workdir}/Makefile"
    await sandbox.write_file(path, "all:\n\techo a\n\techo b\n")
    r = await edit(
        toolbox, command="str_replace", path=path, old_str="\techo b", new_str="\techo c"
    )
    assert r.status == "ok"
    assert await sandbox.read_file(path) == b"all:\n\techo a\n\techo c\n"
    # As seen in `view` (tabs expanded), the text still matches, SWE-agent style.
    r = await edit(
        toolbox,
        command="str_replace",
        path=path,
        old_str="        echo a",
        new_str="        echo z",
    )
    assert r.status == "ok"
    assert await sandbox.read_file(path) == b"all:\n        echo z\n        echo c\n"


async def test_long_files_are_clipped(toolbox: Toolbox, sandbox: Sandbox) -> None:
    path = f"{sandbox.spec.workdir}/big.txt"
    await sandbox.write_file(path, "x" * 20_000)
    r = await edit(toolbox, command="view", path=path)
    assert "<response clipped>" in r.output and len(r.output) < 17_000


async def test_view_of_a_huge_file_is_refused_not_read(toolbox: Toolbox, sandbox: Sandbox) -> None:
    # 1 GiB that takes no disk: reading it whole used to take the caller's RSS up by 2 GiB.
    assert (await sandbox.exec("truncate -s 1G /tmp/sparse")).ok
    r = await edit(toolbox, command="view", path="/tmp/sparse")
    assert r.status == "error"
    assert "larger than 10485760 bytes" in r.output and "sed -n" in r.output
    small = Toolbox.from_config(
        [{"name": "str_replace_editor", "max_file_bytes": 5}], context=toolbox.tools["bash"].context
    )
    await sandbox.write_file("/tmp/six", b"123456")
    r = await small.call("str_replace_editor", {"command": "view", "path": "/tmp/six"})
    assert r.status == "error" and "larger than 5 bytes" in r.output
