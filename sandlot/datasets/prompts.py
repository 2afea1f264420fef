"""The chat prompt of a row: a system and a user message rendered from a template.

A template is two ``str.format`` strings (a YAML or JSON file with keys ``system`` and ``user``;
see :func:`load_prompt_template`). Only the fields in :data:`PROMPT_FIELDS` can be used: the
gold ``patch``, the ``test_patch`` and the test lists are never offered, and every rendered
prompt is checked not to contain the gold patch or the test patch (a problem statement that
quotes them verbatim is rejected too).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from sandlot.datasets.errors import DatasetMessageError
from sandlot.datasets.instance import Instance

PROMPT_FIELDS = ("problem_statement", "repo", "instance_id", "workdir", "base_commit")
"""Instance fields a template may use; nothing that reveals the solution or the tests."""

DEFAULT_SYSTEM = (
    "You are a software engineer working in a sandboxed Linux environment. You act only through "
    "the tools you are given; every command runs in the repository's sandbox."
)

DEFAULT_USER = "\n".join(
    [
        "The repository {repo} is checked out in {workdir}. Resolve the issue below by changing "
        "the repository's non-test source files.",
        "",
        "<issue>",
        "{problem_statement}",
        "</issue>",
        "",
        "How to work:",
        "1. Read the code involved and find the cause of the issue.",
        "2. Write a small script that reproduces the problem and run it.",
        "3. Make the smallest change to non-test files that fixes the cause. Tests that check the "
        "issue exist and are hidden from you: do not edit or add tests to make them pass.",
        "4. Run your reproduction again and the existing tests near your change; fix regressions.",
        "5. Remove your scratch files, then call the `submit` tool.",
    ]
)


class PromptLeakError(DatasetMessageError):
    """A template asks for a forbidden field, or a rendered prompt contains the solution."""


class PromptTemplate(BaseModel):
    """System and user message templates (``str.format`` syntax over :data:`PROMPT_FIELDS`)."""

    model_config = ConfigDict(extra="forbid")

    system: str = DEFAULT_SYSTEM
    user: str = DEFAULT_USER

    @field_validator("system", "user")
    @classmethod
    def _only_known_fields(cls, text: str) -> str:
        for _, name, _, _ in string.Formatter().parse(text):
            if name is None:
                continue
            if name not in PROMPT_FIELDS:
                raise PromptLeakError(
                    f"template field {{{name}}} is not allowed; a template may use "
                    f"{', '.join('{' + f + '}' for f in PROMPT_FIELDS)} (the gold patch, test "
                    "patch and test lists are never part of a prompt)"
                )
        return text

    def render(self, instance: Instance) -> list[dict[str, str]]:
        """``[{"role": "system", ...}, {"role": "user", ...}]`` for ``instance``.

        Raises:
            PromptLeakError: the rendered text contains ``instance.patch`` or
                ``instance.test_patch``.
        """
        values = {name: getattr(instance, name) for name in PROMPT_FIELDS}
        messages = [
            {"role": "system", "content": self.system.format(**values)},
            {"role": "user", "content": self.user.format(**values)},
        ]
        leak = find_leak(messages, instance)
        if leak:
            raise PromptLeakError(f"{instance.instance_id}: the prompt contains the {leak}")
        return messages


def find_leak(messages: list[dict[str, Any]], instance: Instance) -> str | None:
    """Name of the solution part (``"gold patch"``/``"test patch"``) found in ``messages``."""
    text = "\n".join(str(m.get("content", "")) for m in messages)
    for label, patch in (("gold patch", instance.patch), ("test patch", instance.test_patch)):
        if patch.strip() and patch.strip() in text:
            return label
    return None


def load_prompt_template(path: str | Path) -> PromptTemplate:
    """Read a template file (``.json``, else YAML) with optional keys ``system`` and ``user``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file does not parse, has other keys, or uses a field not in
            :data:`PROMPT_FIELDS` (:class:`PromptLeakError`).
    """
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise DatasetMessageError(f"{file}: not valid JSON/YAML ({exc})") from None
    if not isinstance(data, dict):
        raise DatasetMessageError(
            f"{file}: a prompt template is an object with 'system' and 'user'"
        )
    try:
        return PromptTemplate.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise DatasetMessageError(f"{file}: {problems}") from None
