"""Tiny SWE-bench-style rows and the bare mirrors of their repositories, made at test time.

Two repositories, ``acme/alpha`` and ``acme/beta``, each one commit with a bug, a test runner
that prints pytest-style ``PASSED``/``FAILED`` lines (graded with ``parse_log_pytest``, so no
package has to be installed) and rows without ``repo_source`` or ``image``, as a user brings
them. :func:`make_mirrors` lays the mirrors out as ``git clone --mirror`` names them:
``acme__alpha.git`` in the directory, ``acme__beta`` a symlink to a mirror kept elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

RUNNER = """\
import importlib, sys
sys.path.insert(0, ".")
module = importlib.import_module("test_calc")
for name in sorted(n for n in dir(module) if n.startswith("test_")):
    try:
        getattr(module, name)()
        print("PASSED test_calc.py::" + name)
    except Exception:
        print("FAILED test_calc.py::" + name)
"""

PROJECTS = {  # name: (function, buggy line, fixed line, the check of the fix)
    "alpha": ("add", "return a - b", "return a + b", "add(2, 3) == 5"),
    "beta": ("mul", "return a + b", "return a * b", "mul(2, 3) == 6"),
}


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def fix(function: str, old: str, new: str) -> str:
    """The diff of ``calc.py`` (``def function(a, b):`` then ``old``) replacing ``old``."""
    return (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n"
        f"@@ -1,2 +1,2 @@\n def {function}(a, b):\n-    {old}\n+    {new}\n"
    )


def make_mirrors(root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Build both repositories under ``root``, their bare mirrors, and the rows.

    Returns:
        The mirror directory and the rows (``alpha-1`` and ``beta-1``, with gold patches).
    """
    mirrors, elsewhere, work = root / "mirrors", root / "elsewhere", root / "work"
    for d in (mirrors, elsewhere, work):
        d.mkdir(parents=True)
    rows = []
    for name, (function, old, new, check) in PROJECTS.items():
        repo = work / name
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
        (repo / "calc.py").write_text(f"def {function}(a, b):\n    {old}\n")
        (repo / "run_tests.py").write_text(RUNNER)
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", "initial")
        base = _git(repo, "rev-parse", "HEAD")
        target = mirrors / f"acme__{name}.git" if name == "alpha" else elsewhere / f"{name}.git"
        _git(root, "clone", "-q", "--mirror", str(repo), str(target))
        if name == "beta":
            (mirrors / f"acme__{name}").symlink_to(target)
        test = f"from calc import *\n\n\ndef test_fixed():\n    assert {check}\n"
        test_patch = (
            "diff --git a/test_calc.py b/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/test_calc.py\n@@ -0,0 +1,{test.count(chr(10))} @@\n"
            + "".join(f"+{line}\n" for line in test.splitlines())
        )
        rows.append(
            {
                "instance_id": f"acme__{name}-1",
                "repo": f"acme/{name}",
                "base_commit": base,
                "patch": fix(function, old, new),
                "test_patch": test_patch,
                "FAIL_TO_PASS": json.dumps(["test_calc.py::test_fixed"]),
                "PASS_TO_PASS": "[]",
                "version": "1.0",
                "test_cmd": "python3 run_tests.py",
                "log_parser": "parse_log_pytest",
                "eval_timeout": 60,
            }
        )
    return mirrors, rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as JSONL at ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def wrong_predictions(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``alpha``'s gold patch and a ``beta`` patch that changes the line without fixing it."""
    alpha, beta = rows
    wrong = fix("mul", "return a + b", "return a - b")
    preds = [
        {
            "instance_id": alpha["instance_id"],
            "model_name_or_path": "mixed",
            "model_patch": alpha["patch"],
        },
        {"instance_id": beta["instance_id"], "model_name_or_path": "mixed", "model_patch": wrong},
    ]
    return write_rows(path, preds)
