"""deploy → the repository writers → deploy_options, one way: the writers and the options never import deploy, and
the options import no writer (each option is checked once, by deploy_options.check_options)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trtspec.triton

TRITON = Path(trtspec.triton.__file__).parent


def _imports(module: str) -> set[str]:
    tree = ast.parse((TRITON / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module,forbidden", [
    ("cpu_repo", {"trtspec.triton.deploy"}),
    ("trtllm_repo", {"trtspec.triton.deploy"}),
    ("deploy_options", {"trtspec.triton.deploy", "trtspec.triton.cpu_repo", "trtspec.triton.trtllm_repo"}),
    ("serving", {"trtspec.triton.deploy"}),
])
def test_deploy_imports_run_one_way(module, forbidden):
    assert not _imports(module) & forbidden


def test_deploy_uses_both_writers_and_the_options():
    assert {"trtspec.triton.cpu_repo", "trtspec.triton.trtllm_repo", "trtspec.triton.deploy_options"} <= \
        _imports("deploy")
