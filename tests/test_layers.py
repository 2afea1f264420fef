"""The package's layers import downward only (DESIGN.md, "Layers"), lazy imports included.

From the bottom: the I/O-free leaves (``sandlot.errors``, ``sandlot.result``,
``sandlot._optional``), ``runtimes/`` (what runs inside a sandbox; knows no backend),
``images/`` (container images pulled and unpacked for ``local``), ``sandboxes/``, ``testing/``
(simulated sandboxes), ``tools/``, ``datasets/``, ``rewards/``, ``rollout/``, ``trainer/``,
``cli/``. An import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sandlot"
LAYERS = [
    "errors",
    "result",
    "_optional",
    "runtimes",
    "images",
    "sandboxes",
    "testing",
    "tools",
    "datasets",
    "rewards",
    "rollout",
    "trainer",
    "cli",
]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "sandlot" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.stem in LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_climbs_a_layer(path: Path) -> None:
    rel = path.relative_to(PACKAGE)
    own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    assert own in LAYERS, f"{rel}: a new top-level module or package needs a place in LAYERS"
    upward = [
        f"line {line}: {module}"
        for line, module in _imports(path)
        if (other := _layer(module)) in LAYERS and LAYERS.index(other) > LAYERS.index(own)
    ]
    assert not upward, f"{rel} ({own}) imports from a higher layer: {upward}"


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from sandlot.sandboxes.base import Sandbox\n")
    assert [m for _, m in _imports(module) if _layer(m) == "sandboxes"] == [
        "sandlot.sandboxes.base"
    ]
