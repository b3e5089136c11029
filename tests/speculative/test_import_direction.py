"""The speculative core is backend-free: it imports nothing from the runtime, model, engine, triton or other
packages of trtspec (the runtime implements its protocols, not the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

import trtspec.speculative

CORE = Path(trtspec.speculative.__file__).parent
# the core itself and the backend-free utilities every package shares
ALLOWED = ("trtspec.speculative", "trtspec.errors", "trtspec.lazy", "trtspec.outdir", "trtspec.progress",
           "trtspec.__version__")


def _trtspec_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] if node.module != "trtspec" else [f"trtspec.{a.name}" for a in node.names]
    return [n for n in names if n == "trtspec" or n.startswith("trtspec.")]


def test_the_speculative_core_imports_no_backend():
    found = {f"{path.relative_to(CORE.parent)}: {name}" for path in sorted(CORE.rglob("*.py"))
             for name in _trtspec_imports(path) if not (name in ALLOWED or name.startswith(tuple(a + "." for a in ALLOWED)))}
    assert not found, "the speculative core imports a backend:\n" + "\n".join(sorted(found))


def test_the_check_sees_a_backend_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from trtspec.runtime.ort_engine import OrtEngine\n")
    assert _trtspec_imports(bad) == ["trtspec.runtime.ort_engine"]
