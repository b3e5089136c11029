#!/usr/bin/env bash
# Install Triton's own load tools, perf_analyzer (Triton 2.51) and genai-perf 0.0.16, into .venv-tools/ (idempotent).
#
#   bash scripts/setup-load-tools.sh            # both tools
#   SKIP_GENAI_PERF=1 bash scripts/setup-load-tools.sh   # perf_analyzer only (genai-perf's venv is ~950 MB)
#
# Afterwards run .venv-tools/bin/perf_analyzer and .venv-tools/bin/genai-perf (or put .venv-tools/bin first on PATH).
# The wrappers set what the tools need and nothing is downloaded when they run:
#   - perf_analyzer is the binary in the tritonclient 2.51.0 wheel (PyPI's `perf-analyzer` is an empty placeholder); it
#     links libb64.so.0d and libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; no GPU needed), which the wrapper
#     puts on LD_LIBRARY_PATH.
#   - genai-perf needs numpy >= 2 while tritonclient 2.51 needs numpy < 2 (as does nvidia-pytriton in .venv), so it has a
#     venv of its own; its wrapper puts the perf_analyzer wrapper first on PATH and sets HF_HUB_OFFLINE=1: pass a local
#     tokenizer folder, e.g. --tokenizer engines/smollm2/tokenizer.
# libb64.so.0d comes from the system if installed, else from Debian's libb64-0d package (`apt-get download`, no root
# needed, nothing installed system-wide), else it is built from scripts/load-tools/b64.c (needs cc).
# LOAD_TOOLS_LIBB64=system|deb|shim forces one of these.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
TOOLS="$ROOT/.venv-tools"
REQS="$ROOT/scripts/load-tools"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input)

mkdir -p "$TOOLS/bin" "$TOOLS/lib"

log() { printf 'setup-load-tools: %s\n' "$*" >&2; }

# venv_install NAME REQUIREMENTS: a venv at .venv-tools/NAME holding exactly the pinned requirements; skipped when the
# requirements file is unchanged since the last successful install.
venv_install() {
    local name="$1" reqs="$2" venv="$TOOLS/$1" stamp sum
    stamp="$venv/.installed-from"
    sum="$(sha256sum "$reqs" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -x "$venv/bin/python" ]; then
        log "$name: up to date"
        return
    fi
    log "$name: installing $(basename "$reqs") into $venv"
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" --upgrade pip
    "$venv/bin/python" -m pip install "${PIP_FLAGS[@]}" -r "$reqs"
    echo "$sum" >"$stamp"
}

system_libb64() { ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; }

deb_libb64() (
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || exit 1
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    cd "$tmp" && timeout 120 apt-get download -q libb64-0d >/dev/null 2>&1 || exit 1
    dpkg-deb -x libb64-0d_*.deb x && cp -L x/usr/lib/*/libb64.so.0d "$TOOLS/lib/libb64.so.0d"
)

shim_libb64() {
    local cc="${CC:-cc}"
    command -v "$cc" >/dev/null || return 1
    "$cc" -O2 -shared -fPIC -Wall -o "$TOOLS/lib/libb64.so.0d" "$REQS/b64.c"
}

provide_libb64() {
    local how="${LOAD_TOOLS_LIBB64:-auto}"
    if [ "$how" = auto ] && [ -f "$TOOLS/lib/libb64.so.0d" ]; then
        log "libb64: $TOOLS/lib/libb64.so.0d (kept)"
        return
    fi
    rm -f "$TOOLS/lib/libb64.so.0d"
    case "$how" in
        system) system_libb64 && { log "libb64: the system's"; return; } ;;
        deb) deb_libb64 && { log "libb64: Debian's libb64-0d, unpacked into $TOOLS/lib"; return; } ;;
        shim) shim_libb64 && { log "libb64: built from scripts/load-tools/b64.c"; return; } ;;
        auto)
            if system_libb64; then log "libb64: the system's"; return; fi
            if deb_libb64; then log "libb64: Debian's libb64-0d, unpacked into $TOOLS/lib"; return; fi
            if shim_libb64; then log "libb64: built from scripts/load-tools/b64.c"; return; fi ;;
        *) log "LOAD_TOOLS_LIBB64 must be auto, system, deb or shim, not '$how'"; exit 2 ;;
    esac
    log "libb64: could not get libb64.so.0d ($how): install Debian's libb64-0d or a C compiler"
    exit 1
}

# ---- perf_analyzer ----
venv_install perf-analyzer "$REQS/perf-analyzer.txt"
provide_libb64
cat >"$TOOLS/bin/perf_analyzer" <<'EOF'
#!/usr/bin/env bash
# perf_analyzer of Triton 2.51 (tritonclient wheel) with the libraries it links; written by scripts/setup-load-tools.sh.
# Note: with a decoupled (streaming) model, give --warmup-request-count >= the concurrency, or 0: below it, it hangs.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cudart="$(echo "$here"/perf-analyzer/lib/python3*/site-packages/nvidia/cuda_runtime/lib)"
export LD_LIBRARY_PATH="$here/lib:$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/perf-analyzer/bin/perf_analyzer" "$@"
EOF
chmod +x "$TOOLS/bin/perf_analyzer"
"$TOOLS/bin/perf_analyzer" --version | head -1 >&2

# ---- genai-perf ----
if [ "${SKIP_GENAI_PERF:-0}" = 1 ]; then
    log "genai-perf: skipped (SKIP_GENAI_PERF=1)"
else
    venv_install genai-perf "$REQS/genai-perf.txt"
    cat >"$TOOLS/bin/genai-perf" <<'EOF'
#!/usr/bin/env bash
# genai-perf 0.0.16 in its own venv, running the perf_analyzer wrapper beside this file, offline (use a local
# --tokenizer folder); written by scripts/setup-load-tools.sh.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$here:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
exec "$here/../genai-perf/bin/genai-perf" "$@"
EOF
    chmod +x "$TOOLS/bin/genai-perf"
    "$TOOLS/bin/genai-perf" --version >&2
fi
log "done: $TOOLS/bin/perf_analyzer$([ "${SKIP_GENAI_PERF:-0}" = 1 ] || echo " and $TOOLS/bin/genai-perf")"
