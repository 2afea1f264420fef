"""A scripted episode: model text with tool calls, parsed and run through the ``Toolbox`` on an
``examples/swe-mini`` instance, yields a patch that ``sandlot.rewards.evaluate`` resolves."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from requirements import EVAL, need_module

import sandlot
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.sandbox_setup import instance_spec, prepare_repo
from sandlot.rewards.evaluation import evaluate
from sandlot.tools import Toolbox, ToolCall, ToolContext, get_parser

need_module("swebench", EVAL)
pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe-mini"
ROOT = "/testbed"


def _script() -> list[ToolCall]:
    editor = "str_replace_editor"
    return [
        ToolCall(editor, {"command": "view", "path": ROOT}),
        ToolCall(
            editor, {"command": "view", "path": f"{ROOT}/minicalc/ops.py", "view_range": [8, 12]}
        ),
        ToolCall(
            editor,
            {
                "command": "create",
                "path": f"{ROOT}/reproduce.py",
                "file_text": ("from minicalc import evaluate\nprint(evaluate('7 / 2'))\n"),
            },
        ),
        ToolCall("bash", {"command": "cd /testbed && python reproduce.py"}),
        ToolCall(
            editor,
            {
                "command": "str_replace",
                "path": f"{ROOT}/minicalc/ops.py",
                "old_str": "return a // b",
                "new_str": "return a / b + 0",
            },
        ),
        ToolCall(editor, {"command": "undo_edit", "path": f"{ROOT}/minicalc/ops.py"}),
        ToolCall(
            editor,
            {
                "command": "str_replace",
                "path": f"{ROOT}/minicalc/ops.py",
                "old_str": "return a // b",
                "new_str": "return a / b",
            },
        ),
        ToolCall("bash", {"command": "python reproduce.py && git status --short"}),
        ToolCall("submit", {}),
    ]


@pytest.mark.parametrize("parser_name", ["hermes", "qwen3_coder"])
@pytest.mark.e2e
async def test_scripted_episode_resolves_an_instance(parser_name: str, tmp_path: Path) -> None:
    await anyio.run_process(
        [sys.executable, str(EXAMPLES / "make_repos.py"), "--dest", str(tmp_path)], check=True
    )
    (instance,) = [
        i.model_copy(update={"repo_source": str(tmp_path / "minicalc")})
        for i in load_instances(EXAMPLES / "instances.jsonl")
        if i.instance_id == "minicalc__minicalc-1"
    ]
    async with sandlot.open("local", instance_spec(instance, "local")) as sb:
        await prepare_repo(sb, instance)
        toolbox = Toolbox.from_config(
            context=ToolContext(sb, repo_dir=instance.workdir, base_commit=instance.base_commit)
        )
        parser = get_parser(parser_name, toolbox.schemas())
        observations = []
        for call in _script():
            parsed = parser.parse(parser.render([call], "Next step."))
            assert parsed.error is None and len(parsed.calls) == 1
            result = await toolbox.call(parsed.calls[0].name, parsed.calls[0].arguments)
            assert result.status == "ok", result.output
            observations.append(result)
    assert "minicalc/ops.py" in observations[0].output
    assert observations[1].output.endswith("    12\t    return a // b\n")
    assert observations[3].output == "3\n"  # the bug: 7 / 2 floor-divides
    assert observations[7].output == "3.5\n M minicalc/ops.py\n?? reproduce.py\n"
    submitted = observations[-1]
    assert submitted.done and submitted.patch
    assert "+    return a / b\n" in submitted.patch and "reproduce.py" in submitted.patch

    result = await evaluate(instance, submitted.patch, backend="local")
    assert result.resolved, result.error or result.log
