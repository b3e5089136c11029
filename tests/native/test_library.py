"""The native-ops library around the op: its build at setup, its loader's errors, who may import it, and a fresh
process loading it with the engine's own session options."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import onnxruntime as ort
import pytest

import trtspec
import trtspec.native as native
from trtspec.errors import NativeLibraryError
from trtspec.native import build


def test_setup_built_the_library_for_the_current_sources_and_a_second_build_is_a_no_op():
    assert native.is_built(), "run bash scripts/setup.sh"
    stamp = native.STAMP.read_text()
    assert build.build() is False
    assert native.STAMP.read_text() == stamp


def test_a_missing_library_is_one_error_that_says_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "libtrtspec_ops.so")
    assert not native.is_built()
    with pytest.raises(NativeLibraryError, match=r"is missing\): run bash scripts/setup.sh") as info:
        native.register(ort.SessionOptions())
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_a_library_built_from_other_sources_is_refused(monkeypatch, tmp_path):
    (tmp_path / "libtrtspec_ops.so").write_bytes(b"")
    (tmp_path / "libtrtspec_ops.stamp").write_text("0" * 64)
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "libtrtspec_ops.so")
    monkeypatch.setattr(native, "STAMP", tmp_path / "libtrtspec_ops.stamp")
    with pytest.raises(NativeLibraryError, match="built from other sources or for another CPU: run bash scripts"):
        native.library_path()


def test_a_failing_compiler_is_one_line_naming_its_first_error(monkeypatch, tmp_path, capsys):
    compiler = tmp_path / "broken-g++"
    compiler.write_text("#!/bin/sh\necho 'note: something' >&2\necho 'x.cc:1: error: nope' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv(build.COMPILER_ENV, str(compiler))
    monkeypatch.setattr(build, "BUILD_DIR", tmp_path / "out")
    monkeypatch.setattr(build, "LIBRARY", tmp_path / "out" / "lib.so")
    monkeypatch.setattr(sys, "argv", ["build", "--force"])
    assert build.main() == 1
    err = capsys.readouterr().err
    assert err.strip() == f"cannot build trtspec's native ops: {compiler} failed: x.cc:1: error: nope"
    assert list((tmp_path / "out").iterdir()) == []  # no half-written library left behind


def test_the_speculative_core_does_not_import_the_native_ops():
    root = Path(trtspec.__file__).parent / "speculative"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("trtspec.native") for n in names), path


def test_a_fresh_process_with_the_engines_session_options_loads_the_op_and_keeps_its_bits():
    """A new interpreter (nothing loaded before), the engine's options: 2 intra-op threads, spinning workers,
    denormals flushed to zero. A 5-slot tree's last slot equals the same token decoded one slot at a time."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        import test_tree_attention as t
        import onnxruntime as ort
        from trtspec.model.ort_session import session_options
        from trtspec.native import register
        from trtspec.model.tree_attention_graph import SMOLLM2, tree_attention_model
        options = session_options(threads=2, spin=True)
        register(options)
        session = ort.InferenceSession(tree_attention_model(SMOLLM2).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(5)
        parents = [-1, 0, 0, 2, 3]
        feeds = t.make_feeds(SMOLLM2, rng, [51], [parents])
        feeds["past_key"] *= 40  # scores ~100 apart: exp() of the lowest is denormal (flushed to zero here)
        attn, _, _ = t.run(session, feeds)
        for slot in range(5):
            row, _ = t.chain_rows(session, feeds, 0, parents, slot)
            assert np.array_equal(attn[0, slot], row), slot
        print("ok", ort.__version__)
    """)
    result = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok ")


@pytest.mark.slow
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_builds_for_older_cpus_keep_every_ops_test(tmp_path, march):
    """The setup compiles for the machine (-march=native: AVX-512 here). A CPU with AVX2, FMA and F16C (x86-64-v3)
    compiles the 256-bit paths, one with neither FMA nor F16C (x86-64-v2) the separate multiply and add and the
    software half conversion (and BlockMatMul its portable loop): each such build passes every op's own tests (numbers, bit-identical rows, errors) in
    a fresh process, with the library of that build in place of the setup's."""
    import platform
    import shutil

    if platform.machine() != "x86_64" or shutil.which("g++") is None:
        pytest.skip("the -march levels are x86-64's; needs g++")
    flags = [f"-march={march}" if flag == "-march=native" else flag for flag in native.COMPILE_FLAGS]
    library = tmp_path / "libtrtspec_ops.so"
    subprocess.run(["g++", *flags, "-o", str(library), *(str(native.SOURCE_DIR / s) for s in native.SOURCES)],
                   check=True, capture_output=True)
    run = textwrap.dedent("""
        import sys, pytest, trtspec.native as native
        library, loaded = sys.argv[1], []
        native.library_path = lambda: library
        native.register = lambda options: (loaded.append(library), options.register_custom_ops_library(library))
        code = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]])
        sys.exit(code or (0 if loaded else 3))  # 3: no session loaded this build
    """)
    tests = Path(__file__).parent
    result = subprocess.run([sys.executable, "-c", run, str(library), str(tests / "test_tree_attention.py"),
                             str(tests / "test_block_offsets.py"), str(tests / "test_block_matmul.py")],
                            capture_output=True, text=True,
                            cwd=Path(trtspec.__file__).parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout and "error" not in result.stdout.lower()
