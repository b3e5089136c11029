#!/usr/bin/env bash
# Install the optional peers of `trtspec bench ENGINE... --peers` (idempotent;
# nothing else in trtspec needs them, and scripts/setup.sh never installs them):
#   llama.cpp  llama-cpp-python 0.3.36 (CPU only), built from source into .venv
#   openvino   OpenVINO GenAI 2026.4.1 (openvino, openvino-tokenizers, openvino-genai) into .venv, and its model
#              exporter, optimum-intel 2.2.0 with nncf 3.4.0 (`optimum-cli export openvino`), into a venv of its own,
#              .venv-tools/openvino-export (see below)
#
#   bash scripts/setup-peers.sh                       # both, into .venv (the venv trtspec runs in)
#   PEERS=openvino bash scripts/setup-peers.sh        # one of them: PEERS=openvino or PEERS=llama.cpp
#   VENV=/path/to/venv bash scripts/setup-peers.sh    # into another venv: the one you run `trtspec` from
#   LLAMA_CPP_SDIST=/tmp/llama_cpp_python-0.3.36.tar.gz bash scripts/setup-peers.sh   # from a downloaded sdist
#   FORCE=1 bash scripts/setup-peers.sh               # again, even where up to date (llama.cpp: on another CPU)
#
# The benches run every peer in a child process of the same interpreter (`sys.executable -m trtspec.bench.peers`),
# so a peer has to be importable from trtspec's own venv: a separate venv would never be seen.
#
# llama.cpp: PyPI has only the sdist of llama-cpp-python, so pip compiles llama.cpp (C/C++; needs gcc/g++ and cmake,
# ninja if present): CPU backend only, llama.cpp's defaults otherwise (GGML_NATIVE for this CPU, OpenMP threads); the
# llava / mtmd library, llama.cpp's tests, examples, tools and server are not built. On this project's 2-core machine
# the build took 9 minutes (8 min of CPU; CMAKE_BUILD_PARALLEL_LEVEL=2, other work running). It is tied to this CPU
# (GGML_NATIVE): on another machine rebuild with FORCE=1.
#
# openvino: the runtime wheels add only themselves and openvino-telemetry to .venv; every package already there is
# pinned at its installed version for that install (a constraints file from `pip freeze`), so pip never replaces
# torch, transformers or numpy. The exporter cannot live in .venv: optimum-intel 2.2.0, the newest, declares
# transformers < 5.6 and huggingface-hub < 1.22 (and fails to import with transformers 5.25: its visual-language module
# imports a name transformers no longer has), so in .venv it would downgrade transformers, tokenizers and
# huggingface-hub, which trtspec runs on. The bench runs the exporter as a command (.venv-tools/openvino-export/bin/
# optimum-cli), once per model and weight format, so it gets a venv of its own holding a set that works together:
# transformers 5.5.4, tokenizers 0.22.2, huggingface-hub 1.21.0, and torch at .venv's exact version (the same wheel,
# never another build: a looser pin would pull a multi-GB CUDA build). torchvision is left out: optimum-intel declares
# it for its vision models only, and a torchvision built for another torch breaks transformers' import.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="${VENV:-$ROOT/.venv}"
PEERS="${PEERS:-llama.cpp,openvino}"
PY="$VENV/bin/python"
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input)

LLAMA_CPP_VERSION=0.3.36
OPENVINO_VERSION=2026.4.1
OPENVINO_GENAI_VERSION=2026.4.1.0  # openvino-genai and openvino-tokenizers: the same release as openvino
OPENVINO_RUNTIME=("openvino==$OPENVINO_VERSION" "openvino-tokenizers==$OPENVINO_GENAI_VERSION"
                  "openvino-genai==$OPENVINO_GENAI_VERSION")
EXPORT_VENV="$ROOT/.venv-tools/openvino-export"
OPTIMUM_INTEL="optimum-intel==2.2.0"  # installed without its dependencies: the rest of its list below, less torchvision
EXPORT_REQUIREMENTS=("optimum==2.3.0" "nncf==3.4.0" "transformers==5.5.4" "tokenizers==0.22.2"
                     "huggingface-hub==1.21.0" "requests>=2.33,<3" "setuptools" "openvino==$OPENVINO_VERSION"
                     "openvino-tokenizers==$OPENVINO_GENAI_VERSION")

log() { printf 'setup-peers: %s\n' "$*" >&2; }

# ---- llama.cpp ------------------------------------------------------------------------------------------------
setup_llama_cpp() {
    local installed source start
    installed="$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)"
    if [ "$installed" = "$LLAMA_CPP_VERSION" ] && [ "${FORCE:-0}" != 1 ]; then
        log "llama-cpp-python $LLAMA_CPP_VERSION: up to date in $VENV"
        return
    fi
    for tool in cc c++ cmake; do
        command -v "$tool" >/dev/null || { log "llama-cpp-python is built from source and needs $tool"; exit 1; }
    done
    source="${LLAMA_CPP_SDIST:-llama-cpp-python==$LLAMA_CPP_VERSION}"
    log "llama-cpp-python $LLAMA_CPP_VERSION: building from source into $VENV (several minutes)"
    export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF ${CMAKE_ARGS:-}"
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
    start=$SECONDS
    [ -z "$installed" ] || "$PY" -m pip uninstall "${PIP_FLAGS[@]}" --yes llama-cpp-python
    "$PY" -m pip install "${PIP_FLAGS[@]}" --no-binary llama-cpp-python --no-cache-dir "$source"
    "$PY" -c 'import llama_cpp; assert llama_cpp.__version__ == "'"$LLAMA_CPP_VERSION"'", llama_cpp.__version__' \
        || { log "llama_cpp does not import as $LLAMA_CPP_VERSION after the install"; exit 1; }
    log "llama-cpp-python $LLAMA_CPP_VERSION: done in $(( (SECONDS - start) / 60 )) min, in $VENV"
}

# ---- openvino -------------------------------------------------------------------------------------------------
# the runtime, into the venv trtspec runs in; every package already there held at its version
setup_openvino_runtime() {
    local installed constraints torch_before
    installed="$("$PY" -c 'import openvino_genai; print(openvino_genai.__version__.split("-")[0])' 2>/dev/null || true)"
    if [ "$installed" = "$OPENVINO_GENAI_VERSION" ] && [ "${FORCE:-0}" != 1 ]; then
        log "openvino-genai $OPENVINO_GENAI_VERSION: up to date in $VENV"
        return
    fi
    log "openvino $OPENVINO_VERSION, openvino-tokenizers and openvino-genai $OPENVINO_GENAI_VERSION: into $VENV"
    constraints="$(mktemp)"
    "$PY" -m pip freeze --exclude-editable --disable-pip-version-check \
        | grep -E '^[A-Za-z0-9_.-]+==' | grep -v -i -E '^(openvino|openvino-tokenizers|openvino-genai)==' \
        >"$constraints" || true
    torch_before="$("$PY" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p')"
    "$PY" -m pip install "${PIP_FLAGS[@]}" -c "$constraints" "${OPENVINO_RUNTIME[@]}" || { rm -f "$constraints"; exit 1; }
    rm -f "$constraints"
    "$PY" -c 'import openvino_genai, openvino_tokenizers' \
        || { log "openvino_genai does not import after the install"; exit 1; }
    [ "$("$PY" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p')" = "$torch_before" ] \
        || { log "torch changed from $torch_before during the install"; exit 1; }
}

# the exporter, into .venv-tools/openvino-export; skipped when its pins are unchanged since its last install
setup_openvino_exporter() {
    local torch stamp sum
    torch="$("$PY" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p')"
    [ -n "$torch" ] || { log "no torch in $VENV: run scripts/setup.sh first (the exporter uses the same torch)"; exit 1; }
    stamp="$EXPORT_VENV/.installed-from"
    sum="$(printf '%s\n' "$torch" "$OPTIMUM_INTEL" "${EXPORT_REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -x "$EXPORT_VENV/bin/optimum-cli" ] \
            && [ "${FORCE:-0}" != 1 ]; then
        log "openvino exporter ($OPTIMUM_INTEL): up to date in $EXPORT_VENV"
        return
    fi
    log "openvino exporter ($OPTIMUM_INTEL, nncf, torch $torch): into $EXPORT_VENV (about 1.6 GB)"
    rm -f "$stamp"
    [ -x "$EXPORT_VENV/bin/python" ] || "$PY" -m venv "$EXPORT_VENV"
    "$EXPORT_VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" "torch==$torch" "${EXPORT_REQUIREMENTS[@]}"
    "$EXPORT_VENV/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-deps "$OPTIMUM_INTEL"
    "$EXPORT_VENV/bin/python" -m pip uninstall "${PIP_FLAGS[@]}" --yes torchvision 2>/dev/null || true
    "$EXPORT_VENV/bin/python" -c 'import torch, transformers, nncf; import optimum.exporters.openvino' \
        || { log "the exporter does not import in $EXPORT_VENV"; exit 1; }
    echo "$sum" >"$stamp"
}

[ -x "$PY" ] || { log "no venv at $VENV: run scripts/setup.sh first, or set VENV"; exit 1; }
IFS=',' read -r -a selected <<<"$PEERS"
for peer in "${selected[@]}"; do
    case "$peer" in
        llama.cpp) setup_llama_cpp ;;
        openvino) setup_openvino_runtime; setup_openvino_exporter ;;
        *) log "PEERS=$PEERS: unknown peer '$peer'; choose from llama.cpp, openvino"; exit 2 ;;
    esac
done
log "done: $PEERS"
