"""Prompt templates: allowed fields only, and never the gold patch or the test patch."""

from __future__ import annotations

from pathlib import Path

import pytest
from dataprep_support import EXAMPLES
from pydantic import ValidationError

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.prompts import (
    PromptLeakError,
    PromptTemplate,
    find_leak,
    load_prompt_template,
)


def _instance(**update: object) -> Instance:
    inst = load_instances(EXAMPLES / "instances.jsonl")[0]
    return inst.model_copy(update=update)


def test_default_prompt_has_the_issue_and_none_of_the_solution() -> None:
    for inst in load_instances(EXAMPLES / "instances.jsonl"):
        system, user = PromptTemplate().render(inst)
        assert (system["role"], user["role"]) == ("system", "user")
        assert inst.problem_statement in user["content"]
        for secret in (inst.patch, inst.test_patch, *inst.FAIL_TO_PASS):
            assert secret not in system["content"] + user["content"]


@pytest.mark.parametrize("field", ["patch", "test_patch", "FAIL_TO_PASS", "repo.__class__"])
def test_template_fields_outside_the_allow_list_are_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match="not allowed"):
        PromptTemplate(user="Fix it: {" + field + "}")


def test_a_problem_statement_quoting_the_gold_patch_is_rejected() -> None:
    inst = _instance()
    leaky = inst.model_copy(update={"problem_statement": f"Apply this:\n{inst.patch}"})
    with pytest.raises(PromptLeakError, match="gold patch"):
        PromptTemplate().render(leaky)
    assert find_leak([{"content": inst.test_patch}], inst) == "test patch"


def test_template_file(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "system: Be brief.\nuser: 'In {workdir} of {repo}: {problem_statement}'\n"
    )
    inst = _instance()
    system, user = load_prompt_template(tmp_path / "t.yaml").render(inst)
    assert system["content"] == "Be brief."
    assert user["content"] == f"In /testbed of {inst.repo}: {inst.problem_statement}"
    (tmp_path / "bad.yaml").write_text("user: '{test_patch}'\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*not allowed"):
        load_prompt_template(tmp_path / "bad.yaml")
