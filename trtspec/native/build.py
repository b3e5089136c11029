"""Compile trtspec's native ONNX Runtime ops for this machine: `python -m trtspec.native.build` (scripts/setup.sh
runs it). Skips when the library is current; writes it atomically (a temporary file renamed into place), so a
session never loads half a library; prints one line either way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from trtspec.errors import NativeLibraryError
from trtspec.native import BUILD_DIR, COMPILE_FLAGS, HEADERS, LIBRARY, SOURCE_DIR, SOURCES, STAMP, fingerprint, is_built

COMPILER_ENV = "CXX"  # the C++ compiler to use (default g++)


def build(force: bool = False) -> bool:
    """Build the library unless it is current (or `force`). True when it compiled. NativeLibraryError (one line,
    with the compiler's first error) when there is no compiler or the compile fails."""
    if not force and is_built():
        return False
    compiler = os.environ.get(COMPILER_ENV, "g++")
    if shutil.which(compiler) is None:
        raise NativeLibraryError(f"cannot build trtspec's native ops: no C++ compiler {compiler!r} on PATH "
                                 f"(install g++, or set {COMPILER_ENV})")
    BUILD_DIR.mkdir(exist_ok=True)
    stamp = fingerprint()
    fd, partial = tempfile.mkstemp(prefix=f".{LIBRARY.name}.", dir=BUILD_DIR)
    os.close(fd)
    try:
        command = [compiler, *COMPILE_FLAGS, "-o", partial, *(str(SOURCE_DIR / s) for s in SOURCES)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
            raise NativeLibraryError(f"cannot build trtspec's native ops: {compiler} failed: "
                                     f"{errors[0].strip() if errors else f'exit {result.returncode}'}")
        os.chmod(partial, 0o755)
        os.replace(partial, LIBRARY)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    STAMP.write_text(stamp + "\n", encoding="utf-8")
    return True


def main() -> int:
    try:
        built = build(force="--force" in sys.argv[1:])
    except NativeLibraryError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"trtspec native ops: {'built' if built else 'up to date'}: {LIBRARY} "
          f"({', '.join(SOURCES + HEADERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
