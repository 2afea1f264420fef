"""The package's layers import downward only, lazy imports included; so do the rooms of
``sandboxes/``; and no import cycle anywhere in ``sandlot/``.

The order is the chart of ``docs/architecture.md`` ("Layers"): the first word of each line of
the block under its ``<!-- layers: ... -->`` marker, top to bottom. The rooms of ``sandboxes/``
and what each may import are its table under ``<!-- rooms of sandboxes: ... -->``. An import
inside a function or under ``TYPE_CHECKING`` counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _targets(
    path: Path, modules: Mapping[str, Path] = MODULES, name: str | None = None
) -> list[tuple[int, str]]:
    """The modules of ``modules`` that ``path`` (module ``name``) imports, with the line:
    ``from a import b`` names ``a.b`` when that is a module, else ``a`` (relative imports
    resolved)."""
    own = (name or _module_name(path)).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [base])])
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        for target in names:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.append((node.lineno, target))
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


# ------------------------------------------------------------------ the rooms of sandboxes/

SANDBOXES = PACKAGE / "sandboxes"
PROTOCOL = "protocol"  # the room of the modules at the top level of sandboxes/


def rooms_table(markdown: str) -> list[tuple[list[str], set[str], list[str]]]:
    """The rows of the rooms table in ``markdown``: (rooms, rooms they may import, modules)."""
    table = re.search(r"<!-- rooms of sandboxes:.*?-->\n(.*?)\n\n", markdown + "\n\n", re.S)
    assert table, "docs/architecture.md lost its table of the rooms of sandboxes/"
    rows = []
    for line in table[1].splitlines()[2:]:
        room, _, imports, modules = (cell.strip() for cell in line.strip().strip("|").split("|"))

        def names(cell: str) -> list[str]:
            words = re.findall(r"`([\w/]+)/?`", re.sub(r"\([^)]*\)", "", cell))
            return [w.rstrip("/") for w in words] + ([PROTOCOL] if PROTOCOL in cell else [])

        rows.append((names(room), set(names(imports)), names(modules)))
    return rows


ROOMS = rooms_table(ARCHITECTURE.read_text(encoding="utf-8"))
MAY_IMPORT = {room: imports for rooms, imports, _ in ROOMS for room in rooms}


def _room(module: str) -> str | None:
    """The room of a module of ``sandlot.sandboxes`` (``None`` outside it, or its face)."""
    parts = module.split(".")
    if parts[:2] != ["sandlot", "sandboxes"] or len(parts) == 2:
        return None
    return parts[2] if (SANDBOXES / parts[2]).is_dir() else PROTOCOL


def test_every_room_and_module_of_sandboxes_is_in_the_table() -> None:
    folders = {p.name for p in SANDBOXES.iterdir() if (p / "__init__.py").is_file()}
    assert folders | {PROTOCOL} == set(MAY_IMPORT), "a folder of sandboxes/ is not in the table"
    top = sorted(p.stem for p in SANDBOXES.glob("*.py") if p.stem != "__init__")
    assert len(top) + 1 <= 15, f"sandboxes/ holds {len(top) + 1} modules at its top level"
    for rooms, _, modules in ROOMS:
        if len(rooms) == 1:  # the table lists such a room's modules, all of them
            folder = SANDBOXES if rooms[0] == PROTOCOL else SANDBOXES / rooms[0]
            present = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
            assert sorted(modules) == present, f"the table's modules of {rooms[0]}"
        else:  # the backends: those it names exist (each bare one in each backend)
            for name in modules:
                paths = [name] if "/" in name else [f"{room}/{name}" for room in rooms]
                assert all((SANDBOXES / f"{path}.py").is_file() for path in paths), name


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SANDBOXES.rglob("*.py") if p != SANDBOXES / "__init__.py"),
    ids=lambda p: str(p.relative_to(SANDBOXES)),
)
def test_a_room_of_sandboxes_imports_only_the_rooms_its_row_names(path: Path) -> None:
    own = _room(_module_name(path))
    assert own is not None
    wrong = [
        f"line {line}: {module} ({room})"
        for line, module in _targets(path)
        if (room := _room(module)) is not None and room != own and room not in MAY_IMPORT[own]
    ]
    assert not wrong, f"{path.relative_to(SANDBOXES)} ({own}) imports from rooms above it: {wrong}"


def test_the_rooms_table_is_read_as_written() -> None:
    doc = (
        "<!-- rooms of sandboxes: x -->\n| room | question | imports from | modules |\n|-|-|-|-|\n"
        "| `a/` `b/` | ? | protocol, `c/` | `x` (`not_a_module`), `a/y` |\n"
        "| protocol | ? | (none) | `base` |\n\nafter"
    )
    assert rooms_table(doc) == [
        (["a", "b"], {PROTOCOL, "c"}, ["x", "a/y"]),
        ([PROTOCOL], set(), ["base"]),
    ]


# ------------------------------------------------------------------ no cycle in sandlot/


def import_cycle(graph: Mapping[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (node -> the nodes it imports) as a path, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_sandlot_has_no_import_cycle_type_checking_and_lazy_imports_included() -> None:
    graph = {
        module: {target for _, target in _targets(path) if target != module}
        for module, path in MODULES.items()
    }
    cycle = import_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_type_checking_and_relative_imports(tmp_path: Path) -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import n\n")
    modules = {"sandlot.m": module, "sandlot.n": module}
    assert _targets(module, modules, "sandlot.m") == [(3, "sandlot.n")]


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
