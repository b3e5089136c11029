"""Building blocks of the CPU engine's ONNX graphs: a node builder, the external weight file, and the
decoder layer (fused q/k/v and gate/up MatMuls, RMSNormalization, attention with RoPE and the KV cache in one
GroupQueryAttention node, residual Adds fused into SkipSimplifiedLayerNormalization).

Everything here is plain `onnx.helper` over numpy; no torch. Shapes use B = batch, T = new tokens,
nh / nkv = query / KV heads, hd = head size, capacity = the KV buffer's rows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtspec import native
from trtspec.model.quantize import ACCURACY_LEVEL, QuantizedMatrix, QuantSpec, dequantize, quantize

OPSET = 23  # RMSNormalization is standard from opset 23 (ONNX Runtime >= 1.22 runs it)
IR_VERSION = 10
# SkipSimplifiedLayerNormalization, GroupQueryAttention: ONNX Runtime contrib ops with CPU kernels
MS_DOMAIN = "com.microsoft"
# the attention kernels a generation graph runs: ONNX Runtime's GroupQueryAttention, or trtspec's TreeAttention,
# whose query row computes the same whatever the rows around it (see attention()); a target built with "tree" runs
# its context graph's attention in trtspec's PromptAttention (causal, the prompt's keys only)
ATTENTION_KERNELS = ("gqa", "tree")
PROMPT_KERNEL = "prompt"
# ONNX Runtime's CPU GroupQueryAttention rejects other head sizes at run time (1.32: "head_size shall be a
# multiple of 16")
HEAD_DIM_MULTIPLE = 16
# ONNX Runtime memory-maps an external initializer whose offset is page aligned; it does so for large ones.
PAGE_ALIGN, PAGE_ALIGN_ABOVE, SMALL_ALIGN = 4096, 1 << 20, 64


class WeightFile:
    """One external-data file that every graph of a network points into: each weight is written once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("wb")
        self.protos: dict[str, TensorProto] = {}
        self.nbytes = 0  # bytes of tensor data (padding excluded)

        self.quantized: dict[str, QuantizedInfo] = {}  # matrix name → its MatMulNBits form
        # while set, each quantized matrix also gets `<name>.fp32`: its dequantized values [in, out] for a MatMul
        # (what a context graph built with fp32_copies reads; onnx_graph.WeightPlan.prefill_fp32)
        self.fp32_copies = False

    def add(self, name: str, array: np.ndarray) -> None:
        """Append `array` as float32 (C order) under `name`."""
        self._append(name, np.ascontiguousarray(array, dtype=np.float32), TensorProto.FLOAT)

    def add_matrix(self, name: str, weight: np.ndarray, spec: QuantSpec | None, *, fp32_layout: str,
                   row_scale: np.ndarray | None = None) -> None:
        """A matrix given as [out, in] (the checkpoint's layout), each output row times `row_scale` (if given).

        fp32 (spec None): stored under `name` as [in, out] (fp32_layout "in_out", a MatMul's right operand) or as
        given ("out_in", vocabulary matrices). Quantized: MatMulNBits blocks under `<name>.q` and `<name>.scales`,
        the row factors folded into the scales (the rows are quantized unscaled)."""
        w = np.asarray(weight, dtype=np.float32)
        if spec is None:
            if row_scale is not None:
                w = w * np.asarray(row_scale, np.float32)[:, None]
            self.add(name, w.T if fp32_layout == "in_out" else w)
            return
        self._add_quantized(name, quantize(w, spec.bits, spec.block_size, spec.scheme), spec.accuracy_level, row_scale)

    def add_prequantized(self, name: str, m: QuantizedMatrix, accuracy_level: int, *,
                         row_scale: np.ndarray | None = None, pre_scale: np.ndarray | None = None) -> None:
        """A matrix quantized before the build (a checkpoint's codes and scales, quantize.pack), stored as given;
        `pre_scale` [k]: multiplies the activation before the product (AWQ's pre-quant scale)."""
        self._add_quantized(name, m, accuracy_level, row_scale)
        if pre_scale is not None:
            self.add(f"{name}.pre_scale", pre_scale)

    def _add_quantized(self, name: str, m: QuantizedMatrix, accuracy_level: int, row_scale) -> None:
        factor = np.float32(1) if row_scale is None else np.asarray(row_scale, np.float32)[:, None]
        self._append(f"{name}.q", m.packed, TensorProto.UINT8)
        self._append(f"{name}.scales", np.ascontiguousarray((m.scales * factor).reshape(-1), np.float32),
                     TensorProto.FLOAT)
        if m.offsets is not None:  # the min scheme: [blocks, n], what AddBlockOffsets reads (see matmul_nbits)
            self._append(f"{name}.offsets", np.ascontiguousarray((m.offsets * factor).T.astype(np.float16)),
                         TensorProto.FLOAT16)
        self.quantized[name] = QuantizedInfo(k=m.k, n=m.n, blocks=m.blocks, bits=m.bits, block_size=m.block_size,
                                             accuracy_level=accuracy_level, offsets=m.offsets is not None)
        if self.fp32_copies:  # the values MatMulNBits computes with (the float16 offsets included)
            self.add(f"{name}.fp32", (dequantize(m) * factor).T)

    def alias(self, name: str, source: str, dims: tuple[int, ...]) -> None:
        """`name`: the bytes of weight `source` seen with other dims (written once, read by two ops)."""
        proto = TensorProto()
        proto.CopyFrom(self.protos[source])
        proto.name = name
        del proto.dims[:]
        proto.dims.extend(dims)
        self.protos[name] = proto

    def _append(self, name: str, data: np.ndarray, data_type: int) -> None:
        align = PAGE_ALIGN if data.nbytes > PAGE_ALIGN_ABOVE else SMALL_ALIGN
        offset = -(-self._file.tell() // align) * align
        self._file.write(b"\0" * (offset - self._file.tell()))
        self._file.write(data.tobytes())
        proto = TensorProto(name=name, data_type=data_type, dims=data.shape, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(data.nbytes))):
            proto.external_data.add(key=key, value=value)
        self.protos[name] = proto
        self.nbytes += data.nbytes

    def __contains__(self, name: str) -> bool:
        return name in self.protos or name in self.quantized

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class QuantizedInfo:
    """A matrix written in MatMulNBits form: W [n, k] as `blocks` blocks of `block_size` per output row."""

    k: int
    n: int
    blocks: int
    bits: int
    block_size: int
    accuracy_level: int
    offsets: bool = False  # the min scheme: `<name>.offsets` [blocks, n] (see quantize.quantize_min)


class Graph:
    """Accumulates nodes, inline constants and the weights they use; `model()` makes the ModelProto."""

    def __init__(self, weights: WeightFile, *, fp32_copies: bool = False):
        self.weights = weights
        self.fp32_copies = fp32_copies  # linear() reads a quantized matrix's `<name>.fp32` copy where there is one
        # while set, a quantized product in blocks of 32 runs trtspec's BlockMatMul instead of MatMulNBits (the same
        # numbers; the target's graphs in a build with --native-matmul)
        self.native_products = False
        self.nodes: list[onnx.NodeProto] = []
        self.used: dict[str, TensorProto] = {}
        self.consts: dict[tuple, str] = {}
        self._ids = itertools.count()

    def op(self, op_type: str, *inputs: str, name: str | None = None, outputs: int | tuple[str, ...] = 1,
           domain: str = "", **attrs):
        """Add a node; return its output name, or the list of them when it has several (`outputs` of them, or the
        names given). Trailing "" inputs (omitted optional ones) are dropped."""
        base = name or f"{op_type.lower()}_{next(self._ids)}"
        if isinstance(outputs, tuple):
            outs = list(outputs)
        else:
            outs = [base] if outputs == 1 else [f"{base}_{i}" for i in range(outputs)]
        ins = list(inputs)
        while ins and not ins[-1]:
            ins.pop()
        self.nodes.append(helper.make_node(op_type, ins, outs, name=f"n_{base}", domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def ms(self, op_type: str, *inputs: str, **kwargs):
        """An ONNX Runtime contrib op (com.microsoft), which its CPU provider runs as one fused kernel."""
        return self.op(op_type, *inputs, domain=MS_DOMAIN, **kwargs)

    def const(self, value, dtype=np.int64) -> str:
        """An inline constant initializer (shapes, axes, tables), shared by value."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.consts:
            name = f"const_{len(self.consts)}"
            self.consts[key] = name
            self.used[name] = onnx.numpy_helper.from_array(array, name)
        return self.consts[key]

    def w(self, name: str) -> str:
        """Use the external weight `name`."""
        self.used[name] = self.weights.protos[name]
        return name

    def model(self, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=list(self.used.values()))
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
        if any(n.domain == native.DOMAIN for n in self.nodes):  # TreeAttention: trtspec's own kernel (trtspec/native)
            opsets.append(helper.make_opsetid(native.DOMAIN, 1))
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                                 producer_name="trtspec")


@dataclass(frozen=True)
class Dims:
    """Attention dimensions of one network (base or draft)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


@dataclass(frozen=True)
class Prelude:
    """Per-graph inputs of every layer's GroupQueryAttention, computed once from the graph inputs."""

    seqlens_k: str  # [B] int32: each row's past length + T - 1 (the index of its last key)
    total: str  # [] int32: the longest row's past length + T
    query_lengths: str  # [B] int32: T for every row, so a batch of rows with different pasts may feed T > 1
    cos: str  # [positions, hd/2] cos_cache (constant: ONNX Runtime folds it when the session loads)
    sin: str  # [positions, hd/2] sin_cache
    position_ids: str  # [B, T] RoPE positions (tree depths after the past); "" in context graphs (consecutive)
    bias: str  # [B, 1, T, total] the tree mask as an additive bias; "" in context graphs (causal only)
    # attention over padded rows (`prelude`'s attention_rows): the pads that take q/k/v [B, T, C] to [B, T', C], and T
    # as an int64 [1] to cut the attention's output back to; "" when attention runs over the T rows fed
    attention_pads: str = ""
    rows: str = ""
    # "tree": TreeAttention, which reads past_lengths and the tree mask itself (no seqlens, bias); "prompt":
    # PromptAttention, causal from past_lengths
    kernel: str = "gqa"
    tree_mask: str = ""  # [B, T, T] bool, what TreeAttention reads ("" otherwise)


def prelude(g: Graph, inv_freq: np.ndarray, positions: int, *, tree: bool, attention_rows: int = 1,
            kernel: str = "gqa") -> Prelude:
    """The attention inputs a graph over T new tokens needs (T read from input_ids).

    A context graph (tree False) appends consecutive positions after each row's past and is causal; a generation
    graph (tree True) takes position_ids and a tree mask. Either way every row's own past is wholly visible.

    `attention_rows` > 1 (a generation graph): attention runs over T' = max(T, attention_rows) rows,
    the new ones zeros that see only the past and that no fed row sees; every other op runs over the T rows fed.
    That is how a quantized engine's one-token plain step computes its token exactly as a verify step's first slot
    (see quantize.PLAIN_STEP_SLOTS) without paying for a second slot in every MatMul and norm.

    `kernel` "tree" (a generation graph): attention runs in TreeAttention, which needs only the RoPE tables, the
    position ids, past_lengths and the tree mask (and no padding: its one-row path is its many-row path). `kernel`
    "prompt" (a context graph): PromptAttention, which needs only the RoPE tables and past_lengths."""
    if kernel not in ATTENTION_KERNELS + (PROMPT_KERNEL,):
        raise ValueError(f"attention kernel {kernel!r}: expected one of {', '.join(ATTENTION_KERNELS)}, "
                         f"{PROMPT_KERNEL}")
    if kernel == "tree":
        if not tree or attention_rows > 1:
            raise ValueError("TreeAttention runs a generation graph's attention, unpadded")
        cos, sin = _rope_tables(g, inv_freq, positions)
        return Prelude("", "", "", cos, sin, "position_ids", "", kernel="tree", tree_mask="tree_mask")
    if kernel == PROMPT_KERNEL:
        if tree:
            raise ValueError("PromptAttention runs a context graph's attention")
        cos, sin = _rope_tables(g, inv_freq, positions)
        return Prelude("", "", "", cos, sin, "", "", kernel=PROMPT_KERNEL)
    t = g.op("Cast", g.op("Shape", "input_ids", start=1, end=2), to=TensorProto.INT32)  # [1]
    pads = rows = ""
    position_ids, tree_mask = "position_ids", "tree_mask"
    if attention_rows > 1:
        if not tree:
            raise ValueError("attention_rows > 1 pads a generation graph")
        rows = g.op("Cast", t, to=TensorProto.INT64)
        t = g.op("Max", t, g.const([attention_rows], np.int32))  # T' from here on
        extra = g.op("Sub", g.op("Cast", t, to=TensorProto.INT64), rows)  # [1]: T' - T, 0 or more
        zero = g.const([0])
        pads = g.op("Concat", g.const([0, 0, 0, 0]), extra, zero, axis=0)  # [B, T, C] → [B, T', C]
        position_ids = g.op("Pad", "position_ids", g.op("Concat", g.const([0, 0, 0]), extra, axis=0))  # 0s: rows of
        # zeros stay zeros under RoPE
        mask = g.op("Cast", "tree_mask", to=TensorProto.UINT8)  # [B, T, T] → [B, T', T'], the new rows and columns 0
        tree_mask = g.op("Cast", g.op("Pad", mask, g.op("Concat", g.const([0, 0, 0, 0]), extra, extra, axis=0)),
                         to=TensorProto.BOOL)
    seqlens = g.op("Add", "past_lengths", g.op("Sub", t, g.const([1], np.int32)), name="seqlens_k")
    longest = g.op("ReduceMax", "past_lengths", keepdims=1)  # [1]
    total = g.op("Squeeze", g.op("Add", longest, t), g.const([0]), name="total_sequence_length")
    query_lengths = g.op("Expand", t, g.op("Shape", "past_lengths"), name="query_lengths")
    cos, sin = _rope_tables(g, inv_freq, positions)
    if not tree:
        return Prelude(seqlens, total, query_lengths, cos, sin, "", "")
    return Prelude(seqlens, total, query_lengths, cos, sin, position_ids, _tree_bias(g, total, t, tree_mask),
                   pads, rows)


def _rope_tables(g: Graph, inv_freq: np.ndarray, positions: int) -> tuple[str, str]:
    """cos_cache / sin_cache [positions, hd/2] (constant: ONNX Runtime folds them when the session loads)."""
    angles = g.op("Mul", g.op("Unsqueeze", g.op("Range", *(g.const(v, np.float32) for v in (0, positions, 1))),
                              g.const([-1])), g.const(inv_freq, np.float32))  # [positions, hd/2]
    return g.op("Cos", angles, name="cos_cache"), g.op("Sin", angles, name="sin_cache")


def _tree_bias(g: Graph, total: str, tokens: str, tree_mask: str = "tree_mask") -> str:
    """tree_mask [B, T, T] → additive bias [B, 1, T, total] over absolute key columns: column j of row b is
    its past when j < past_lengths[b], else new slot j - past_lengths[b]. Columns past a row's last slot are
    never read, so what they hold does not matter. `tokens` is T as an int32 [1]."""
    columns = g.op("Range", g.const(0, np.int32), total, g.const(1, np.int32))  # [total]
    slot = g.op("Sub", g.op("Unsqueeze", columns, g.const([0])), g.op("Unsqueeze", "past_lengths", g.const([1])))
    last = g.op("Squeeze", g.op("Sub", tokens, g.const([1], np.int32)), g.const([0]))  # [] T - 1
    index = g.op("Clip", slot, g.const(0, np.int32), last)  # [B, total]
    shape = g.op("Concat", g.op("Shape", tree_mask, start=0, end=2), g.op("Shape", columns), axis=0)
    in_tree = g.op("GatherElements", tree_mask, g.op("Expand", g.op("Unsqueeze", index, g.const([1])), shape),
                   axis=2)  # [B, T, total]
    in_past = g.op("Unsqueeze", g.op("Less", slot, g.const(0, np.int32)), g.const([1]))  # [B, 1, total]
    bias = g.op("Where", g.op("Or", in_past, in_tree), g.const(0.0, np.float32), g.const(-np.inf, np.float32))
    return g.op("Unsqueeze", bias, g.const([1]), name="tree_bias")


def rms_norm(g: Graph, x: str, weight: str, eps: float, name: str) -> str:
    return g.op("RMSNormalization", x, g.w(weight), axis=-1, epsilon=eps, name=name)


def runs_block_matmul(g: Graph, weight: str) -> bool:
    """Whether matmul_nbits puts the quantized `weight` on trtspec's BlockMatMul (a --native-matmul graph, blocks of
    32 at accuracy level 4)."""
    q = g.weights.quantized[weight]
    return g.native_products and q.block_size == native.BLOCK_MATMUL_BLOCK_SIZE and q.accuracy_level == ACCURACY_LEVEL


def matmul_nbits(g: Graph, x: str, weight: str, name: str | None = None, *, gated: bool = False) -> str:
    """x [..., k] @ W.T for a quantized W [n, k]: one MatMulNBits (com.microsoft) over its blocks and scales. `gated`
    (BlockMatMul only, see runs_block_matmul): silu(first n / 2 columns) · the rest, in the same node."""
    q = g.weights.quantized[weight]
    if f"{weight}.pre_scale" in g.weights:  # AWQ: the activation times the pre-quant scale first
        x = g.op("Mul", x, g.w(f"{weight}.pre_scale"), name=None if name is None else f"{name}_pre_scale")
    if gated:
        assert runs_block_matmul(g, weight) and not q.offsets, weight
        return g.op(native.BLOCK_MATMUL, x, g.w(f"{weight}.q"), g.w(f"{weight}.scales"), domain=native.DOMAIN,
                    name=name, gated=1)
    if runs_block_matmul(g, weight):
        # MatMulNBits' numbers at accuracy level 4 in trtspec's kernel (trtspec/native/block_matmul.cc)
        y = g.op(native.BLOCK_MATMUL, x, g.w(f"{weight}.q"), g.w(f"{weight}.scales"), domain=native.DOMAIN,
                 name=None if q.offsets else name)
    else:
        y = g.ms("MatMulNBits", x, g.w(f"{weight}.q"), g.w(f"{weight}.scales"), name=None if q.offsets else name,
                 K=q.k, N=q.n, bits=q.bits, block_size=q.block_size, accuracy_level=q.accuracy_level)
    if not q.offsets:
        return y
    # the min scheme: + sum_b blocksum_b(x) * offsets[b, :] (float16 offsets, float32 arithmetic), in one trtspec op
    # (trtspec/native/block_offsets.cc) whose rows compute alike in calls of any size
    return g.op(native.ADD_BLOCK_OFFSETS, y, x, g.w(f"{weight}.offsets"), domain=native.DOMAIN, name=name)


def linear(g: Graph, x: str, weight: str, name: str) -> str:
    """x @ W (+ b): W is stored pre-transposed [in, out], or quantized (MatMulNBits; in a graph built with
    fp32_copies, its `.fp32` copy where the build wrote one); the bias, if the network has one, is `<weight>.bias`."""
    if g.fp32_copies and f"{weight}.weight.fp32" in g.weights:
        if f"{weight}.weight.pre_scale" in g.weights:  # AWQ: the activation times the pre-quant scale first
            x = g.op("Mul", x, g.w(f"{weight}.weight.pre_scale"), name=f"{name}_pre_scale")
        y = g.op("MatMul", x, g.w(f"{weight}.weight.fp32"), name=name)
    elif f"{weight}.weight" in g.weights.quantized:
        y = matmul_nbits(g, x, f"{weight}.weight", name)
    else:
        y = g.op("MatMul", x, g.w(f"{weight}.weight"), name=name)
    bias = f"{weight}.bias"
    return g.op("Add", y, g.w(bias), name=f"{name}_bias") if bias in g.weights else y


def attention(g: Graph, d: Dims, pre: Prelude, x: str, prefix: str, layer: int) -> str:
    """Attention of x [B, T, H] over each row's past and the new tokens, in one GroupQueryAttention node (or, with
    the prelude's kernel "tree", one TreeAttention node).

    It applies RoPE to the packed q/k/v, reads past_key_{l} / past_value_{l} [B, nkv, capacity, hd] and writes
    the new rows into present_key_{l} / present_value_{l} at each row's past length: the runtime binds past and
    present to one buffer, so the cache is appended to in place.

    TreeAttention computes a query row from its visible keys alone, in their order (the past, then its ancestors'
    slots): the row comes out bit for bit the same in a one-slot plain step and in any verify step, at any slot of
    any tree, where GroupQueryAttention's one-row path and its column-dependent partial sums differ in the last bits
    (see quantize.PLAIN_STEP_SLOTS)."""
    qkv = linear(g, x, f"{prefix}.qkv", f"{prefix}.qkv")  # [B, T, (nh + 2 nkv) hd], q pre-scaled by 1/sqrt(hd)
    if pre.kernel == PROMPT_KERNEL:  # causal over each row's past and the prompt; the same cache binding
        out, _, _ = g.op(native.PROMPT_ATTENTION, qkv, f"past_key_{layer}", f"past_value_{layer}", "past_lengths",
                         pre.cos, pre.sin, domain=native.DOMAIN,
                         outputs=(f"{prefix}.attn", f"present_key_{layer}", f"present_value_{layer}"),
                         num_heads=d.num_heads, kv_num_heads=d.num_kv_heads)
        return linear(g, out, f"{prefix}.o", f"{prefix}.o")
    if pre.kernel == "tree":  # the same inputs and cache binding; a query row's arithmetic is its own (trtspec/native)
        out, _, _ = g.op(native.TREE_ATTENTION, qkv, f"past_key_{layer}", f"past_value_{layer}", "past_lengths",
                         pre.position_ids, pre.tree_mask, pre.cos, pre.sin, domain=native.DOMAIN,
                         outputs=(f"{prefix}.attn", f"present_key_{layer}", f"present_value_{layer}"),
                         num_heads=d.num_heads, kv_num_heads=d.num_kv_heads)
        return linear(g, out, f"{prefix}.o", f"{prefix}.o")
    if pre.attention_pads:  # rows of zeros up to the attention's T' (their K/V land after the fed rows', unread)
        qkv = g.op("Pad", qkv, pre.attention_pads)
    out, _, _ = g.ms("GroupQueryAttention", qkv, "", "", f"past_key_{layer}", f"past_value_{layer}", pre.seqlens_k,
                     pre.total, pre.cos, pre.sin, pre.position_ids, pre.bias, "", "", "", "", "", pre.query_lengths,
                     outputs=(f"{prefix}.attn_padded" if pre.rows else f"{prefix}.attn", f"present_key_{layer}",
                              f"present_value_{layer}"),
                     num_heads=d.num_heads, kv_num_heads=d.num_kv_heads, do_rotary=1, scale=1.0)
    if pre.rows:
        out = g.op("Slice", out, g.const([0]), pre.rows, g.const([1]), name=f"{prefix}.attn")
    return linear(g, out, f"{prefix}.o", f"{prefix}.o")


def mlp(g: Graph, x: str, prefix: str, intermediate: int) -> str:
    """SwiGLU with gate and up in one MatMul: down(silu(gate) * up); TRT `fc` = gate, TRT `gate` = up. On BlockMatMul
    the silu and the product happen in the matmul's own tiles (gated), so the gate_up product is never stored."""
    weight = f"{prefix}.gate_up.weight"
    if (weight in g.weights.quantized and runs_block_matmul(g, weight) and not g.weights.quantized[weight].offsets
            and f"{prefix}.gate_up.bias" not in g.weights and intermediate % 16 == 0
            and not (g.fp32_copies and f"{weight}.fp32" in g.weights)):
        act = matmul_nbits(g, x, weight, f"{prefix}.gate_up", gated=True)
        return linear(g, act, f"{prefix}.down", f"{prefix}.down")
    gate, up = g.op("Split", linear(g, x, f"{prefix}.gate_up", f"{prefix}.gate_up"),
                    g.const([intermediate, intermediate]), axis=-1, outputs=2, name=f"{prefix}.gate_up_split")
    act = g.op("Mul", gate, g.op("Sigmoid", gate))
    return linear(g, g.op("Mul", act, up), f"{prefix}.down", f"{prefix}.down")


@dataclass(frozen=True)
class Residual:
    """The residual stream as x + delta, the Add left pending so the next norm fuses it (delta None: just x)."""

    x: str
    delta: str | None = None

    def norm(self, g: Graph, weight: str, eps: float, name: str) -> tuple[str, str]:
        """(RMSNorm(x + delta) · weight, x + delta) in one SkipSimplifiedLayerNormalization when an Add is pending (in
        a --native-matmul graph, trtspec's SkipRMSNorm, which runs a decode step's one row on the calling thread)."""
        if self.delta is None:
            return rms_norm(g, self.x, weight, eps, name), self.x
        if g.native_products:
            normed, total = g.op(native.SKIP_RMS_NORM, self.x, self.delta, g.w(weight), domain=native.DOMAIN,
                                 epsilon=eps, outputs=(f"{name}_0", f"{name}_3"), name=name)
            return normed, total
        # outputs 1 and 2 (mean, inverse std) left unnamed: nothing reads them, ONNX Runtime need not make them
        normed, _, _, total = g.ms("SkipSimplifiedLayerNormalization", self.x, self.delta, g.w(weight), epsilon=eps,
                                   outputs=(f"{name}_0", "", "", f"{name}_3"), name=name)
        return normed, total

    def value(self, g: Graph, name: str) -> str:
        return g.op("Add", self.x, self.delta, name=name) if self.delta is not None else g.op("Identity", self.x,
                                                                                               name=name)


def decoder_layer(g: Graph, d: Dims, pre: Prelude, x: Residual, prefix: str, layer: int,
                  intermediate: int) -> Residual:
    """Pre-norm decoder layer; a layer without `<prefix>.input_norm.weight` (EAGLE's first) skips that norm."""
    norm = f"{prefix}.input_norm.weight"
    if norm in g.weights:
        h, stream = x.norm(g, norm, d.eps, f"{prefix}.input_norm")
    else:
        h = stream = x.value(g, f"{prefix}.input")
    h, stream = Residual(stream, attention(g, d, pre, h, prefix, layer)).norm(g, f"{prefix}.post_norm.weight", d.eps,
                                                                             f"{prefix}.post_norm")
    return Residual(stream, mlp(g, h, prefix, intermediate))


def logits(g: Graph, hidden: str, weight: str, name: str | None = None) -> str:
    """hidden [..., H] → [..., V] through a vocabulary matrix stored [V, H] (the embedding's layout).

    A plain MatMul over the Transpose of the stored matrix: ONNX Runtime folds that Transpose once when the session
    loads and prepacks the result, which decodes faster than a transB FusedMatMul over [V, H]. A quantized matrix:
    MatMulNBits."""
    if weight in g.weights.quantized:
        return matmul_nbits(g, hidden, weight, name)
    return g.op("MatMul", hidden, g.op("Transpose", g.w(weight), perm=[1, 0]), name=name)


def embed(g: Graph, ids: str, *, tied: bool) -> str:
    """Token embeddings [B, T, H], rows of a [V, H] table (a tied one is the lm_head's). A tied quantized lm_head
    is gathered from and dequantized row by row (GatherBlockQuantized over the same bytes, see `tie_quantized`)."""
    if tied and "embedding.q" in g.weights:
        q = g.weights.quantized["lm_head.weight"]
        rows = g.ms("GatherBlockQuantized", g.w("embedding.q"), ids, g.w("embedding.scales"),
                    name=None if q.offsets else "embedding", bits=q.bits, block_size=q.block_size, gather_axis=0,
                    quantize_axis=1)
        if not q.offsets:
            return rows
        # the min scheme: each block of a row + its offset (the lm_head's [blocks, V] table, gathered by column)
        gathered = g.op("Cast", g.op("Gather", g.w("lm_head.weight.offsets"), ids, axis=1), to=TensorProto.FLOAT)
        offsets = g.op("Unsqueeze", g.op("Transpose", gathered, perm=[1, 2, 0]), g.const([-1]))  # [B, T, blocks, 1]
        blocked = g.op("Reshape", rows, g.const([0, 0, q.blocks, q.block_size]))
        return g.op("Reshape", g.op("Add", blocked, offsets), g.const([0, 0, q.k]), name="embedding")
    return g.op("Gather", g.w("lm_head.weight" if tied else "embedding.weight"), ids, axis=0, name="embedding")


def tie_quantized(wf: WeightFile) -> bool:
    """Let a tied embedding read the quantized lm_head (`embedding.q` [V, k·bits/8], `embedding.scales` [V, blocks]
    over the same bytes); False when the rows are padded (k not a multiple of the block size): keep an fp32 table."""
    q = wf.quantized["lm_head.weight"]
    if q.k % q.block_size:
        return False
    wf.alias("embedding.q", "lm_head.weight.q", (q.n, q.k * q.bits // 8))
    wf.alias("embedding.scales", "lm_head.weight.scales", (q.n, q.blocks))
    return True
