"""Export a TensorRT-LLM checkpoint to the CPU engine's ONNX graphs (static-K profile); `onnx_check` validates
them and compares them with the torch reference.

Graphs: `context` (T dynamic, causal; logits of the last position only, hidden states of all) and `generation` (T dynamic, a tree mask: the runtime feeds it the engine's
slot profiles) over one shared `weights.bin`; for EAGLE also
`draft_context` / `draft_generation` over `draft_weights.bin`. Compute is float32 whatever the stored dtype;
a quantized build (`WeightPlan`) stores the matrices as int8 / int4 blocks that MatMulNBits reads.
Each layer's attention is one node (GroupQueryAttention, or trtspec's TreeAttention / PromptAttention) over a KV
buffer [B, nkv, capacity, hd] that the runtime binds as both past and present, so the new rows are written into the
cache in place (at each row's past length).
Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtspec.checkpoint.model_shape import REDRAFTER_ARCHITECTURES, ModelShape, ReDrafterNet
from trtspec.errors import BuildError
from trtspec.model.onnx_ops import (ATTENTION_KERNELS, HEAD_DIM_MULTIPLE, PROMPT_KERNEL, Dims, Graph, Residual,
                                    WeightFile, decoder_layer, embed, linear, logits, prelude, tie_quantized)
from trtspec.model.quantize import QuantSpec, min_step_slots, pack
from trtspec.progress import progress_bar

if TYPE_CHECKING:
    from trtspec.checkpoint.trtllm_reader import TrtllmCheckpoint

BASE_WEIGHTS, DRAFT_WEIGHTS = "weights.bin", "draft_weights.bin"
# Unfused tensors of a decoder layer: ONNX weight → TensorRT-LLM tensor below the layer prefix. q/k/v
# (attention.qkv) and gate/up (mlp.fc = HF gate_proj, mlp.gate = HF up_proj) are fused by _write_layer.
LAYER_TENSORS = {"input_norm.weight": "input_layernorm.weight", "post_norm.weight": "post_layernorm.weight",
                 "o.weight": "attention.dense.weight", "o.bias": "attention.dense.bias",
                 "down.weight": "mlp.proj.weight", "down.bias": "mlp.proj.bias"}


@dataclass(frozen=True)
class ExportedGraph:
    """One written graph and its I/O names, in order."""

    path: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: frozenset[str] = frozenset()  # the op types it holds

    @property
    def embeds_quantized_lm_head(self) -> bool:
        """Its token embedding gathers rows of the quantized lm_head (a tied embedding whose rows are whole blocks,
        onnx_ops.embed): what the graph computes, so the reference and the manifest follow it rather than guess. A
        draft with a reduced vocabulary keeps an fp32 table even when its checkpoint ties the two (its lm_head holds
        the draft vocabulary's rows only)."""
        return "GatherBlockQuantized" in self.ops


@dataclass(frozen=True)
class WeightPlan:
    """Which matrices a build quantizes: the target's linear layers (`base`), its lm_head (`lm_head`; a tied embedding
    gathers its rows), the Medusa heads / EAGLE draft (`drafter`); None: fp32. Norms, biases and untied embedding
    tables stay fp32 (a Gather reads few rows)."""

    base: QuantSpec | None = None
    drafter: QuantSpec | None = None
    lm_head: QuantSpec | None = None
    # the target's context graph reads fp32 copies of its quantized linear layers (the same dequantized values):
    # a prompt's rows run ONNX Runtime's fp32 GEMM instead of MatMulNBits, whose many-row int8 kernels are slower
    # on CPUs without VNNI; decode steps still read the blocks
    prefill_fp32: bool = False
    # the target's graphs run their quantized products (decoder layers and lm_head, prompt and decode steps) in
    # trtspec's BlockMatMul: the numbers MatMulNBits computes at accuracy level 4, faster on CPUs with AVX-512 VNNI
    native_matmul: bool = False

    @property
    def quantizes(self) -> bool:
        return any(spec is not None for spec in (self.base, self.drafter, self.lm_head))

    @property
    def attention_rows(self) -> int:
        """The fewest rows the target's generation graph runs attention over (onnx_ops.prelude): 2 when its matrices
        are quantized, so that a one-token plain step computes its token as a verify step's first slot does."""
        return max((min_step_slots(spec.dtype) for spec in (self.base, self.lm_head) if spec is not None), default=1)


@dataclass(frozen=True)
class _Layout:
    """What the weight writer found: tied embeddings, and which lm_head each Medusa head reads."""

    tied: bool
    medusa_lm_heads: tuple[str, ...] = ()
    draft_vocab: tuple[int, ...] | None = None  # EAGLE: the target ids the draft lm_head scores (None: all)
    redrafter: ReDrafterNet | None = None  # a ReDrafter checkpoint's drafter, written beside the base
    redrafter_columns: int | None = None  # the drafter's lm_head columns stored (redrafter_lm_head_columns)


# ---- weights ------------------------------------------------------------------------------------------------

class _Source:
    """Reads checkpoint tensors as float32 numpy, checking shapes and recording what was consumed."""

    def __init__(self, ckpt: TrtllmCheckpoint, advance=lambda: None):
        self.ckpt, self.used, self.advance = ckpt, set(), advance  # advance(): one layer / head written

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.ckpt:
            raise BuildError(f"{self.ckpt.directory}: no tensor {name}; config.json implies it (shape {list(shape)})")
        self.used.add(name)
        return self._check(name, self.ckpt.tensor(name), shape)

    def awq(self, name: str, shape: tuple[int, int], group_size: int):
        """A W4A16_AWQ layer as stored (checkpoint.awq.AwqMatrix), its shape and group size checked."""
        if name not in self.ckpt:
            raise BuildError(f"{self.ckpt.directory}: no tensor {name}; config.json implies it (shape {list(shape)})")
        if not self.ckpt.is_awq_weight(name):
            raise BuildError(f"{self.ckpt.directory}: tensor {name} has no weights_scaling_factor beside it; "
                             "quant_algo=W4A16_AWQ expects every linear layer quantized (exclude_modules?)")
        m = self.ckpt.awq_matrix(name)
        if m.shape != tuple(shape):
            raise BuildError(f"{self.ckpt.directory}: tensor {name} unpacks to {list(m.shape)}, but config.json "
                             f"implies {list(shape)}")
        if m.group_size != group_size:
            raise BuildError(f"{self.ckpt.directory}: tensor {name} has groups of {m.group_size} inputs; config.json "
                             f"quantization.group_size says {group_size}")
        self.used.add(name)
        return m

    def qkv(self, name: str, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
        self.get(name, (sum(s[0] for s in shapes), *shapes[0][1:]))  # presence and whole shape
        parts = zip("qkv", self.ckpt.split_qkv(name), shapes)
        return [self._check(f"{name} ({part} part)", tensor, shape) for part, tensor, shape in parts]

    def check_all_used(self, belongs) -> None:
        leftover = sorted(n for n in self.ckpt.names() if belongs(n) and n not in self.used)
        if leftover:
            raise BuildError(f"{self.ckpt.directory}: tensor {leftover[0]} (and {len(leftover) - 1} more) has no "
                             "place in the exported graph; config.json does not describe it (attn_bias / mlp_bias?)")

    def _check(self, name: str, tensor, shape: tuple[int, ...]) -> np.ndarray:
        if not tensor.dtype.is_floating_point:  # e.g. Medusa heads quantized by ModelOpt: read as floats, garbage
            raise BuildError(f"{self.ckpt.directory}: tensor {name} is {str(tensor.dtype).replace('torch.', '')}: "
                             "quantized weights the onnx backend cannot read (it quantizes floating-point weights "
                             "itself: --weights, --quantize-heads)")
        if tuple(tensor.shape) != tuple(shape):
            raise BuildError(f"{self.ckpt.directory}: tensor {name} has shape {list(tensor.shape)}, but config.json "
                             f"implies {list(shape)}")
        return tensor.float().numpy()


def _write_layer(src: _Source, wf: WeightFile, c: ModelShape, prefix: str, dst: str, *, input_norm: bool,
                 spec: QuantSpec | None = None) -> None:
    """One decoder layer; matrices stored [in, out] for MatMul (or quantized with `spec`), q/k/v fused
    [H, (nh + 2 nkv) hd] with q (and its bias) pre-scaled by 1/sqrt(hd) so the scores come out scaled (quantized:
    the q rows' scales carry the factor), gate/up fused [H, 2I]."""
    H, I = c.hidden_size, c.intermediate_size
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    scale, rows = np.float32(1 / math.sqrt(c.head_dim)), (q_out, kv_out, kv_out)
    if spec is not None and spec.prequantized:
        _write_awq_layer(src, wf, c, prefix, dst, spec, np.concatenate([np.full(q_out, scale, np.float32),
                                                                      np.ones(2 * kv_out, np.float32)]))
    elif spec is None:
        q, k, v = src.qkv(f"{prefix}.attention.qkv.weight", tuple((n, H) for n in rows))
        wf.add(f"{dst}.qkv.weight", np.concatenate([q * scale, k, v]).T)
    else:
        q, k, v = src.qkv(f"{prefix}.attention.qkv.weight", tuple((n, H) for n in rows))
        row_scale = np.concatenate([np.full(q_out, scale, np.float32), np.ones(2 * kv_out, np.float32)])
        wf.add_matrix(f"{dst}.qkv.weight", np.concatenate([q, k, v]), spec, fp32_layout="in_out", row_scale=row_scale)
    if c.qkv_bias:
        q, k, v = src.qkv(f"{prefix}.attention.qkv.bias", tuple((n,) for n in rows))
        wf.add(f"{dst}.qkv.bias", np.concatenate([q * scale, k, v]))
    if spec is None or not spec.prequantized:
        wf.add_matrix(f"{dst}.gate_up.weight", np.concatenate([src.get(f"{prefix}.mlp.{n}.weight", (I, H))
                                                               for n in ("fc", "gate")]), spec, fp32_layout="in_out")
    if c.mlp_bias:
        wf.add(f"{dst}.gate_up.bias", np.concatenate([src.get(f"{prefix}.mlp.{n}.bias", (I,)) for n in ("fc", "gate")]))
    shapes = {"input_norm.weight": (H,), "post_norm.weight": (H,), "o.weight": (H, q_out), "o.bias": (H,),
              "down.weight": (H, I), "down.bias": (H,)}
    present = {"input_norm.weight": input_norm, "o.bias": c.o_bias, "down.bias": c.mlp_bias}
    for name, trt in LAYER_TENSORS.items():
        if present.get(name, True):
            if name in ("o.weight", "down.weight"):
                if spec is None or not spec.prequantized:
                    wf.add_matrix(f"{dst}.{name}", src.get(f"{prefix}.{trt}", shapes[name]), spec, fp32_layout="in_out")
            else:
                tensor = src.get(f"{prefix}.{trt}", shapes[name])
                wf.add(f"{dst}.{name}", tensor.T)  # .T: no-op on vectors
    src.advance()


def _write_awq_layer(src: _Source, wf: WeightFile, c: ModelShape, prefix: str, dst: str, spec: QuantSpec,
                     qkv_row_scale: np.ndarray) -> None:
    """A W4A16_AWQ layer's qkv, gate/up (fc; gate rows, one shared pre-quant scale), o and down matrices from the
    checkpoint's codes and scales as stored (checkpoint/awq.py); the q rows' scales carry 1/sqrt(hd)."""
    H, I = c.hidden_size, c.intermediate_size
    qkv_rows = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    parts = {"qkv": ["attention.qkv"], "gate_up": ["mlp.fc", "mlp.gate"], "o": ["attention.dense"],
             "down": ["mlp.proj"]}
    shapes = {"attention.qkv": (qkv_rows, H), "mlp.fc": (I, H), "mlp.gate": (I, H),
              "attention.dense": (H, c.num_heads * c.head_dim), "mlp.proj": (H, I)}
    for name, trt_names in parts.items():
        ms = [src.awq(f"{prefix}.{t}.weight", shapes[t], spec.block_size) for t in trt_names]
        pre = ms[0].pre_scale
        if any((m.pre_scale is None) != (pre is None) or (pre is not None and not np.array_equal(m.pre_scale, pre))
               for m in ms[1:]):
            raise BuildError(f"{src.ckpt.directory}: {prefix}.mlp.fc and .mlp.gate have different "
                             "prequant_scaling_factor; TensorRT-LLM's fused gate MLP needs them equal, and so does "
                             "trtspec's fused gate/up product")
        packed = pack(np.concatenate([m.codes for m in ms]), np.concatenate([m.scales for m in ms]), 4,
                      spec.block_size)
        wf.add_prequantized(f"{dst}.{name}.weight", packed, spec.accuracy_level, pre_scale=pre,
                            row_scale=qkv_row_scale if name == "qkv" else None)


def _write_head(src: _Source, wf: WeightFile, embedding: str, lm_head: str, shape: tuple[int, int],
                spec: QuantSpec | None = None) -> bool:
    """Embedding and lm_head, both stored [V, H] (the lm_head quantized with `spec`); when equal (tied) only the
    lm_head is written (the embedding gathers its quantized rows where the blocks allow, else an fp32 table)."""
    table, head = src.get(embedding, shape), src.get(lm_head, shape)
    tied = np.array_equal(table, head)
    if not tied or (spec is not None and shape[1] % spec.block_size):
        wf.add("embedding.weight", table)
    del table
    wf.add_matrix("lm_head.weight", head, spec, fp32_layout="out_in")
    if tied and spec is not None:
        tied = tie_quantized(wf)
    return tied


def _write_base(src: _Source, wf: WeightFile, c: ModelShape, plan: WeightPlan = WeightPlan()) -> _Layout:
    H, V = c.hidden_size, c.vocab_size
    tied = _write_head(src, wf, "transformer.vocab_embedding.weight", "lm_head.weight", (V, H), plan.lm_head)
    wf.fp32_copies = plan.prefill_fp32 and plan.base is not None
    for layer in range(c.num_layers):
        _write_layer(src, wf, c, f"transformer.layers.{layer}", f"layers.{layer}", input_norm=True, spec=plan.base)
    wf.fp32_copies = False
    wf.add("ln_f.weight", src.get("transformer.ln_f.weight", (H,)))
    base_head = src.get("lm_head.weight", (V, H)) if c.num_medusa_heads else None
    heads = []
    for h in range(c.num_medusa_heads):
        for layer in range(c.num_medusa_layers):
            name = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            wf.add_matrix(f"medusa.{h}.{layer}.weight", src.get(f"{name}.weight", (H, H)), plan.drafter,
                          fp32_layout="in_out")
            wf.add(f"medusa.{h}.{layer}.bias", src.get(f"{name}.bias", (H,)))
        head = src.get(f"medusa_heads.{h}.lm_head.weight", (V, H))
        if np.array_equal(head, base_head):  # heads-only Medusa: the base lm_head, stored once
            shared = "lm_head.weight" if plan.drafter == plan.lm_head else "medusa.lm_head.weight"  # in its own format
            if shared not in wf:
                wf.add_matrix(shared, head, plan.drafter, fp32_layout="out_in")
            heads.append(shared)
        else:
            heads.append(f"medusa.{h}.lm_head.weight")
            wf.add_matrix(heads[-1], head, plan.drafter, fp32_layout="out_in")  # [V, H] like the base lm_head
        src.advance()
    redrafter, redrafter_columns = None, None
    if c.architecture in REDRAFTER_ARCHITECTURES:
        redrafter = ReDrafterNet.from_trtllm(src.ckpt.config)
        redrafter_columns = _write_redrafter(src, wf, redrafter, V, plan.drafter)
    src.check_all_used(lambda name: not name.startswith("eagle_nets."))
    return _Layout(tied, tuple(heads), redrafter=redrafter, redrafter_columns=redrafter_columns)


def _write_redrafter(src: _Source, wf: WeightFile, net: ReDrafterNet, vocab: int, spec: QuantSpec | None) -> int:
    """The drafter's matrices stored [in, out] for MatMul (or quantized with `spec`, as Medusa heads are), its
    lm_head [V, exit_dim] like the base's; it gathers token embeddings from the base's table."""
    H, E = net.hidden_size, net.exit_dim
    matrices = [("rnn_w", (H, H), False), ("rnn_u", (H, H), True)] if net.rnn else []
    if net.has_input_proj:
        matrices.append(("input_proj", (E, 2 * H), True))
    matrices += [(f"layers.{i}.linear", (E, E), True) for i in range(net.num_layers)]
    for name, shape, bias in matrices:
        wf.add_matrix(f"redrafter.{name}.weight", src.get(f"drafter.{name}.weight", shape), spec, fp32_layout="in_out")
        if bias:
            wf.add(f"redrafter.{name}.bias", src.get(f"drafter.{name}.bias", shape[:1]))
    lm_head = src.get("drafter.lm_head.weight", (vocab, E))
    columns = redrafter_lm_head_columns(lm_head, spec)
    wf.add_matrix("redrafter.lm_head.weight", lm_head[:, :columns], spec, fp32_layout="out_in")
    src.advance()
    return columns


def redrafter_lm_head_columns(lm_head: np.ndarray, spec: QuantSpec | None) -> int:
    """The lm_head columns the drafter's logits need: trailing columns that are zero in every row add nothing (a
    drafter trained with the base's lm_head on its first hidden columns, `trtspec train redrafter`, has half of
    them), so the graph reads only the others; kept whole blocks wide when the lm_head is quantized."""
    used = np.flatnonzero(np.any(lm_head != 0, axis=0))
    columns = int(used[-1]) + 1 if used.size else 1
    if spec is not None:
        columns = min(lm_head.shape[1], -(-columns // spec.block_size) * spec.block_size)
    return columns


def _draft_config(c: ModelShape) -> ModelShape:
    return dataclasses.replace(c.eagle, vocab_size=c.vocab_size)


def _write_draft(src: _Source, wf: WeightFile, c: ModelShape, plan: WeightPlan = WeightPlan()) -> _Layout:
    from trtspec.checkpoint.draft_vocab import read_checkpoint_vocab

    d, p = _draft_config(c), "eagle_nets.0"
    embedding, lm_head, shape = f"{p}.drafter.vocab_embedding.weight", f"{p}.lm_head.weight", (d.vocab_size,
                                                                                              d.hidden_size)
    vocab = read_checkpoint_vocab(src.ckpt.directory, d.vocab_size)
    spec = plan.drafter
    if vocab is None:
        tied = _write_head(src, wf, embedding, lm_head, shape, spec)
    else:  # the whole embedding (any token can be fed), the lm_head's rows of the draft vocabulary only
        tied = False
        wf.add("embedding.weight", src.get(embedding, shape))
        wf.add_matrix("lm_head.weight", src.get(lm_head, shape)[vocab.target_ids], spec, fp32_layout="out_in")
    wf.add_matrix("fc.weight", src.get(f"{p}.drafter.fc.weight", (d.hidden_size, 2 * d.hidden_size)), spec,
                  fp32_layout="in_out")
    wf.add("fc.bias", src.get(f"{p}.drafter.fc.bias", (d.hidden_size,)))
    for j in range(d.num_layers):
        _write_layer(src, wf, d, f"{p}.drafter.layers.{j}", f"layers.{j}", input_norm=j > 0, spec=spec)
    src.check_all_used(lambda name: name.startswith(f"{p}."))
    return _Layout(tied, draft_vocab=tuple(int(i) for i in vocab.target_ids) if vocab else None)


# ---- graphs ---------------------------------------------------------------------------------------------------

def _dims(c: ModelShape) -> Dims:
    return Dims(c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps)


def _inv_freq(c: ModelShape) -> np.ndarray:
    from trtspec.model.rope import rope_inv_freq  # torch, at build time only

    return rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling).numpy()  # [hd/2] float32


def _io(c: ModelShape, tree: bool, extra_inputs=(), logit_rows: int | None = None) -> tuple[list, list]:
    """Graph inputs and outputs over any number T of new tokens ("tokens"). Context graphs (tree False) take no
    positions or mask: they are causal after each row's past. `logit_rows`: logits for that many last positions
    (None: all T). Every KV tensor is [B, nkv, capacity, hd]; present_* is past_* with the new rows written."""
    t = "tokens"
    info = helper.make_tensor_value_info
    tree = [info("position_ids", TensorProto.INT64, ["batch", t]),
            info("tree_mask", TensorProto.BOOL, ["batch", t, t])] if tree else []
    inputs = [info("input_ids", TensorProto.INT64, ["batch", t]), *extra_inputs, *tree,
              info("past_lengths", TensorProto.INT32, ["batch"])]
    outs = [info("logits", TensorProto.FLOAT, ["batch", logit_rows or t, c.vocab_size]),
            info("hidden", TensorProto.FLOAT, ["batch", t, c.hidden_size])]
    kv = ["batch", c.num_kv_heads, "capacity", c.head_dim]
    for layer in range(c.num_layers):
        inputs += [info(f"past_{kind}_{layer}", TensorProto.FLOAT, kv) for kind in ("key", "value")]
        outs += [info(f"present_{kind}_{layer}", TensorProto.FLOAT, kv) for kind in ("key", "value")]
    return inputs, outs


def base_graph(c: ModelShape, layout: _Layout, wf: WeightFile, positions: int, *, tree: bool,
               attention_rows: int = 1, attention: str = "gqa", native_products: bool = False) -> onnx.ModelProto:
    """The base network over any number T of new tokens at positions below `positions`; a generation graph (tree)
    takes tree positions and mask, a context graph is causal. `attention_rows`, `attention` (the kernel): see
    prelude. `native_products`: the quantized products run BlockMatMul (onnx_ops.Graph)."""
    g = Graph(wf, fp32_copies=not tree)  # a prompt's rows: the layers' fp32 copies, where the build wrote them
    pre = prelude(g, _inv_freq(c), positions, tree=tree, attention_rows=attention_rows, kernel=attention)
    x = Residual(embed(g, "input_ids", tied=layout.tied))  # [B, T, H]
    g.native_products = native_products
    for layer in range(c.num_layers):
        x = decoder_layer(g, _dims(c), pre, x, f"layers.{layer}", layer, c.intermediate_size)
    hidden, _ = x.norm(g, "ln_f.weight", c.rms_norm_eps, "ln_f")
    g.op("Identity", hidden, name="hidden")
    if tree:
        logits(g, hidden, "lm_head.weight", name="logits")  # [B, T, V]: every draft slot is verified
    else:  # a prompt needs only its last position's logits: the lm_head over T rows is most of a long prefill
        last = g.op("Slice", hidden, g.const([-1]), g.const([np.iinfo(np.int64).max]), g.const([1]))  # [B, 1, H]
        logits(g, last, "lm_head.weight", name="logits")  # [B, 1, V]
    inputs, outputs = _io(c, tree, logit_rows=None if tree else 1)
    return g.model("trtspec_base", inputs, outputs)


def medusa_graph(c: ModelShape, layout: _Layout, wf: WeightFile) -> onnx.ModelProto:
    """Medusa heads over N final hidden states: `hidden` [N, H] → `medusa_logits` [heads, N, V].

    A separate graph so a step pays for the heads once, at the accepted slot only, and plain decoding not at
    all. Heads that share the base lm_head project together in one MatMul (one pass over the weights)."""
    g = Graph(wf)
    outs = [_medusa_resblocks(g, "hidden", h, c.num_medusa_layers) for h in range(c.num_medusa_heads)]
    head_logits = {}
    for lm in ("lm_head.weight", "medusa.lm_head.weight"):
        shared = [h for h, name in enumerate(layout.medusa_lm_heads) if name == lm]
        if not shared:
            continue
        stacked = g.op("Concat", *[g.op("Unsqueeze", outs[h], g.const([0])) for h in shared], axis=0)
        projected = logits(g, stacked, lm)  # [len(shared), N, V]
        for i, h in enumerate(shared):
            head_logits[h] = g.op("Slice", projected, g.const([i]), g.const([i + 1]), g.const([0]))
    for h, lm in enumerate(layout.medusa_lm_heads):
        if h not in head_logits:
            head_logits[h] = g.op("Unsqueeze", logits(g, outs[h], lm), g.const([0]))
    g.op("Concat", *[head_logits[h] for h in range(c.num_medusa_heads)], axis=0, name="medusa_logits")
    info = helper.make_tensor_value_info
    return g.model("trtspec_medusa_heads", [info("hidden", TensorProto.FLOAT, ["rows", c.hidden_size])],
                   [info("medusa_logits", TensorProto.FLOAT, [c.num_medusa_heads, "rows", c.vocab_size])])


def redrafter_graph(c: ModelShape, layout: _Layout, wf: WeightFile) -> onnx.ModelProto:
    """One step of ReDrafter's beam search over N beams (TensorRT-LLM redrafter_helper.py `_beam_search_candidates`):
    each beam's last token's embedding enters the recurrence, `next_state` = rnn_w(embedding) + has_state ·
    rnn_u(state) (without rnn: embedding + state, the state starting at zeros), and the drafter reads
    concat[hidden, next_state] → `logits` [N, V]. `hidden` [N, H] is the base's final hidden state at the position
    the beams grow from; `has_state` [N, 1] is 0 on the first step (upstream's rnn_embed without a previous state)."""
    net = layout.redrafter
    g = Graph(wf)
    ids = g.op("Unsqueeze", "tokens", g.const([1]))  # [N, 1]: embed takes [B, T]
    embedded = g.op("Squeeze", embed(g, ids, tied=layout.tied), g.const([1]))  # [N, H]
    if net.rnn:
        carried = g.op("Mul", linear(g, "state", "redrafter.rnn_u", "rnn_u"), "has_state")
        state = g.op("Add", linear(g, embedded, "redrafter.rnn_w", "rnn_w"), carried, name="next_state")
    else:
        state = g.op("Add", embedded, "state", name="next_state")
    x = g.op("Concat", "hidden", state, axis=-1)  # [N, 2H]
    if net.has_input_proj:
        x = linear(g, x, "redrafter.input_proj", "input_proj")
    for i in range(net.num_layers):
        y = linear(g, x, f"redrafter.layers.{i}.linear", f"layers.{i}")
        x = g.op("Add", x, g.op("Mul", y, g.op("Sigmoid", y)))
    if layout.redrafter_columns < net.exit_dim:  # the lm_head's trailing columns are zero: they add nothing
        x = g.op("Slice", x, g.const([0]), g.const([layout.redrafter_columns]), g.const([1]))
    logits(g, x, "redrafter.lm_head.weight", name="logits")  # [N, V]
    info, H = helper.make_tensor_value_info, c.hidden_size
    return g.model("trtspec_redrafter", [info("hidden", TensorProto.FLOAT, ["rows", H]),
                                         info("tokens", TensorProto.INT64, ["rows"]),
                                         info("state", TensorProto.FLOAT, ["rows", H]),
                                         info("has_state", TensorProto.FLOAT, ["rows", 1])],
                   [info("logits", TensorProto.FLOAT, ["rows", c.vocab_size]),
                    info("next_state", TensorProto.FLOAT, ["rows", H])])


def _medusa_resblocks(g: Graph, x: str, head: int, layers: int) -> str:
    """ResBlocks x + silu(x W + b) of one head."""
    for layer in range(layers):
        y = linear(g, x, f"medusa.{head}.{layer}", f"medusa.{head}.{layer}")
        x = g.op("Add", x, g.op("Mul", y, g.op("Sigmoid", y)))
    return x


def draft_graph(c: ModelShape, layout: _Layout, wf: WeightFile, positions: int, *, tree: bool) -> onnx.ModelProto:
    """The EAGLE drafter: fc(cat[embed, feature]), its layers (layer 0 without input norm), the lm_head.

    A context graph (committed entries) scores one row per batch row, `logit_rows` [B] (the last entry's: the next
    draft grows from it; a batch's rows are padded at the end), so extending by a whole prompt does not run the
    lm_head over every entry; a generation graph (tree nodes) scores every row."""
    d = _draft_config(c)
    g = Graph(wf)
    pre = prelude(g, _inv_freq(d), positions, tree=tree)
    x = Residual(linear(g, g.op("Concat", embed(g, "input_ids", tied=layout.tied), "features", axis=-1), "fc", "fc"))
    for j in range(d.num_layers):
        x = decoder_layer(g, _dims(d), pre, x, f"layers.{j}", j, d.intermediate_size)
    hidden = x.value(g, "hidden")  # [B, T, H]
    scored = hidden if tree else _rows_of(g, hidden, "logit_rows")  # [B, T or 1, H]
    if layout.draft_vocab is None:
        logits(g, scored, "lm_head.weight", name="logits")  # the lm_head: [B, T or 1, V]
    else:
        _draft_vocab_logits(g, scored, layout.draft_vocab, c.vocab_size)
    extra = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "tokens", d.hidden_size])]
    if not tree:
        extra.append(helper.make_tensor_value_info("logit_rows", TensorProto.INT64, ["batch"]))
    inputs, outputs = _io(d, tree, extra_inputs=extra, logit_rows=None if tree else 1)
    return g.model("trtspec_eagle_draft", inputs, outputs)


def _rows_of(g: Graph, x: str, rows: str) -> str:
    """x [B, T, H] at one row per batch row, `rows` [B] (int64) → [B, 1, H]."""
    index = g.op("Unsqueeze", rows, g.const([1, 2]))  # [B, 1, 1]
    shape = g.op("Concat", g.op("Shape", x, start=0, end=1), g.const([1]), g.op("Shape", x, start=2, end=3), axis=0)
    return g.op("GatherElements", x, g.op("Expand", index, shape), axis=1)


def _draft_vocab_logits(g: Graph, hidden: str, target_ids: tuple[int, ...], vocab_size: int) -> str:
    """The lm_head over the draft vocabulary only ([B, T, Vd]: it reads Vd rows, not V), scattered into full
    [B, T, V] logits that are −inf elsewhere, so the runtime and the proposers see target ids as always."""
    scored = logits(g, hidden, "lm_head.weight")  # [B, T, Vd]
    rows = g.op("Slice", g.op("Shape", hidden), g.const([0]), g.const([2]))  # [B, T]
    minus_inf = onnx.numpy_helper.from_array(np.array([-np.inf], np.float32), "value")
    full = g.op("ConstantOfShape", g.op("Concat", rows, g.const([vocab_size]), axis=0), value=minus_inf)
    ids = g.op("Expand", g.const(np.asarray(target_ids, np.int64).reshape(1, 1, -1)), g.op("Shape", scored))
    return g.op("ScatterElements", full, ids, scored, axis=2, name="logits")


# ---- export, check, compare ---------------------------------------------------------------------------------

def export_graphs(ckpt: TrtllmCheckpoint, out_dir: Path, *, max_positions: int, weights: WeightPlan = WeightPlan(),
                  attention: str = "gqa") -> dict[str, ExportedGraph]:
    """Write context.onnx / generation.onnx over weights.bin (and the EAGLE draft pair over draft_weights.bin).

    Context and generation graphs take any number of new tokens T: the runtime feeds a generation graph the slot
    counts of the engine's profiles, one session holding one prepacked copy of the weights for all of them.
    `max_positions` sizes the graphs' RoPE tables: every position a step uses must be below it. `weights`: which
    matrices to quantize (one tensor in memory at a time; a progress bar over the layers and heads when any is).
    `attention`: the target generation graph's attention kernel (onnx_ops.ATTENTION_KERNELS; "tree" runs unpadded);
    context graphs and the EAGLE draft's run GroupQueryAttention."""
    if attention not in ATTENTION_KERNELS:
        raise BuildError(f"attention kernel {attention!r}: expected one of {', '.join(ATTENTION_KERNELS)}")
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        raise BuildError(f"max_positions must be a positive int, got {max_positions!r}")
    c, out_dir = ModelShape.from_trtllm(ckpt.config), Path(out_dir)
    check_supported(c)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [("", BASE_WEIGHTS, _write_base, base_graph)]
    if c.eagle is not None:
        _check_eagle_copies(ckpt, c)
        parts.append(("draft_", DRAFT_WEIGHTS, _write_draft, draft_graph))
    graphs = {}
    quantizing = (weights.base is not None or weights.lm_head is not None
                  or (weights.drafter is not None and (c.eagle or c.num_medusa_heads
                                                       or c.architecture in REDRAFTER_ARCHITECTURES)))
    total = (c.num_layers + c.num_medusa_heads + (c.eagle.num_layers if c.eagle is not None else 0)
             + (c.architecture in REDRAFTER_ARCHITECTURES))
    with progress_bar("quantizing weights", total=total, enabled=bool(quantizing)) as advance:
        for role_prefix, file_name, write, build in parts:
            wf = WeightFile(out_dir / file_name)
            try:
                layout = write(_Source(ckpt, advance), wf, c, weights)
            finally:
                wf.close()
            # the target's generation graph runs TreeAttention, or pads GroupQueryAttention's rows (quantized
            # matrices); the draft's steps need not compute like anything else
            target = build is base_graph
            kernel = attention if target else "gqa"
            rows = weights.attention_rows if target and kernel == "gqa" else 1
            graphs.update(_build_graphs(c, layout, wf, role_prefix, build, out_dir, max_positions, rows, kernel,
                                        native_products=target and weights.native_matmul))
    return graphs


def _build_graphs(c: ModelShape, layout: _Layout, wf: WeightFile, role_prefix: str, build, out_dir: Path,
                  max_positions: int, attention_rows: int = 1, attention: str = "gqa", *,
                  native_products: bool = False) -> dict[str, ExportedGraph]:
    graphs = {}
    for role, tree in (("context", False), ("generation", True)):
        extra = {"attention_rows": attention_rows} if attention_rows > 1 and tree else {}
        if attention == "tree":  # trtspec's kernels: TreeAttention in decode steps, PromptAttention in prompts
            extra["attention"] = attention if tree else PROMPT_KERNEL
        if native_products:
            extra["native_products"] = True
        graphs[role_prefix + role] = _save(build(c, layout, wf, max_positions, tree=tree, **extra),
                                           out_dir / f"{role_prefix}{role}.onnx")
    if layout.medusa_lm_heads:
        graphs["medusa"] = _save(medusa_graph(c, layout, wf), out_dir / "medusa.onnx")
    if layout.redrafter is not None:
        graphs["redrafter"] = _save(redrafter_graph(c, layout, wf), out_dir / "redrafter.onnx")
    return graphs


def check_supported(c: ModelShape) -> None:
    """Reject a network whose attention ONNX Runtime's CPU GroupQueryAttention kernel cannot run."""
    for what, dims in (("model", c), ("EAGLE draft", c.eagle)):
        if dims is not None and dims.head_dim % HEAD_DIM_MULTIPLE:
            raise BuildError(f"the {what}'s head_dim is {dims.head_dim}; the onnx backend's attention (ONNX Runtime "
                             f"GroupQueryAttention on CPU) needs a multiple of {HEAD_DIM_MULTIPLE}")


def _check_eagle_copies(ckpt: TrtllmCheckpoint, c: ModelShape) -> None:
    from trtspec.model.eagle_draft import check_identical_copies  # torch, at build time only

    check_identical_copies(ckpt, c.num_eagle_layers)


def _save(model: onnx.ModelProto, path: Path) -> ExportedGraph:
    onnx.save_model(model, str(path))
    return ExportedGraph(path, tuple(i.name for i in model.graph.input), tuple(o.name for o in model.graph.output),
                         frozenset(n.op_type for n in model.graph.node))
