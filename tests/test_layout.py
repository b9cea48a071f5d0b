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
    for package in ("swarm", "dht", "identity", "compute"):
        for py in (ROOT / package).rglob("*.py"):
            tree = ast.parse(py.read_text(), str(py))
            assert not ({"pickle", "marshal", "shelve", "dill"} & _imported_tops(py)), py
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    assert node.func.id not in {"eval", "exec"}, f"{py}: {node.func.id}()"
