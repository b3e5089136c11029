"""INT4-AWQ TensorRT-LLM checkpoints (quant_algo W4A16_AWQ, as TensorRT Model Optimizer exports them), read for the
CPU engine without re-quantizing.

Per quantized linear layer P the checkpoint holds `P.weight` (int8 [out / 2, in]: two signed 4-bit codes a byte,
packed along the output dimension, the even output row in the low nibble), `P.weights_scaling_factor` ([out,
in / group]) and `P.prequant_scaling_factor` ([in], AWQ's activation scale). Here the codes become MatMulNBits blocks
as they are, the scales its scales and the pre-quant scale a Mul on the activation, so the engine computes what
TensorRT-LLM's kernel computes; the dequantized view (`dequantized`) is what the torch reference and `inspect` read.

Layouts: ModelOpt `modelopt/torch/export/model_config_utils.py` `to_quantized_weight` (INT4_AWQ); TensorRT-LLM
`tensorrt_llm/quantization/layers.py` `WeightOnlyGroupwiseQuantLinear` and `tensorrt_llm/models/modeling_utils.py`
`preprocess_perlayer_weights`. In detail: docs/quantization-numerics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trtspec.errors import CheckpointError

W4A16_AWQ = "W4A16_AWQ"
SCALE_SUFFIXES = (".weights_scaling_factor", ".prequant_scaling_factor")
LINEAR_SUFFIXES = (".attention.qkv.weight", ".attention.dense.weight", ".mlp.fc.weight", ".mlp.gate.weight",
                   ".mlp.proj.weight")


@dataclass(frozen=True)
class AwqMatrix:
    """One AWQ linear layer unpacked: codes [out, in] int8 (−8..7), scales [out, groups], pre_scale [in] or None."""

    codes: np.ndarray
    scales: np.ndarray
    pre_scale: np.ndarray | None
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantized(self) -> np.ndarray:
        """The float matrix W the layer computes x @ W.T with (the pre-quant scale folded into its columns)."""
        out, k = self.codes.shape
        w = self.codes.astype(np.float32) * np.repeat(self.scales, self.group_size, axis=1)[:, :k]
        return w if self.pre_scale is None else w * self.pre_scale[None, :]


def unpack_codes(packed: torch.Tensor) -> np.ndarray:
    """int8 [out / 2, in] (ModelOpt's packing) → signed 4-bit codes int8 [out, in]."""
    p = packed.numpy().view(np.uint8)
    low, high = (p & 0x0F).astype(np.int8), (p >> 4).astype(np.int8)
    low, high = np.where(low > 7, low - 16, low), np.where(high > 7, high - 16, high)  # sign-extend 4 bits
    out = np.empty((2 * p.shape[0], p.shape[1]), np.int8)
    out[0::2], out[1::2] = low, high
    return out


def read_awq_matrix(name: str, packed: torch.Tensor, scales: torch.Tensor, pre_scale: torch.Tensor | None,
                    where) -> AwqMatrix:
    """Check and unpack one layer's three tensors (`name` the weight's)."""
    if packed.dtype not in (torch.int8, torch.uint8) or packed.dim() != 2:
        raise CheckpointError(f"{where}: tensor {name} is {packed.dtype} {list(packed.shape)}; W4A16_AWQ stores "
                              "int8 [out / 2, in] (two 4-bit codes a byte)")
    codes = unpack_codes(packed)
    out, k = codes.shape
    if scales.dim() != 2 or scales.shape[0] != out or k % scales.shape[1]:
        raise CheckpointError(f"{where}: tensor {name[:-len('weight')]}weights_scaling_factor has shape "
                              f"{list(scales.shape)}; the weight's {out} rows of {k} inputs need [{out}, {k} / group]")
    group = k // scales.shape[1]
    pre = None
    if pre_scale is not None:
        pre = pre_scale.float().numpy().reshape(-1)
        if pre.shape != (k,):
            raise CheckpointError(f"{where}: tensor {name[:-len('weight')]}prequant_scaling_factor has shape "
                                  f"{list(pre_scale.shape)}; expected [{k}]")
    return AwqMatrix(codes, scales.float().numpy(), pre, group)
