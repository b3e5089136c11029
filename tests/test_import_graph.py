"""The package import graph (docs/design.md): the packages of trtspec import one another without a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import trtspec

ROOT = Path(trtspec.__file__).parent
SHARED = {"errors", "lazy", "outdir", "progress", "procfs", "__version__"}  # leaves every package may use


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trtspec" and len(parts) > 1 else None


def _targets(node: ast.AST) -> list[str]:
    """The trtspec modules an import statement reaches; `from trtspec import X` is the module X is loaded from
    (a lazy export of trtspec/__init__.py, or a subpackage)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module != "trtspec":
            return [node.module]
        return [trtspec._LAZY.get(a.name, f"trtspec.{a.name}") for a in node.names]
    return []


def package_graph() -> dict[str, set[str]]:
    """package → the trtspec packages its modules import (any import, lazy ones included)."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).parts
        if len(rel) < 2:  # trtspec/__init__.py and the top-level modules
            continue
        source = rel[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in filter(None, map(_package_of, _targets(node))):
                if target != source and target not in SHARED:
                    graph.setdefault(source, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop (a → b → … → a) as the list of its packages, or None when the graph has none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            if (cycle := visit(target, path + [node])) is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start, [])) is not None:
            return cycle
    return None


def test_no_package_reaches_itself_through_the_others():
    cycle = find_cycle(package_graph())
    assert cycle is None, f"import loop between packages: {' → '.join(cycle)}"


def test_the_cycle_finder_finds_a_long_loop_and_passes_a_layered_graph():
    assert find_cycle({"engine": {"model"}, "model": {"runtime"}, "runtime": {"engine"}}) == [
        "engine", "model", "runtime", "engine"]
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"runtime": {"engine", "model"}, "engine": {"model"}, "model": {"checkpoint"}}) is None


def test_the_graph_sees_the_packages_it_checks():
    graph = package_graph()
    assert {"engine", "speculative"} <= graph["runtime"] and "runtime" in graph["triton"]
    assert "model" in graph["engine"] and "checkpoint" in graph["model"]
    assert "speculative" not in graph  # the core imports no other package
    assert set(graph) <= {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}  # packages only
    assert set().union(*graph.values()) <= {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}


def test_the_command_line_imports_packages_not_their_modules():
    """The CLI parses and prints over the library: it imports `trtspec`, a package's public names (`trtspec.bench`,
    `trtspec.engine`, ...: trtspec.lazy) and the shared leaves, never a module inside a package."""
    deep = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node):
                parts = target.split(".")
                if parts[0] == "trtspec" and len(parts) > 2 and parts[1] != "cli":
                    deep.append(f"cli/{path.name}: {target}")
    assert not deep, "the CLI imports modules inside packages:\n" + "\n".join(deep)


def test_no_public_name_of_a_package_is_one_of_its_modules():
    """A lazy export named like a module of its package would be hidden by that module once it is imported."""
    import importlib

    for init in sorted(ROOT.rglob("__init__.py")):
        package = importlib.import_module(".".join(("trtspec", *init.parent.relative_to(ROOT).parts)).rstrip("."))
        modules = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir() if p.is_dir()}
        clashes = set(getattr(package, "__all__", ())) & (modules - {"__init__"})
        assert not clashes, f"{package.__name__} exports names of its own modules: {sorted(clashes)}"

