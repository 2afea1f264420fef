"""The package's layers import downward only, lazy imports included.

The order is the chart of ``docs/architecture.md`` ("Layers"): the first word of each line of
the block under its ``<!-- layers: ... -->`` marker, top to bottom. An import inside a function
counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sandlot"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def chart_layers(markdown: str) -> list[str]:
    """The layers of the chart in ``markdown``, bottom first."""
    chart = re.search(r"<!-- layers:.*?-->\n```text\n(.*?)```", markdown, re.S)
    assert chart, "docs/architecture.md lost its layer chart (the block under <!-- layers: -->)"
    return [line.split()[0] for line in chart[1].splitlines() if line.strip()][::-1]


LAYERS = chart_layers(ARCHITECTURE.read_text(encoding="utf-8"))


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
    assert own in LAYERS, f"{rel}: a new top-level module or package needs a line in the chart"
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


def test_the_chart_is_read_bottom_first_and_covers_every_sub_package() -> None:
    doc = "<!-- layers: x -->\n```text\ncli   top\n\nerrors  bottom\n```\n"
    assert chart_layers(doc) == ["errors", "cli"]
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages - set(LAYERS) == set(), "a sub-package is missing from the chart"


# How an instance's sandbox is set up lives beside ``Instance``, so rollout and training open a
# sandbox without importing ``rewards/`` (which imports the set-up from ``datasets/`` in turn).
_SET_UP = {"instance_spec", "instance_environment", "prepare_repo", "hide_future"}


def test_an_instances_sandbox_set_up_is_defined_in_datasets_only() -> None:
    defined = {
        f"{path.relative_to(PACKAGE)}:{node.name}"
        for path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in _SET_UP
    }
    assert {d.split(":")[1] for d in defined} == _SET_UP
    assert all(d.startswith("datasets/") for d in defined), sorted(defined)
