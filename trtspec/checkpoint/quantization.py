"""The quantization a TensorRT-LLM checkpoint declares (config.json `quantization`) and what the onnx backend does
with it.

TensorRT-LLM writes `{"quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"}`
(tensorrt_llm/models/modeling_utils.py `QuantConfig`; the modes: tensorrt_llm/quantization/mode.py `QuantAlgo`). The
onnx backend computes in fp32 with int8 / int4 MatMulNBits weights, so: no quant_algo builds from the float weights;
`W8A16` / `W4A16` with floating-point tensors are quantized by the build in its own block-wise format, as trtllm-build
quantizes them at build time; `W4A16_AWQ` is read as stored (checkpoint/awq.py); `W8A16` / `W4A16` with int8 tensors
(already interleaved for the GPU by `convert_checkpoint.py --use_weight_only`) and every other mode or quantized KV
cache are refused, naming it. Each case with its upstream source: docs/quantization.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.awq import W4A16_AWQ
from trtspec.errors import BuildError

AWQ_DEFAULT_GROUP = 128  # TensorRT-LLM QuantConfig.group_size's default

WEIGHT_ONLY = {"W8A16": "int8", "W4A16": "int4"}  # quant_algo → the --weights format it asks for
QUANTIZED_TENSORS = (".attention.qkv.weight", ".attention.dense.weight", ".mlp.fc.weight", ".mlp.gate.weight",
                     ".mlp.proj.weight")  # the matrices weight-only modes quantize (weight_only_quantize_dict)


@dataclass(frozen=True)
class CheckpointQuantization:
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None

    @classmethod
    def from_config(cls, raw_config: dict) -> CheckpointQuantization:
        q = raw_config.get("quantization") or {}
        return cls(q.get("quant_algo"), q.get("kv_cache_quant_algo"), q.get("group_size"))




def checkpoint_weight_format(source: Path, raw_config: dict) -> str | None:
    """The --weights format a checkpoint's quantization asks for (None: it has none), after refusing, in one line
    naming the mode, what the onnx backend cannot run."""
    q = CheckpointQuantization.from_config(raw_config)
    where = Path(source) / "config.json"
    if q.kv_cache_quant_algo is not None:
        raise BuildError(f"{where}: kv_cache_quant_algo={q.kv_cache_quant_algo}: the onnx backend keeps the KV cache "
                         "in fp32; build from a checkpoint without a quantized KV cache")
    if q.quant_algo is None:
        return None
    if q.quant_algo == W4A16_AWQ:
        return "int4"
    if q.quant_algo not in WEIGHT_ONLY:
        raise BuildError(f"{where}: quant_algo={q.quant_algo}: the onnx backend cannot run this quantization mode "
                         "(it reads W4A16_AWQ checkpoints, and W8A16 / W4A16 ones with floating-point weights); build "
                         "from the fp16 / fp32 checkpoint with --weights int8 or int4")
    from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint  # headers only

    ckpt = read_trtllm_checkpoint(Path(source))
    for name in ckpt.names():
        if name.endswith(QUANTIZED_TENSORS):
            if not ckpt.dtype(name).is_floating_point:
                raise BuildError(f"{where}: quant_algo={q.quant_algo}: tensor {name} is already quantized in "
                                 "TensorRT-LLM's GPU kernel layout (convert_checkpoint.py --use_weight_only), which "
                                 "the onnx backend cannot read; convert without --use_weight_only and build with "
                                 f"--weights {WEIGHT_ONLY[q.quant_algo]}")
    return WEIGHT_ONLY[q.quant_algo]
