#!/usr/bin/env bash
# Build and install llama-cpp-python 0.3.36 (CPU only) into .venv, for `trtspec bench formats --peers llama.cpp`
# (idempotent; optional: nothing else in trtspec needs it).
#
#   bash scripts/setup-peers.sh                       # into .venv (the venv trtspec runs in)
#   VENV=/path/to/venv bash scripts/setup-peers.sh    # into another venv: the one you run `trtspec` from
#   LLAMA_CPP_SDIST=/tmp/llama_cpp_python-0.3.36.tar.gz bash scripts/setup-peers.sh   # from a downloaded sdist
#
# bench formats runs every peer in a child process of the same interpreter (`sys.executable -m trtspec.bench.peers`),
# so the peer has to be importable from trtspec's own venv: a separate venv would never be seen.
# PyPI has only the sdist of llama-cpp-python, so pip compiles llama.cpp (C/C++; needs gcc/g++ and cmake, ninja if
# present): CPU backend only, llama.cpp's defaults otherwise (GGML_NATIVE for this CPU, OpenMP threads); the llava /
# mtmd library, llama.cpp's tests, examples, tools and server are not built. On this project's 2-core machine the
# build took 9 minutes (8 min of CPU; CMAKE_BUILD_PARALLEL_LEVEL=2, other work running). It is tied to this CPU
# (GGML_NATIVE): on another machine rebuild with FORCE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-$PWD/.venv}"
VERSION=0.3.36
PY="$VENV/bin/python"
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input)

log() { printf 'setup-peers: %s\n' "$*" >&2; }

[ -x "$PY" ] || { log "no venv at $VENV: run scripts/setup.sh first, or set VENV"; exit 1; }
installed="$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)"
if [ "$installed" = "$VERSION" ] && [ "${FORCE:-0}" != 1 ]; then
    log "llama-cpp-python $VERSION: up to date in $VENV"
    exit 0
fi
for tool in cc c++ cmake; do
    command -v "$tool" >/dev/null || { log "llama-cpp-python is built from source and needs $tool"; exit 1; }
done

source="${LLAMA_CPP_SDIST:-llama-cpp-python==$VERSION}"
log "llama-cpp-python $VERSION: building from source into $VENV (several minutes)"
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
[ -z "$installed" ] || "$PY" -m pip uninstall "${PIP_FLAGS[@]}" --yes llama-cpp-python
"$PY" -m pip install "${PIP_FLAGS[@]}" --no-binary llama-cpp-python --no-cache-dir "$source"
"$PY" -c 'import llama_cpp; assert llama_cpp.__version__ == "'"$VERSION"'", llama_cpp.__version__' \
    || { log "llama_cpp does not import as $VERSION after the install"; exit 1; }
log "done in $(( (SECONDS - start) / 60 )) min: llama-cpp-python $VERSION in $VENV"
