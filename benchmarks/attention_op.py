"""One layer's attention alone: trtspec's TreeAttention (com.trtspec) against ONNX Runtime's GroupQueryAttention
fed as the engine's generation graph feeds it (packed q/k/v, do_rotary=1, the tree as an additive bias over the
absolute key columns, past and present bound to one buffer). `.venv/bin/python benchmarks/attention_op.py` prints a table.

Both ops (and, for one slot, GroupQueryAttention padded to two rows, as quantized engines run a plain step today:
model/onnx_ops.py `prelude(attention_rows=2)`) sit in one graph over their own caches, so they run in one session
with one thread pool (two sessions' spinning pools would take each other's cores) and every run times each of them
once: interleaved by construction. ONNX Runtime's profiler gives each node's kernel time; the table shows medians.
Numbers only with a quiet machine (run under `flock -x /tmp/bench.lock` on a shared one); nothing here asserts times.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtspec.model.tree_attention_graph import SMOLLM2, AttentionShape

TREE = "tree_attention"
GQA = "group_query_attention"
GQA_PADDED = "group_query_attention_2rows"


@dataclass(frozen=True)
class OpTime:
    """One op's kernel time at one batch and slot count: the median over `runs` runs, in microseconds."""

    op: str
    batch: int
    slots: int
    past: int
    median_us: float
    runs: int


def graph(shape: AttentionShape, batch: int, slots: int, capacity: int):
    """The benchmark graph: TreeAttention, GroupQueryAttention, and (slots 1) GroupQueryAttention over 2 rows."""
    import onnx
    from onnx import TensorProto, helper

    from trtspec.native import DOMAIN, TREE_ATTENTION

    nh, nkv, hd = shape.num_heads, shape.kv_num_heads, shape.head_size
    cache = [batch, nkv, capacity, hd]
    f32, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("cos_cache", f32, [capacity, hd // 2]),
              helper.make_tensor_value_info("sin_cache", f32, [capacity, hd // 2])]
    outputs, nodes = [], []

    def tensor(name, kind, dims):
        inputs.append(helper.make_tensor_value_info(name, kind, dims))
        return name

    def cache_pair(prefix):
        names = []
        for kind in ("key", "value"):
            names.append(tensor(f"{prefix}_past_{kind}", f32, cache))
            outputs.append(helper.make_tensor_value_info(f"{prefix}_present_{kind}", f32, cache))
        return names

    def attn_output(prefix, rows):
        outputs.insert(0, helper.make_tensor_value_info(f"{prefix}_attn", f32, [batch, rows, nh * hd]))
        return [f"{prefix}_attn", f"{prefix}_present_key", f"{prefix}_present_value"]

    # TreeAttention
    qkv = tensor("qkv", f32, [batch, slots, shape.qkv_width])
    tensor("position_ids", i64, [batch, slots])
    key, value = cache_pair(TREE)
    nodes.append(helper.make_node(
        TREE_ATTENTION, [qkv, key, value, tensor("past_lengths", i32, [batch]), "position_ids",
                         tensor("tree_mask", TensorProto.BOOL, [batch, slots, slots]), "cos_cache", "sin_cache"],
        attn_output(TREE, slots), name=TREE, domain=DOMAIN, num_heads=nh, kv_num_heads=nkv))

    # GroupQueryAttention as model/onnx_ops.py `attention` feeds it (inputs 11-15 absent, 16 the query lengths)
    def gqa(prefix, rows, qkv_name, positions):
        key, value = cache_pair(prefix)
        ins = [qkv_name, "", "", key, value, tensor(f"{prefix}_seqlens_k", i32, [batch]),
               tensor(f"{prefix}_total_sequence_length", i32, []), "cos_cache", "sin_cache", positions,
               tensor(f"{prefix}_attention_bias", f32, [batch, 1, rows, "total"]), "", "", "", "", "",
               tensor(f"{prefix}_query_lengths", i32, [batch])]
        nodes.append(helper.make_node("GroupQueryAttention", ins, attn_output(prefix, rows), name=prefix,
                                      domain="com.microsoft", num_heads=nh, kv_num_heads=nkv, do_rotary=1, scale=1.0))

    gqa(GQA, slots, qkv, "position_ids")
    if slots == 1:
        gqa(GQA_PADDED, 2, tensor("qkv_2rows", f32, [batch, 2, shape.qkv_width]),
            tensor("position_ids_2rows", i64, [batch, 2]))
    graph = helper.make_graph(nodes, "attention_ops", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid(DOMAIN, 1),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def star_mask(slots: int) -> np.ndarray:
    """A verify step's tree at its widest: a root and its children (a star), each slot sees the root and itself."""
    mask = np.eye(slots, dtype=bool)
    mask[:, 0] = True
    return mask


def feeds(shape: AttentionShape, batch: int, slots: int, past: int, capacity: int,
          rng: np.random.Generator, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Inputs of `graph`: random q/k/v and caches, every row `past` tokens long, the tree `mask` [T, T] (default: a
    star, each slot sees the root and itself) with each slot's depth as its position."""
    hd = shape.head_size
    half = hd // 2
    angles = np.arange(capacity)[:, None] * (1.0 / 10000.0 ** (np.arange(half) / half))[None, :]
    mask = star_mask(slots) if mask is None else mask
    depth = mask.sum(axis=1) - 1
    out = {"cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32),
           "qkv": rng.standard_normal((batch, slots, shape.qkv_width)).astype(np.float32) * 0.5,
           "position_ids": np.tile(past + depth, (batch, 1)).astype(np.int64),
           "past_lengths": np.full(batch, past, np.int32), "tree_mask": np.broadcast_to(mask, (batch, slots, slots))}
    cache = rng.standard_normal((batch, shape.kv_num_heads, capacity, hd)).astype(np.float32)

    def gqa_feeds(prefix, rows, mask):
        total = past + rows
        bias = np.full((batch, 1, rows, total), -np.inf, np.float32)
        bias[..., :past] = 0.0
        bias[..., past:] = np.where(mask, 0.0, -np.inf)
        return {f"{prefix}_seqlens_k": np.full(batch, total - 1, np.int32),
                f"{prefix}_total_sequence_length": np.array(total, np.int32),
                f"{prefix}_attention_bias": bias, f"{prefix}_query_lengths": np.full(batch, rows, np.int32)}

    out |= gqa_feeds(GQA, slots, mask)
    if slots == 1:  # the second row: zeros that see only the past (and themselves), seen by nobody
        out["qkv_2rows"] = np.concatenate([out["qkv"], np.zeros_like(out["qkv"])], axis=1)
        out["position_ids_2rows"] = np.concatenate([out["position_ids"], np.zeros((batch, 1), np.int64)], axis=1)
        out |= gqa_feeds(GQA_PADDED, 2, np.eye(2, dtype=bool))
    for prefix in (TREE, GQA) + ((GQA_PADDED,) if slots == 1 else ()):
        out[f"{prefix}_past_key"] = cache.copy()
        out[f"{prefix}_past_value"] = cache.copy()
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def measure(shape: AttentionShape = SMOLLM2, *, batch: int = 1, slots: int = 1, past: int = 443, runs: int = 400,
            warmup: int = 30, threads: int = 2, spin: bool = True, capacity: int = 1024) -> list[OpTime]:
    """Kernel medians of each op over `runs` runs of the benchmark graph (after `warmup`), with the engine's
    session options (`threads` intra-op threads, spinning as asked, denormals flushed)."""
    import onnxruntime as ort

    from trtspec.model.ort_session import session_options
    from trtspec.native import register

    options = session_options(threads=threads, spin=spin)
    register(options)
    with tempfile.TemporaryDirectory(prefix="trtspec-attention-op-") as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(graph(shape, batch, slots, capacity).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        inputs = feeds(shape, batch, slots, past, capacity, np.random.default_rng(0))
        io = session.io_binding()
        for name, array in inputs.items():
            io.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        attn = {}
        for out in session.get_outputs():
            if out.name.endswith("_attn"):
                attn[out.name] = np.empty(out.shape, np.float32)
                io.bind_output(out.name, "cpu", 0, np.float32, out.shape, attn[out.name].ctypes.data)
            else:  # present_* on its past_* buffer: the cache appended in place, as the runtime binds it
                past_array = inputs[out.name.replace("_present_", "_past_")]
                io.bind_output(out.name, "cpu", 0, np.float32, list(past_array.shape), past_array.ctypes.data)
        for _ in range(warmup + runs):
            session.run_with_iobinding(io)
        events = json.loads(Path(session.end_profiling()).read_text())
    kernel_us: dict[str, list[float]] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            kernel_us.setdefault(name.removesuffix("_kernel_time"), []).append(float(event["dur"]))
    return [OpTime(op, batch, slots, past, statistics.median(times[warmup:]), len(times) - warmup)
            for op, times in sorted(kernel_us.items())]


def main() -> None:
    load = os.getloadavg()
    print(f"one layer's attention, SmolLM2 shapes (nh 9, nkv 3, hd 64), 2 threads spinning; kernel medians (us); "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'batch':>5} {'slots':>5} {'past':>5} {'TreeAttention':>14} {'GQA':>8} {'GQA 2 rows':>11} {'Tree/GQA':>9}")
    for batch in (1, 4):
        for slots in (1, 2, 5, 17):
            times = {t.op: t.median_us for t in measure(batch=batch, slots=slots)}
            padded = f"{times[GQA_PADDED]:11.1f}" if GQA_PADDED in times else f"{'':>11}"
            print(f"{batch:5d} {slots:5d} {443:5d} {times[TREE]:14.1f} {times[GQA]:8.1f} {padded} "
                  f"{times[TREE] / times[GQA]:9.2f}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
