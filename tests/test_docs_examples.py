"""Every ```python block of README.md and docs/*.md runs as written and prints what it says.

Each block runs as a script in a fresh interpreter (``python example.py``) whose working
directory is a temporary one holding a copy of the checkout's ``examples/``, with this checkout
first on ``PYTHONPATH`` and ``SANDLOT_BACKEND``/``DEPLOYMENT`` unset (so ``local`` is the
default). The lines it prints must be, in order, the ``# <expected>`` comments of its
``print(...)`` lines, with runs of whitespace collapsed.

A block that needs a part beyond the test extra is marked on the line just above it with
``<!-- example needs: PART -->``:

* ``docker``: a container engine with the test image (``SANDLOT_TEST_IMAGE``);
* ``modal``: the ``modal`` SDK; the block's ``"modal"`` backend is the suite's fake Modal
  (``tests/fakes/fake_modal.py``, commands in local jails): no test reaches a cloud.
* ``kubernetes``: its client; ``$KUBECONFIG`` names the suite's fake API server
  (``tests/fakes/fake_kubernetes.py``, pods in local jails), started for the block.

A missing part skips the block with the reason (a failure under ``CI=true``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from requirements import (
    KUBERNETES,
    MODAL,
    bwrap_missing,
    docker_engine_missing,
    missing,
    module_missing,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
_MARK = re.compile(r"<!-- example needs: (\w+) -->\n\n?\Z")
_EXPECTED = re.compile(r"^\s*print\(.*\)\s*#\s?(.*)$")

# What a part needs here, and the code that runs before the block to provide it.
_PARTS: dict[str, tuple[object, str]] = {
    "docker": (docker_engine_missing, ""),
    "modal": (
        lambda: module_missing("modal", MODAL) or bwrap_missing(),
        textwrap.dedent(
            f"""\
            import os, sys
            sys.path[:0] = [{str(ROOT / "tests")!r}]
            os.environ.setdefault("MODAL_TOKEN_ID", "ak-fake")
            os.environ.setdefault("MODAL_TOKEN_SECRET", "as-fake")
            from fakes.shared import FakeModalSandbox
            from sandlot.sandboxes.registry import register_backend
            register_backend("modal", FakeModalSandbox)
            """
        ),
    ),
    "kubernetes": (
        lambda: module_missing("kubernetes_asyncio", KUBERNETES) or bwrap_missing(),
        textwrap.dedent(
            f"""\
            import atexit, os, sys
            sys.path[:0] = [{str(ROOT / "tests")!r}]
            from fakes.fake_kubernetes import FakeKubernetes
            _cluster = FakeKubernetes().start()
            atexit.register(_cluster.stop)
            os.environ["KUBECONFIG"] = str(_cluster.kubeconfig())
            """
        ),
    ),
}


@dataclass(frozen=True)
class Example:
    where: str  # "docs/x.md:12", the line of the opening fence
    code: str
    part: str | None

    @property
    def expected(self) -> list[str]:
        return [" ".join(m[1].split()) for m in map(_EXPECTED.match, self.code.splitlines()) if m]


def examples(path: Path, root: Path = ROOT) -> list[Example]:
    """The ```python blocks of ``path`` (named relative to ``root``), each with its part."""
    text = path.read_text(encoding="utf-8")
    found = []
    for block in _BLOCK.finditer(text):
        mark = _MARK.search(text, 0, block.start())
        line = text.count("\n", 0, block.start()) + 1
        found.append(Example(f"{path.relative_to(root)}:{line}", block[1], mark and mark[1]))
    return found


ALL = [example for path in DOCS for example in examples(path)]


@pytest.mark.parametrize("example", ALL, ids=lambda e: e.where)
@pytest.mark.e2e
def test_example_runs_and_prints_what_it_says(example: Example, tmp_path: Path) -> None:
    prelude = ""
    if example.part is not None:
        check, prelude = _PARTS[example.part]
        reason = check()  # type: ignore[operator]
        if reason is not None:
            missing(f"{example.where} needs {example.part}: {reason}")
    elif (reason := bwrap_missing()) is not None:
        missing(f"{example.where} runs on the local backend: {reason}")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # a block may build in it
    script = tmp_path / "example.py"
    script.write_text(prelude + example.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("SANDLOT_BACKEND", "DEPLOYMENT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{example.where} failed:\n{done.stdout}\n{done.stderr}"
    printed = [" ".join(line.split()) for line in done.stdout.splitlines() if line.strip()]
    assert printed == example.expected, f"{example.where} printed {done.stdout!r}"


def test_the_extraction_sees_markers_and_expected_output(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "text\n\n```python\nprint(1)  # 1\n```\n\n<!-- example needs: docker -->\n"
        "```python\nx = 2\nprint(x,  x)  #  2 2\n```\n"
    )
    first, second = examples(doc, tmp_path)
    assert (first.where, first.part, first.expected) == ("d.md:3", None, ["1"])
    assert (second.where, second.part, second.expected) == ("d.md:8", "docker", ["2 2"])


def test_every_marker_names_a_known_part() -> None:
    assert {e.part for e in ALL} - {None} <= set(_PARTS)
    assert ALL, "no python block found: the extraction is broken"
