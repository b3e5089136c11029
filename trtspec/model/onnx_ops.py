"""Building blocks of the CPU engine's ONNX graphs: a node builder, the external weight file, and the
decoder layer (fused q/k/v and gate/up MatMuls, RMSNormalization, RotaryEmbedding, masked attention that reads
the cache in place through FusedMatMul, residual Adds fused into SkipSimplifiedLayerNormalization).

Everything here is plain `onnx.helper` over numpy; no torch. Shapes use B = batch, T = new tokens,
P = past tokens, S = P + T, nh / nkv = query / KV heads, hd = head size, rep = nh // nkv.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 23  # RMSNormalization and RotaryEmbedding are standard from opset 23 (ONNX Runtime >= 1.22 runs them)
IR_VERSION = 10
MS_DOMAIN = "com.microsoft"  # FusedMatMul, SkipSimplifiedLayerNormalization: ONNX Runtime contrib ops, CPU kernels
# ONNX Runtime memory-maps an external initializer whose offset is page aligned; it does so for large ones.
PAGE_ALIGN, PAGE_ALIGN_ABOVE, SMALL_ALIGN = 4096, 1 << 20, 64


class WeightFile:
    """One external-data file that every graph of a network points into: each weight is written once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("wb")
        self.protos: dict[str, TensorProto] = {}
        self.nbytes = 0  # bytes of tensor data (padding excluded)

    def add(self, name: str, array: np.ndarray) -> None:
        """Append `array` as float32 (C order) under `name`."""
        data = np.ascontiguousarray(array, dtype=np.float32)
        align = PAGE_ALIGN if data.nbytes > PAGE_ALIGN_ABOVE else SMALL_ALIGN
        offset = -(-self._file.tell() // align) * align
        self._file.write(b"\0" * (offset - self._file.tell()))
        self._file.write(data.tobytes())
        proto = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=data.shape,
                            data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(data.nbytes))):
            proto.external_data.add(key=key, value=value)
        self.protos[name] = proto
        self.nbytes += data.nbytes

    def __contains__(self, name: str) -> bool:
        return name in self.protos

    def close(self) -> None:
        self._file.close()


class Graph:
    """Accumulates nodes, inline constants and the weights they use; `model()` makes the ModelProto."""

    def __init__(self, weights: WeightFile):
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.used: dict[str, TensorProto] = {}
        self.consts: dict[tuple, str] = {}
        self._ids = itertools.count()

    def op(self, op_type: str, *inputs: str, name: str | None = None, outputs: int = 1, domain: str = "", **attrs):
        """Add a node; return its output name (or list of names when outputs > 1)."""
        base = name or f"{op_type.lower()}_{next(self._ids)}"
        outs = [base] if outputs == 1 else [f"{base}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"n_{base}", domain=domain, **attrs))
        return outs[0] if outputs == 1 else outs

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
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                                 producer_name="trtspec")


@dataclass(frozen=True)
class Dims:
    """Attention dimensions of one network (base or draft)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float

    @property
    def rep(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class Prelude:
    """Per-graph tensors every layer shares."""

    cos: str  # [B, T, hd/2]
    sin: str  # [B, T, hd/2]
    bias: str  # [B, 1, rep·T, S+1] additive mask: 0 = may attend, -inf = not; the last column is the sink
    sink: str  # [B, nkv, rep·T, 1] zero scores of the sink column
    split: str  # [3] = (P, T, 1): the score columns of past, new tokens and sink


def prelude(g: Graph, d: Dims, inv_freq: np.ndarray, past: str, tokens: int | None) -> Prelude:
    """RoPE angles from position_ids, the additive mask from attention_mask, and the shapes they need."""
    angles = g.op("Mul", g.op("Unsqueeze", g.op("Cast", "position_ids", to=TensorProto.FLOAT), g.const([-1])),
                  g.const(inv_freq, np.float32), name="rope_angles")  # [B, T, hd/2]
    cos, sin = g.op("Cos", angles, name="rope_cos"), g.op("Sin", angles, name="rope_sin")
    batch = g.op("Shape", "input_ids", start=0, end=1)  # [1]
    t = g.const([tokens]) if tokens is not None else g.op("Shape", "input_ids", start=1, end=2)
    rows = g.const([tokens * d.rep]) if tokens is not None else g.op("Mul", t, g.const([d.rep]))
    sink_shape = g.op("Concat", batch, g.const([d.num_kv_heads]), rows, g.const([1]), axis=0)
    sink = g.op("ConstantOfShape", sink_shape, value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
                name="sink_scores")
    split = g.op("Concat", g.op("Shape", past, start=0, end=1), t, g.const([1]), axis=0, name="score_split")
    return Prelude(cos, sin, _mask_bias(g, d), sink, split)


def _mask_bias(g: Graph, d: Dims) -> str:
    """attention_mask [B, T, S] → additive bias [B, 1, rep·T, S+1] with the sink column appended.

    A row that may attend to nothing (never the case in real steps) puts all its weight on the sink, whose
    value is zero, so it reads 0 like the reference instead of the NaN of a softmax over -inf only."""
    neg_inf = g.const([-np.inf], np.float32)
    bias = g.op("Where", "attention_mask", g.const([0.0], np.float32), neg_inf)  # [B, T, S]
    visible = g.op("ReduceMax", g.op("Cast", "attention_mask", to=TensorProto.FLOAT), g.const([-1]), keepdims=1)
    sink = g.op("Where", g.op("Cast", visible, to=TensorProto.BOOL), neg_inf, g.const([0.0], np.float32))
    full = g.op("Unsqueeze", g.op("Concat", bias, sink, axis=-1), g.const([1]))  # [B, 1, T, S+1]
    if d.rep == 1:
        return g.op("Identity", full, name="mask_bias")
    # the query rows of a KV group are r·T + t (r: the query head within the group), so the bias repeats over r
    return g.op("Tile", full, g.const([1, 1, d.rep, 1]), name="mask_bias")


def rms_norm(g: Graph, x: str, weight: str, eps: float, name: str) -> str:
    return g.op("RMSNormalization", x, g.w(weight), axis=-1, epsilon=eps, name=name)


def linear(g: Graph, x: str, weight: str, name: str) -> str:
    """x @ W (+ b): W is stored pre-transposed [in, out]; the bias, if the network has one, is `<weight>.bias`."""
    y = g.op("MatMul", x, g.w(f"{weight}.weight"), name=name)
    bias = f"{weight}.bias"
    return g.op("Add", y, g.w(bias), name=f"{name}_bias") if bias in g.weights else y


def attention(g: Graph, d: Dims, pre: Prelude, x: str, prefix: str, layer: int) -> str:
    """Masked attention of x [B, T, H] over [past | new tokens]; also yields new_key_{l} / new_value_{l}."""
    q, new_key, new_value = _project_qkv(g, d, pre, x, prefix, layer)
    out = _attend(g, pre, q, (f"past_key_{layer}", new_key), (f"past_value_{layer}", new_value), prefix)
    out = g.op("Transpose", g.op("Reshape", out, g.const([0, 0, d.rep, -1, d.head_dim])), perm=[0, 3, 1, 2, 4])
    return linear(g, g.op("Reshape", out, g.const([0, 0, d.num_heads * d.head_dim])), f"{prefix}.o", f"{prefix}.o")


def _project_qkv(g: Graph, d: Dims, pre: Prelude, x: str, prefix: str, layer: int) -> tuple[str, str, str]:
    """One MatMul for q/k/v, RoPE on q and k → q [B, nkv, rep·T, hd] (rows r·T + t), new K/V [T, B, nkv, hd]."""
    nh, nkv, hd = d.num_heads, d.num_kv_heads, d.head_dim
    qkv = linear(g, x, f"{prefix}.qkv", f"{prefix}.qkv")  # [B, T, (nh + 2 nkv) hd], q pre-scaled by 1/sqrt(hd)
    q, k, v = g.op("Split", qkv, g.const([nh * hd, nkv * hd, nkv * hd]), axis=-1, outputs=3, name=f"{prefix}.qkv_split")
    q = g.op("RotaryEmbedding", q, pre.cos, pre.sin, num_heads=nh, name=f"{prefix}.q_rope")
    k = g.op("RotaryEmbedding", k, pre.cos, pre.sin, num_heads=nkv, name=f"{prefix}.k_rope")
    new = [g.op("Transpose", g.op("Reshape", t, g.const([0, 0, nkv, hd])), perm=[1, 0, 2, 3], name=f"{kind}_{layer}")
           for t, kind in ((k, "new_key"), (v, "new_value"))]
    q = g.op("Transpose", g.op("Reshape", q, g.const([0, 0, nkv, d.rep, hd])), perm=[0, 2, 3, 1, 4])  # [B,nkv,rep,T,hd]
    return g.op("Reshape", q, g.const([0, 0, -1, hd]), name=f"{prefix}.q_grouped"), *new


def _attend(g: Graph, pre: Prelude, q: str, keys: tuple[str, str], values: tuple[str, str], prefix: str) -> str:
    """softmax(q K^T + bias) V over the past and the new tokens, kept apart so the cache is never concatenated.

    keys / values are (past [P, B, nkv, hd], new [T, B, nkv, hd]); FusedMatMul's transBatchB views them as
    [B, nkv, P | T, hd] and reads the strided cache in place (no Transpose copies). Returns [B, nkv, rep·T, hd]."""
    scores = [g.ms("FusedMatMul", q, k, transB=1, transBatchB=1) for k in keys]  # [B, nkv, rep·T, P | T]
    scores = g.op("Concat", *scores, pre.sink, axis=-1, name=f"{prefix}.scores")  # [B, nkv, rep·T, S+1]
    probs = g.op("Softmax", g.op("Add", scores, pre.bias), axis=-1, name=f"{prefix}.probs")
    p_past, p_new, _ = g.op("Split", probs, pre.split, axis=-1, outputs=3, name=f"{prefix}.probs_split")
    return g.op("Add", *(g.ms("FusedMatMul", p, v, transBatchB=1) for p, v in zip((p_past, p_new), values)),
                name=f"{prefix}.attn")


def mlp(g: Graph, x: str, prefix: str, intermediate: int) -> str:
    """SwiGLU with gate and up in one MatMul: down(silu(gate) * up); TRT `fc` = gate, TRT `gate` = up."""
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
        """(RMSNorm(x + delta) · weight, x + delta) in one SkipSimplifiedLayerNormalization when an Add is pending."""
        if self.delta is None:
            return rms_norm(g, self.x, weight, eps, name), self.x
        normed, _, _, total = g.ms("SkipSimplifiedLayerNormalization", self.x, self.delta, g.w(weight), epsilon=eps,
                                   outputs=4, name=name)
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
    """hidden [..., H] → [..., V] through a vocabulary matrix stored [V, H] (the embedding's layout); ONNX Runtime
    prepacks the transposed matrix once, as it does a plain MatMul's."""
    return g.ms("FusedMatMul", hidden, g.w(weight), transB=1, name=name)


def embed(g: Graph, ids: str, *, tied: bool) -> str:
    """Token embeddings [B, T, H], rows of a [V, H] table (a tied one is the lm_head's)."""
    return g.op("Gather", g.w("lm_head.weight" if tied else "embedding.weight"), ids, axis=0, name="embedding")
