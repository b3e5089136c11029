"""Conversion streams tensor by tensor: peak memory grows with the largest tensor, not with the shard."""

from __future__ import annotations

from benchmarks.convert_memory import measure
from trtspec.testing import TinyModel


def test_convert_peak_rss_stays_far_below_the_shard(tmp_path):
    # 16 layers of ~12 MB tensors in one ~190 MB shard; the largest tensor is 8 MB.
    model = TinyModel(hidden_size=512, num_layers=16, num_heads=8, num_kv_heads=2, intermediate_size=1536,
                      vocab_size=4096, dtype="float32")
    m = measure(model, tmp_path, ["--tp-size", "2"])
    growth = m["peak_rss_bytes"] - m["baseline_rss_bytes"]
    assert m["largest_shard_bytes"] > 150e6
    assert growth < 0.3 * m["largest_shard_bytes"], m
