"""trtspec's own ONNX Runtime ops, compiled from C++ at setup: the library that adds the domain com.trtspec to a
session, with TreeAttention (rotary attention over a KV cache and a tree of new slots whose result for a query row
does not depend on the other rows of the call) and AddBlockOffsets (what an int4 product with a minimum per block
adds to MatMulNBits' output, in one op) and BlockMatMul (MatMulNBits' product at accuracy level 4, for a prompt's
many rows: AVX-512 VNNI kernels over weights repacked once).

`bash scripts/setup.sh` builds it (python -m trtspec.native.build) into this package's _build folder for the
machine it runs on; nothing compiles at run time. `register(options)` adds it to an onnxruntime.SessionOptions.
Only numpy-free, onnxruntime-free code here: importing this module costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.errors import NativeLibraryError

if TYPE_CHECKING:
    import onnxruntime

DOMAIN = "com.trtspec"
TREE_ATTENTION = "TreeAttention"
PROMPT_ATTENTION = "PromptAttention"
ADD_BLOCK_OFFSETS = "AddBlockOffsets"
BLOCK_MATMUL = "BlockMatMul"
BLOCK_MATMUL_BLOCK_SIZE = 32  # the only block size BlockMatMul runs (kBlock in block_matmul.cc)
SKIP_RMS_NORM = "SkipRMSNorm"
# every op the library adds to the domain
OPS = (TREE_ATTENTION, PROMPT_ATTENTION, ADD_BLOCK_OFFSETS, BLOCK_MATMUL, SKIP_RMS_NORM)

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("ops.cc", "tree_attention.cc", "prompt_attention.cc", "block_offsets.cc", "block_matmul.cc",
           "skip_rms_norm.cc")
HEADERS = ("ort_abi.h", "op_support.h")
BUILD_DIR = SOURCE_DIR / "_build"
LIBRARY = BUILD_DIR / "libtrtspec_ops.so"
STAMP = BUILD_DIR / "libtrtspec_ops.stamp"  # the fingerprint of the sources, flags and CPU the library was built from
# -march=native: built on the machine that runs it. -fno-fast-math -ffp-contract=off: the op's bit-identity across
# calls rests on every expression being computed as written (no reassociation, no fused multiply-add in one place
# and not another). -fvisibility=hidden: the library exports RegisterCustomOps alone.
COMPILE_FLAGS = ("-std=c++17", "-O3", "-march=native", "-fno-fast-math", "-ffp-contract=off", "-fPIC", "-shared",
                 "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-psabi")
SETUP_HINT = "bash scripts/setup.sh"


def fingerprint() -> str:
    """What the library must have been built from to be current here: the sources, the flags, this CPU's features."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    digest.update(" ".join(COMPILE_FLAGS).encode() + b"\0" + platform.machine().encode() + b"\0")
    digest.update(_cpu_features().encode())
    return digest.hexdigest()


def _cpu_features() -> str:
    """This CPU's feature flags (what -march=native compiles for); "" where /proc/cpuinfo has none."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")


def block_matmul_vectorized() -> bool:
    """Whether this CPU runs BlockMatMul's AVX-512 VNNI kernels (the library is built with -march=native here);
    elsewhere the op runs its portable loop, slower than MatMulNBits."""
    flags = _cpu_features().split()
    return "avx512_vnni" in flags and "avx512f" in flags


def is_built() -> bool:
    """Whether the library exists and was built from the current sources for this CPU."""
    try:
        return LIBRARY.is_file() and STAMP.read_text(encoding="utf-8").strip() == fingerprint()
    except OSError:
        return False


def library_path() -> Path:
    """The built library; NativeLibraryError (saying what to run) when it is missing or stale."""
    if not LIBRARY.is_file():
        raise NativeLibraryError(f"trtspec's native ops are not built ({LIBRARY} is missing): run {SETUP_HINT}")
    if not is_built():
        raise NativeLibraryError(f"trtspec's native ops ({LIBRARY}) were built from other sources or for another "
                                 f"CPU: run {SETUP_HINT}")
    return LIBRARY


def register(options: onnxruntime.SessionOptions) -> None:
    """Add the com.trtspec ops (TreeAttention, AddBlockOffsets) to `options`, for every session created with them."""
    options.register_custom_ops_library(os.fspath(library_path()))
