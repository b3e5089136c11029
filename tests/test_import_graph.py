"""The package import graph (docs/design.md): no two packages of trtspec import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import trtspec

ROOT = Path(trtspec.__file__).parent
SHARED = {"errors", "outdir", "progress", "__version__"}  # leaves every package may use


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trtspec" and len(parts) > 1 else None


def package_graph() -> dict[str, set[str]]:
    """package → the trtspec packages its modules import (any import, lazy ones included)."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).parts
        if len(rel) < 2:  # trtspec/__init__.py and the top-level modules
            continue
        source = rel[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module] if node.module != "trtspec" else [f"trtspec.{a.name}" for a in node.names]
            else:
                continue
            for target in filter(None, map(_package_of, modules)):
                if target != source and target not in SHARED:
                    graph.setdefault(source, set()).add(target)
    return graph


def test_no_two_packages_import_each_other():
    graph = package_graph()
    both = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, ())})
    assert not both, f"packages that import each other: {both}"


def test_the_graph_sees_the_packages_it_checks():
    graph = package_graph()
    assert {"engine", "speculative"} <= graph["runtime"] and "runtime" in graph["triton"]
    assert "speculative" not in graph  # the core imports no other package
