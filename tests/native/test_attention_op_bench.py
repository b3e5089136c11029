"""The attention micro-benchmark's graph (benchmarks/attention_op.py): TreeAttention and GroupQueryAttention side by
side over the same inputs, GroupQueryAttention fed as the engine's generation graph feeds it. Both compute the same
attention (RoPE convention, tree bias, cache rows), so the benchmark compares like with like and the op can take
GroupQueryAttention's place; and the benchmark runs (its times are not asserted)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from benchmarks import attention_op
from trtspec.model.ort_session import session_options
from trtspec.native import register
from trtspec.model.tree_attention_graph import SMOLLM2


def tree_of(parents: list[int]) -> np.ndarray:
    mask = np.eye(len(parents), dtype=bool)
    for r in range(len(parents)):
        a = parents[r]
        while a >= 0:
            mask[r, a] = True
            a = parents[a]
    return mask


@pytest.mark.parametrize("parents", [[-1], [-1, 0, 0, 1, 3, 2]], ids=["one slot", "tree"])
def test_tree_attention_computes_what_group_query_attention_computes(parents):
    batch, past, capacity = 2, 37, 64
    options = session_options(threads=2, spin=False)
    register(options)
    model = attention_op.graph(SMOLLM2, batch, len(parents), capacity)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = attention_op.feeds(SMOLLM2, batch, len(parents), past, capacity, np.random.default_rng(0),
                               mask=tree_of(parents))
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    tree, gqa = attention_op.TREE, attention_op.GQA
    np.testing.assert_allclose(out[f"{tree}_attn"], out[f"{gqa}_attn"], rtol=1e-4, atol=1e-5)
    rows = past + len(parents)  # GroupQueryAttention leaves the rows after those unwritten in a separate buffer
    for kind in ("key", "value"):  # the past as it was, the new rows (keys rotated) alike
        ours, theirs = out[f"{tree}_present_{kind}"], out[f"{gqa}_present_{kind}"]
        np.testing.assert_allclose(ours[:, :, :rows], theirs[:, :, :rows], rtol=1e-5, atol=1e-6)
    if len(parents) == 1:  # the 2-row padding quantized engines use today: its first row is the same token
        np.testing.assert_allclose(out[f"{tree}_attn"], out[f"{attention_op.GQA_PADDED}_attn"][:, :1], rtol=1e-4,
                                   atol=1e-5)


def test_the_benchmark_reports_a_kernel_time_per_op():
    times = attention_op.measure(batch=1, slots=1, past=20, runs=3, warmup=1, spin=False, capacity=64)
    assert {t.op for t in times} == {attention_op.TREE, attention_op.GQA, attention_op.GQA_PADDED}
    assert all(t.runs == 3 and t.median_us > 0 for t in times)
