"""Every output file name README.md and docs/*.md mention is one the code writes.

A doc name is any token of an inline code span or a fenced block whose last path component
ends in an output extension (:data:`EXTENSIONS`). The names the code writes are read from it:
the string literals of ``sandlot/`` that are a whole file name (``"report.json"``,
``f"{model}.{run_id}.json"``), and the names ``sandlot data prepare`` gives each dataset
(``<stem>_<backend>.parquet`` for each preprocessor and backend it supports, the stem's
``{split}`` any split). A name passes when

* it is one of those, exactly, or a prepared dataset's name;
* it has placeholders (``<model>.<run-id>.json``, ``*.jsonl``) and, with each placeholder
  made ``{}``, is a template the code writes (or ends in a suffix it appends, ``.rejected.jsonl``);
* the checkout ships a file of that name (the examples' inputs);
* it is in :data:`INPUTS`: files the user or another tool provides, each with its reason.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
from pathlib import Path

import pytest

from sandlot.cli.data_cmd import PREPROCESSORS
from sandlot.datasets.prepare import Preprocessor

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTENSIONS = ("json", "jsonl", "log", "parquet", "html", "txt")

INPUTS = {
    "preds.jsonl": "the user's predictions (README's eval example)",
    "rows.jsonl": "the user's own SWE-bench-style rows (README's --repo-mirror example)",
    "a.jsonl": "the user's predictions (docs/groups.md)",
    "b.jsonl": "the user's predictions (docs/groups.md)",
    "train.parquet": "the user's training rows",
    "rows.parquet": "the user's rows (docs/datasets.md's selftest example)",
    "kept.parquet": "the file the user names with `sandlot data selftest --output`",
    "r2e_subset.parquet": "a user's export of a source dataset (--input)",
    "torch-pin.txt": "a pip constraints file the user writes",
    "gpu.txt": "a pip requirements file the user writes",
    "hello.txt": "a file an example writes inside a sandbox",
    "auth.json": "the container tools' registry logins",
    "config.json": "Docker's client configuration and a model directory's",
    "default.json": "moby's seccomp profile",
    "entry_points.txt": "a Python distribution's metadata",
}

_NAME = re.compile(r"[\w.<>{}*-]+\.(?:" + "|".join(EXTENSIONS) + r")")
_PLACEHOLDER = re.compile(r"<[^<>]+>|\{[^{}]*\}|\*")


@functools.cache
def _doc_names() -> dict[str, set[str]]:
    """File-like names in code spans and fenced blocks of the docs -> the docs naming them."""
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        fenced = re.findall(r"```.*?```", text, re.S)
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for span in [*fenced, *inline]:
            # A placeholder may hold spaces (`<run id>.jsonl`): make them one token first.
            span = re.sub(r"<[^<>\n]+>", lambda m: m.group().replace(" ", "-"), span)
            for token in re.split(r"[\s`'\"(),=\[\]|]+", span):
                name = token.rstrip(":.;").rpartition("/")[2]
                if _NAME.fullmatch(name):
                    found.setdefault(name, set()).add(doc.name)
    return found


@functools.cache
def _code_names() -> tuple[set[str], set[str]]:
    """Whole-file-name string literals of ``sandlot/``: exact names, and templates (each
    f-string field ``{}``) with the bare suffixes (``".rejected.jsonl"``)."""
    exact: set[str] = set()
    templates: set[str] = set()
    for path in (ROOT / "sandlot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(
                    v.value if isinstance(v, ast.Constant) else "{}" for v in node.values
                )
                if _NAME.fullmatch(text):
                    templates.add(text)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _NAME.fullmatch(node.value)
            ):
                (templates if node.value.startswith(".") else exact).add(node.value)
    return exact, templates


@functools.cache
def _prepared_patterns() -> list[re.Pattern[str]]:
    """The names ``sandlot data prepare`` writes, one pattern per preprocessor."""
    patterns = []
    for module in PREPROCESSORS.values():
        pre: Preprocessor = importlib.import_module(module).PREPROCESSOR
        stem = re.escape(pre.output_stem).replace(r"\{split\}", r"[A-Za-z0-9-]+")
        backends = "|".join(pre.backends)
        patterns.append(re.compile(rf"{stem}_(?:{backends})\.parquet"))
    return patterns


@functools.cache
def _shipped() -> set[str]:
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {f.rpartition("/")[2] for f in files}


def _written(name: str, exact: set[str], templates: set[str]) -> bool:
    if name in exact or any(p.fullmatch(name) for p in _prepared_patterns()):
        return True
    generic = _PLACEHOLDER.sub("{}", name)
    if generic == name:
        return False
    return generic in templates or any(
        t.startswith(".") and generic.endswith(t) and generic != t for t in templates
    )


def test_the_code_names_its_outputs() -> None:
    # The check below is only as good as this: the names it knows must include the outputs.
    exact, templates = _code_names()
    assert {"report.json", "run_instance.log", "predictions.jsonl", "trajectories.jsonl"} <= exact
    assert "{}_{}.parquet" in templates


@pytest.mark.parametrize("name", sorted(_doc_names()))
def test_a_file_name_in_the_docs_is_one_the_code_writes(name: str) -> None:
    exact, templates = _code_names()
    where = ", ".join(sorted(_doc_names()[name]))
    assert _written(name, exact, templates) or name in _shipped() or name in INPUTS, (
        f"{where} name `{name}`, which no code writes: fix the docs, or the code's name "
        "(an input the user provides goes in INPUTS, with its reason)"
    )
