#!/usr/bin/env bash
# Fresh machine → a working result on the embedded default: set up, write tiny example checkpoints
# (a LLaMA base, Medusa heads, an EAGLE draft), convert them to TensorRT-LLM checkpoints, inspect them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rm -rf example
.venv/bin/python -m trtspec.testing example
.venv/bin/trtspec convert --base example/base --medusa example/medusa --out example/ckpt-medusa --tp-size 2
.venv/bin/trtspec convert --base example/base --eagle example/eagle --out example/ckpt-eagle --num-eagle-layers 3
.venv/bin/trtspec inspect example/ckpt-medusa
.venv/bin/trtspec inspect example/ckpt-eagle
