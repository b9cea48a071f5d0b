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
_ABOVE_DATA_PLANE = ("swarm.control", "swarm.node", "swarm.api", "swarm.member", "swarm.cli",
                     "swarm.commands", "swarm.demo_run", "swarm.local_worker")
SWARM_FORBIDDEN = {
    "swarm/links": _ABOVE_DATA_PLANE,
    "swarm/runtime": _ABOVE_DATA_PLANE,
    "swarm/control": ("swarm.node", "swarm.api", "swarm.member", "swarm.cli", "swarm.commands",
                      "swarm.demo_run", "swarm.local_worker"),
    "swarm/node.py": ("swarm.control.charter", "swarm.control.plane", "swarm.control.machine",
                      "swarm.api", "swarm.member", "swarm.cli", "swarm.commands"),
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
