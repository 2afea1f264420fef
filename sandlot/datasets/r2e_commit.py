"""Render the gold patch of an R2E-Gym row from its ``parsed_commit_content``.

R2E-Gym stores each commit as the JSON of its ``ParsedCommit`` model
(``r2egym/commit_models/diff_classes.py`` in github.com/R2E-Gym/R2E-Gym)::

    {"old_commit_hash": str, "new_commit_hash": str, "commit_message": str, ...,
     "file_diffs": [{
        "header": {"file": {"path": str}, "misc_line": str | null},
        "index_line": {"old_commit_hash": str, "new_commit_hash": str, "mode": str} | null,
        "is_binary_file": bool, "binary_line": str | null,
        "minus_file": {"path": str} | null, "plus_file": {"path": str} | null,
        "hunks": [{"descriptor": {"old_range": {"start": int, "length": int | null},
                                  "new_range": {...}, "section": str},
                   "line_group": {"all_lines": [{"content": str,
                                                 "type": "context|added|deleted|note"}]}}],
        "old_file_content": str, "new_file_content": str}]}

:func:`gold_patch` reproduces R2E-Gym's gold patch, ``ParsedCommit.get_patch(test_file=False,
non_test_file=True)`` with its default ``only_python=True``: the diffs of the commit's Python
files that are not test files by ``FileDiff.is_test_file`` (the file name starts with ``test_``
or ends with ``_test.py``, or a directory is named ``test``, ``tests``, ``Test`` or ``Tests``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_PREFIX = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def is_test_file(path: str) -> bool:
    """R2E-Gym's ``FileDiff.is_test_file``."""
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or parts[-1].startswith("test_")
        or any(p in ("tests", "Tests", "test", "Test") for p in parts)
    )


def gold_patch(commit: Mapping[str, Any]) -> str:
    """The unified diff of the commit's non-test Python files.

    Raises:
        KeyError, TypeError: ``commit`` does not have the ``ParsedCommit`` shape.
    """
    patch = ""
    for diff in commit["file_diffs"]:
        path = diff["header"]["file"]["path"]
        if path.endswith(".py") and not is_test_file(path):
            patch += _file_patch(diff, path)
    return patch


def _file_patch(diff: Mapping[str, Any], path: str) -> str:
    out = f"diff --git a/{path} b/{path}\n"
    if diff["header"].get("misc_line"):
        out += diff["header"]["misc_line"] + "\n"
    index = diff.get("index_line")
    if index:
        mode = index.get("mode") or ""
        out += f"index {index['old_commit_hash']}..{index['new_commit_hash']}"
        out += f" {mode}\n" if mode else "\n"
    if diff.get("is_binary_file"):
        out += f"{diff['binary_line']}\n"
    if diff.get("minus_file") and diff.get("plus_file"):
        out += f"--- {diff['minus_file']['path']}\n+++ {diff['plus_file']['path']}\n"
    for hunk in diff.get("hunks") or []:
        desc = hunk["descriptor"]
        out += f"@@ -{_range(desc['old_range'])} +{_range(desc['new_range'])} @@"
        out += f" {desc['section']}\n" if desc.get("section") else "\n"
        for line in hunk["line_group"]["all_lines"]:
            out += f"{_PREFIX[line['type']]}{line['content']}\n"
    return out


def _range(r: Mapping[str, Any]) -> str:
    return f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"
