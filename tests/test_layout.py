"""The project's layout and layering rules (DESIGN.md: imports point down only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

REQUIRED = ["pyproject.toml", "swarm", "dht", "identity", "compute", "tests",
            "PLAN-SwarmOwnership.md", "README.md", "docs/architecture.md", ".ci/run"]

# package -> top-level swarm packages it must never import
FORBIDDEN = {
    "compute": {"swarm", "dht", "identity"},
    "dht": {"swarm", "compute"},
    "identity": {"swarm", "dht", "compute"},
    "models": {"swarm", "dht", "identity"},  # numpy and compute only
}


@pytest.mark.parametrize("path", REQUIRED)
def test_required_layout(path):
    assert (ROOT / path).exists(), f"{path} is part of the required layout"


def _imported_tops(py: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(py.read_text(), str(py))):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_downwards_only(package):
    for py in (ROOT / package).rglob("*.py"):
        bad = _imported_tops(py) & FORBIDDEN[package]
        assert not bad, f"{py.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_pickle_or_eval_anywhere():
    """Invariant 5: no code or pickle from the network. Nothing in the tree may use them."""
    for package in ("swarm", "dht", "identity", "compute", "models"):
        for py in (ROOT / package).rglob("*.py"):
            tree = ast.parse(py.read_text(), str(py))
            assert not ({"pickle", "marshal", "shelve", "dill"} & _imported_tops(py)), py
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    assert node.func.id not in {"eval", "exec"}, f"{py}: {node.func.id}()"


# inside swarm/: module prefix -> swarm modules it must never import (DESIGN.md target layout:
# links and runtime below the control plane, the node below the charter, commands on top)
_ABOVE_DATA_PLANE = ("swarm.control", "swarm.node", "swarm.api", "swarm.processes", "swarm.cli",
                     "swarm.commands")
SWARM_FORBIDDEN = {
    "swarm/links": _ABOVE_DATA_PLANE,
    "swarm/runtime": _ABOVE_DATA_PLANE,
    "swarm/control": ("swarm.node", "swarm.api", "swarm.processes", "swarm.cli", "swarm.commands"),
    # the node and the control plane meet through two typed interfaces, node.ControlHooks
    # (the plane, as the node calls it) and control.plane.ControlledNode (the node, as the
    # plane uses it): the node imports nothing of the control plane (member records are
    # swarm.members, below both)
    "swarm/node.py": ("swarm.control", "swarm.api", "swarm.processes", "swarm.cli",
                      "swarm.commands"),
    "swarm/members.py": ("swarm.control", "swarm.node", "swarm.links", "swarm.runtime"),
    "swarm/processes": ("swarm.cli", "swarm.commands"),
}


def _imported_modules(py: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(py.read_text(), str(py))):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
            mods |= {f"{node.module}.{a.name}" for a in node.names}
    return mods


@pytest.mark.parametrize("where", sorted(SWARM_FORBIDDEN))
def test_layers_inside_swarm(where):
    target = ROOT / where
    files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    assert files, f"{where} is missing"
    for py in files:
        bad = {m for m in _imported_modules(py)
               if any(m == f or m.startswith(f + ".") for f in SWARM_FORBIDDEN[where])}
        assert not bad, f"{py.relative_to(ROOT)} imports {sorted(bad)} (a layer above it)"


def test_the_product_never_imports_the_testing_package():
    """swarm/testing drives the product's cores (the simulator); nothing in the product may
    lean on it, so that the product ships and runs without it."""
    for py in sorted((ROOT / "swarm").rglob("*.py")):
        if py.is_relative_to(ROOT / "swarm" / "testing"):
            continue
        bad = {m for m in _imported_modules(py) if m == "swarm.testing"
               or m.startswith("swarm.testing.")}
        assert not bad, f"{py.relative_to(ROOT)} imports {sorted(bad)}"


# The whole map (issue 36). Every product module stands on one floor, bottom first; a module
# is on the floor of the longest prefix that names it. An import, wherever it stands (inside a
# function or under TYPE_CHECKING too), runs down or sideways, never up, and no modules import
# each other in a loop, so that each package can be read and tested from the floor below it.
FLOORS: list[tuple[str, ...]] = [
    ("compute", "identity"),
    ("dht", "models"),
    ("swarm", "swarm.errors", "swarm.netaddr", "swarm.wire", "swarm.uri", "swarm.config",
     "swarm.loop", "swarm.members", "swarm.records"),
    ("swarm.links",),
    ("swarm.runtime",),
    ("swarm.control",),
    ("swarm.web", "swarm.testing"),
    ("swarm.node",),
    ("swarm.api", "swarm.processes", "swarm.executor", "swarm.embedding",
     "swarm.spans", "swarm.training"),
    ("swarm.commands",),
    ("swarm.cli", "swarm.__main__"),
]
PRODUCT = ("compute", "dht", "identity", "models", "swarm")
# Imports that still run up. The test fails once one of them is gone, so that this list only
# shrinks (the last ones, commands -> cli for exit codes, went with EXIT_* to swarm.errors).
STILL_UPWARD: set[tuple[str, str]] = set()


def _product_modules() -> dict[str, Path]:
    mods = {}
    for package in PRODUCT:
        for py in sorted((ROOT / package).rglob("*.py")):
            parts = list(py.relative_to(ROOT).with_suffix("").parts)
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = py
    return mods


def _import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports (`from a import b` names a.b when that is a
    module, else a); relative imports resolved; every import in the file counts."""
    mods = _product_modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, py in mods.items():
        here = mod.split(".") if py.name == "__init__.py" else mod.split(".")[:-1]
        names = set()
        for node in ast.walk(ast.parse(py.read_text(), str(py))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                names |= {f"{base}.{a.name}" for a in node.names}
        graph[mod] = {m for m in map(owner, names) if m and m != mod}
    return graph


def _floor(mod: str) -> int | None:
    best = None
    for level, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), level)
    return best and best[1]


def test_every_module_stands_on_a_floor():
    unplaced = sorted(m for m in _product_modules() if _floor(m) is None)
    assert not unplaced, f"give these a floor in FLOORS: {unplaced}"


def test_no_import_runs_up_a_floor():
    upward = {(a, b) for a, outs in _import_graph().items() for b in outs
              if _floor(b) > _floor(a)}
    assert upward - STILL_UPWARD == set(), "imports that run up a floor"
    assert STILL_UPWARD <= upward, f"gone, strike from STILL_UPWARD: {STILL_UPWARD - upward}"


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            loop = []
            while not loop or loop[-1] != v:
                loop.append(stack.pop())
            if len(loop) > 1:
                loops.append(sorted(loop))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def test_no_modules_import_each_other_in_a_loop():
    assert not _loops(_import_graph()), "modules that import each other"


def test_no_packages_import_each_other_in_a_loop():
    """A package is a folder (the modules directly in swarm/ each count as one); the imports in
    STILL_UPWARD, which close the one loop left (cli <-> commands), are told apart above."""
    mods = _product_modules()

    def package(mod: str) -> str:
        py = mods[mod]
        if py.name == "__init__.py" or py.parent == ROOT / "swarm":
            return mod
        return mod.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for a, outs in _import_graph().items():
        graph.setdefault(package(a), set()).update(
            package(b) for b in outs if (a, b) not in STILL_UPWARD)
    for node, outs in graph.items():
        outs.discard(node)
    assert not _loops(graph), "packages that import each other"


@pytest.mark.parametrize("module", ["swarm/spans.py", "swarm/embedding.py", "swarm/executor.py"])
def test_verified_work_uses_only_the_clients_public_api(module):
    """swarm.spans, swarm.embedding and swarm.executor sit below swarm.api and take a client
    as ``Any``: reaching into its privates (``_loop``, ``_resolve``, ``_instances``, ...) was
    an upward dependency the import graph could not see (architecture review, section 3)."""
    tree = ast.parse((ROOT / module).read_text(), module)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "client") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "_client"):
                bad.append(f"{module}:{node.lineno} .{node.attr}")
    assert not bad, bad
