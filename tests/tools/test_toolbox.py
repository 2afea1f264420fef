"""``Toolbox``: schemas, dispatch, and every failure turned into an observation."""

from __future__ import annotations

import pytest

from sandlot import Sandbox
from sandlot.tools import TOOLS, Toolbox, ToolContext

pytestmark = pytest.mark.anyio


async def test_schemas_are_openai_functions_without_pydantic_noise(toolbox: Toolbox) -> None:
    schemas = {s["function"]["name"]: s for s in toolbox.schemas()}
    assert list(schemas) == ["bash", "str_replace_editor", "submit", "finish"]
    editor = schemas["str_replace_editor"]
    assert editor["type"] == "function"
    params = editor["function"]["parameters"]
    assert params["required"] == ["command", "path"]
    assert params["properties"]["command"]["enum"] == [
        "view",
        "create",
        "str_replace",
        "insert",
        "undo_edit",
    ]
    assert params["properties"]["view_range"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": params["properties"]["view_range"]["description"],
    }
    assert "title" not in str(schemas) and "null" not in str(schemas)
    assert schemas["submit"]["function"]["parameters"]["properties"] == {}


async def test_from_config_rejects_unknown_tools_and_settings(sandbox: Sandbox) -> None:
    context = ToolContext(sandbox)
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        Toolbox.from_config(["nope"], context=context)
    with pytest.raises(ValueError, match="invalid settings for tool 'bash'"):
        Toolbox.from_config([{"name": "bash", "timeout": 3}], context=context)
    box = Toolbox.from_config([{"name": "execute_bash", "timeout_s": 5}], context=context)
    assert box.names == ["execute_bash"] and set(TOOLS) >= {"bash", "execute_bash"}


async def test_malformed_calls_are_format_errors(toolbox: Toolbox) -> None:
    cases = {
        (
            "nope",
            "{}",
        ): "Unknown tool 'nope'. Available tools: bash, str_replace_editor, submit, finish.",
        ("bash", "{not json"): "The arguments of bash are not valid JSON",
        ("bash", "[1]"): "must be a JSON object, got list",
        ("bash", "{}"): "Invalid arguments for bash: command: Field required.",
        ("bash", '{"command": "ls", "x": 1}'): "x: Extra inputs are not permitted",
        (
            "str_replace_editor",
            '{"command": "rm", "path": "/"}',
        ): "Invalid arguments for str_replace_editor: command: Input should be",
    }
    for (name, arguments), message in cases.items():
        r = await toolbox.call(name, arguments)
        assert r.status == "format_error", (name, arguments)
        assert message in r.output, r.output


async def test_bash_tool_runs_in_the_persistent_shell(toolbox: Toolbox) -> None:
    assert (await toolbox.call("bash", {"command": "cd /tmp && X=1"})).output == (
        "Your command ran successfully and did not produce any output."
    )
    r = await toolbox.call("bash", '{"command": "echo $X $PWD; false"}')
    assert (r.status, r.output) == ("ok", "1 /tmp\n[exit code: 1]")


async def test_bash_timeout_message(sandbox: Sandbox) -> None:
    box = Toolbox.from_config([{"name": "bash", "timeout_s": 0.5}], context=ToolContext(sandbox))
    r = await box.call("bash", {"command": "echo partial; sleep 30"})
    assert r.status == "timeout"
    assert r.output.startswith("partial\nThe command 'echo partial; sleep 30' was cancelled")
    assert "more than 0.5 seconds" in r.output


async def test_dead_sandbox_is_an_observation(toolbox: Toolbox, sandbox: Sandbox) -> None:
    await sandbox.close()
    for name, args in (
        ("bash", {"command": "ls"}),
        ("str_replace_editor", {"command": "view", "path": "/"}),
        ("submit", {}),
    ):
        r = await toolbox.call(name, args)
        assert r.status == "error" and "sandbox" in r.output, (name, r.output)


async def test_finish(toolbox: Toolbox) -> None:
    r = await toolbox.call("finish", {"message": "done"})
    assert (r.output, r.done, r.status) == ("done", True, "ok")
