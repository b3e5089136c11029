"""Block-wise weight-only quantization in ONNX Runtime's `MatMulNBits` layout (numpy only, no onnx, no torch).

A matrix W [N, K] (the checkpoint's [out, in]) is cut along K into blocks of `block_size` values, each with one
float32 scale and its values stored as unsigned `bits`-bit integers with an implicit zero point 2^(bits-1), so that
W[n, k] ≈ (q[n, k] - 2^(bits-1)) * scale[n, k // block_size] (the com.microsoft MatMulNBits contrib op, ONNX Runtime
`docs/ContribOperators.md`). The `min` scheme (int4 only; llama.cpp's Q4_1: ggml-org/llama.cpp
`ggml/src/ggml-quants.c`, quantize_row_q4_1_ref) gives each block a float minimum m too, W ≈ u * d + m: it stores u
as the symmetric scheme stores its codes and each block's offset m + 8 d in float16 (OFFSET_DTYPE), which trtspec's
AddBlockOffsets op adds after the product. Also here: the accuracy level, and why a quantized plain step may compute
as two slots. The layout, the scheme and why not MatMulNBits' own zero points: docs/quantization-numerics.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from trtspec.errors import ConfigError


class WeightDtype(str, enum.Enum):
    """How an engine stores a component's matrices."""

    FP32 = "fp32"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return {"fp32": 32, "int8": 8, "int4": 4}[self.value]

    @classmethod
    def parse(cls, text: str, flag: str = "--weights") -> WeightDtype:
        try:
            return cls(text)
        except ValueError:
            raise ConfigError(f"{flag} {text}: unknown weight format; choose one of "
                              f"{', '.join(w.value for w in cls)}") from None


# MatMulNBits accuracy_level: 4 rounds the activations to int8 per block and runs integer dot products, the fastest
# level on CPUs without AVX-512; int8 weights have no fp32-compute kernel at all (levels 0-3 dequantize the whole
# matrix on every call).
ACCURACY_LEVEL = 4
# Speculation is lossless when a verify step computes each slot exactly as a plain step would. ONNX Runtime does not
# quite, in two places: GroupQueryAttention's one-token path (T = 1) differs from T >= 2 in the last bits, and on
# some CPUs the 4-bit MatMulNBits kernels' one-row path (M = 1) differs from M >= 2 (the 8-bit level-4 kernel is
# bit-identical for every M). At accuracy level 4 each activation block is rounded to int8, which turns such
# last-bit differences into rounding flips and then into different tokens. So a quantized engine's plain step
# computes as 2 slots per row (the second masked) unless the runtime finds, when it loads the engine, that one row
# computes as two on this CPU (OrtEngine._plain_step_slots); a GroupQueryAttention graph pads its attention to 2 rows
# itself (Manifest.attention_rows, onnx_ops.prelude) so that only the products decide (tests/engine/test_quantized.py).
PLAIN_STEP_SLOTS = 2
# That makes chains exact, not trees. A tree slot on a second branch does not have its ancestors in the slots just
# before it, so its attention row reaches the same keys through other columns than a plain step's row does; ONNX
# Runtime's CPU GroupQueryAttention (contrib_ops/cpu/bert/gqa_attention_base.h) runs each row's softmax in MLAS's
# vectorised kernels, where a key's column decides which partial sum it joins, and the row comes out different in the
# last bits, which int8 activation rounding magnifies. So quantized engines built with GroupQueryAttention
# (`--attention gqa`) draft chains only (speculative.engine's `chains_only`). trtspec's own TreeAttention
# (trtspec/native; the default) computes a query row from its visible keys alone, in their order, whatever the rows
# around it: a slot anywhere in a tree is bit-identical to plain steps along its path (tests/engine/test_quantized.py).


# The min scheme's block offsets o = min + 8 scale are stored as float16 (AddBlockOffsets reads them so): a block's
# o is about half a quantization step (min ≈ -range / 2, 8 scale ≈ range / 2), so half precision holds it to ~2^-12 of
# a step, at 2 bytes a block instead of 4 (less read every decode step). The reference computes
# with the same rounded offsets (QuantizedMatrix.offsets, dequantize).
OFFSET_DTYPE = np.float16


class QuantScheme(str, enum.Enum):
    """How int4 blocks map codes to values: `symmetric` (w = (q - 8) * scale) or `min` (w = u * scale + min)."""

    SYMMETRIC = "symmetric"
    MIN = "min"

    @classmethod
    def parse(cls, text: str, flag: str = "--int4-scheme") -> QuantScheme:
        try:
            return cls(text)
        except ValueError:
            raise ConfigError(f"{flag} {text}: unknown int4 scheme; choose one of "
                              f"{', '.join(s.value for s in cls)}") from None


def min_step_slots(dtype: WeightDtype) -> int:
    """Slots per row a decode step of an engine whose target weights are `dtype` runs at least (1: no padding)."""
    return 1 if WeightDtype(dtype) is WeightDtype.FP32 else PLAIN_STEP_SLOTS


BLOCK_SIZES = (32, 64, 128)  # what ONNX Runtime's CPU MatMulNBits kernels run (a power of 2, at least 16)
DEFAULT_BLOCK_SIZE = 32


def check_block_size(block_size: int, flag: str = "--block-size") -> int:
    if isinstance(block_size, bool) or block_size not in BLOCK_SIZES:
        raise ConfigError(f"{flag} {block_size}: unsupported block size; choose one of "
                          f"{', '.join(map(str, BLOCK_SIZES))}")
    return block_size


@dataclass(frozen=True)
class QuantSpec:
    """How a build quantizes a component's matrices."""

    dtype: WeightDtype
    block_size: int = DEFAULT_BLOCK_SIZE
    accuracy_level: int = ACCURACY_LEVEL
    prequantized: str | None = None  # the checkpoint's quant_algo whose codes and scales are used as stored
    scheme: QuantScheme = QuantScheme.SYMMETRIC

    def __post_init__(self):
        object.__setattr__(self, "dtype", WeightDtype(self.dtype))
        object.__setattr__(self, "scheme", QuantScheme(self.scheme))
        if self.dtype is WeightDtype.FP32:
            raise ValueError("QuantSpec is for int8 / int4; fp32 matrices take no spec")
        if self.scheme is QuantScheme.MIN and (self.dtype is not WeightDtype.INT4 or self.prequantized):
            raise ValueError("the min scheme is for int4 blocks quantized by the build")
        check_block_size(self.block_size)

    @property
    def bits(self) -> int:
        return self.dtype.bits


@dataclass(frozen=True)
class QuantizedMatrix:
    """W [N, K] in MatMulNBits form: `packed` uint8 [N, blocks, blob bytes], `scales` float32 [N, blocks]; the min
    scheme's block minima `mins` float32 [N, blocks] (None: symmetric)."""

    packed: np.ndarray
    scales: np.ndarray
    bits: int
    block_size: int
    k: int  # input features (before padding to whole blocks)
    mins: np.ndarray | None = None

    @property
    def offsets(self) -> np.ndarray | None:
        """[N, blocks] what a block's values add beyond MatMulNBits' (u - 2^(bits-1)) * scale, as the engine stores it:
        min + 2^(bits-1) scale rounded to float16 (OFFSET_DTYPE), as float32."""
        if self.mins is None:
            return None
        exact = self.mins + np.float32(1 << (self.bits - 1)) * self.scales
        return exact.astype(OFFSET_DTYPE).astype(np.float32)

    @property
    def n(self) -> int:
        return self.packed.shape[0]

    @property
    def blocks(self) -> int:
        return self.packed.shape[1]


def quantize(weight: np.ndarray, bits: int, block_size: int,
             scheme: QuantScheme = QuantScheme.SYMMETRIC) -> QuantizedMatrix:
    """Quantize W [N, K] block-wise along K, round to nearest: symmetric (scale = max |w| / (2^(bits-1) - 1)) or,
    int4 only, with a minimum per block (`quantize_min`)."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize takes a matrix, got shape {w.shape}")
    if QuantScheme(scheme) is QuantScheme.MIN:
        return quantize_min(w, bits, block_size)
    n, k = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((n, blocks * block_size), np.float32)
    padded[:, :k] = w
    grouped = padded.reshape(n, blocks, block_size)
    top = (1 << (bits - 1)) - 1  # 7 or 127: ±top, the code 0 (−8 / −128) unused, so zero stays exact
    scales = np.abs(grouped).max(axis=2) / np.float32(top)
    safe = np.where(scales == 0, np.float32(1), scales)
    q = np.clip(np.rint(grouped / safe[..., None]), -top, top).astype(np.int8)
    return pack(q.reshape(n, -1)[:, :k], scales, bits, block_size)


def quantize_min(weight: np.ndarray, bits: int, block_size: int) -> QuantizedMatrix:
    """The min scheme (llama.cpp's Q4_1): per block m = min, scale = (max - min) / 15, codes round((w - m) / scale)
    in 0..15. K must be whole blocks (the graph sums the activations block by block)."""
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    if bits != 4:
        raise ValueError(f"the min scheme stores 4-bit codes, not {bits}-bit")
    if k % block_size:
        raise ValueError(f"the min scheme needs whole blocks: {k} inputs, blocks of {block_size}")
    grouped = w.reshape(n, k // block_size, block_size)
    low, high = grouped.min(axis=2), grouped.max(axis=2)
    scales = ((high - low) / np.float32(15)).astype(np.float32)
    safe = np.where(scales == 0, np.float32(1), scales)
    u = np.clip(np.rint((grouped - low[..., None]) / safe[..., None]), 0, 15).astype(np.int8)
    return pack(u.reshape(n, k) - 8, scales, bits, block_size, mins=low)


def pack(values: np.ndarray, scales: np.ndarray, bits: int, block_size: int,
         mins: np.ndarray | None = None) -> QuantizedMatrix:
    """Signed integer codes [N, K] (−2^(bits-1) .. 2^(bits-1) − 1, the last block zero-padded here) and their block
    scales [N, blocks] in MatMulNBits form: code + 2^(bits-1) as unsigned, two 4-bit codes a byte (low nibble first)."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    values = np.asarray(values)
    n, k = values.shape
    blocks = -(-k // block_size)
    if np.shape(scales) != (n, blocks):
        raise ValueError(f"scales of shape {np.shape(scales)} for {n} rows of {blocks} blocks")
    q = np.full((n, blocks * block_size), 1 << (bits - 1), np.uint8)
    q[:, :k] = (values.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    q = q.reshape(n, blocks, block_size)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    if mins is not None:
        if np.shape(mins) != (n, blocks) or k != blocks * block_size:
            raise ValueError(f"mins of shape {np.shape(mins)} for {n} rows of {k} inputs in blocks of {block_size}")
        mins = np.asarray(mins, np.float32)
    return QuantizedMatrix(np.ascontiguousarray(q), np.asarray(scales, np.float32), bits, block_size, k, mins)


def dequantize(m: QuantizedMatrix) -> np.ndarray:
    """W [N, K] float32 as the engine computes with it: (q - 2^(bits-1)) * scale (q the stored unsigned code), plus
    with a minimum per block the block's stored offset (min + 2^(bits-1) scale in float16: `offsets`)."""
    q = m.packed
    if m.bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(m.n, m.blocks, m.block_size)
    values = (q.astype(np.float32) - np.float32(1 << (m.bits - 1))) * m.scales[..., None]
    if m.mins is not None:
        values = values + m.offsets[..., None]
    return values.reshape(m.n, -1)[:, :m.k]


def fake_quantize(weight: np.ndarray, bits: int, block_size: int,
                  scheme: QuantScheme = QuantScheme.SYMMETRIC) -> np.ndarray:
    """dequantize(quantize(W)): the float weights a quantized engine computes with (the reference's)."""
    return dequantize(quantize(weight, bits, block_size, scheme))
