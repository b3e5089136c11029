"""Tensor-parallel split rules (TensorRT-LLM convert_utils conventions) and their inverse."""

from __future__ import annotations

import pytest
import torch

from trtspec.checkpoint.sharding import QkvLayout, Split, pad_vocab_size, shard, shard_shape, split_of, unshard
from trtspec.errors import CheckpointError


@pytest.mark.parametrize("name,split", [
    ("transformer.layers.3.attention.qkv.weight", Split.QKV),
    ("transformer.layers.3.attention.qkv.bias", Split.QKV),
    ("transformer.layers.0.attention.dense.weight", Split.ROW),
    ("transformer.layers.0.mlp.proj.weight", Split.ROW),
    ("transformer.layers.0.mlp.proj.bias", Split.REPLICATE),
    ("transformer.layers.0.mlp.fc.weight", Split.COLUMN),
    ("transformer.layers.0.mlp.gate.weight", Split.COLUMN),
    ("transformer.layers.0.post_layernorm.weight", Split.REPLICATE),
    ("transformer.ln_f.weight", Split.REPLICATE),
    ("transformer.vocab_embedding.weight", Split.REPLICATE),
    ("lm_head.weight", Split.VOCAB),
    ("medusa_heads.2.medusa_layers.0.linear.weight", Split.COLUMN),
    ("medusa_heads.2.medusa_layers.0.linear.bias", Split.COLUMN),
    ("medusa_heads.2.lm_head.weight", Split.VOCAB),
    ("eagle_nets.1.drafter.fc.bias", Split.COLUMN),
    ("eagle_nets.1.drafter.layers.0.attention.qkv.weight", Split.QKV),
    ("eagle_nets.1.drafter.vocab_embedding.weight", Split.REPLICATE),
    ("eagle_nets.1.lm_head.weight", Split.VOCAB),
])
def test_split_of_follows_reference(name, split):
    assert split_of(name) is split


def test_unknown_name_is_an_error():
    with pytest.raises(CheckpointError, match="transformer.mystery.weight"):
        split_of("transformer.mystery.weight")


def test_qkv_rank_piece_is_q_k_v_of_that_rank():
    layout = QkvLayout(num_heads=4, num_kv_heads=2, head_dim=3)
    q, k, v = torch.randn(12, 5), torch.randn(6, 5), torch.randn(6, 5)
    piece = shard([q, k, v], Split.QKV, 2, 1, layout)
    assert torch.equal(piece, torch.cat([q[6:], k[3:], v[3:]]))
    assert shard_shape((12, 5), Split.QKV, 2, layout) == (12, 5)


def test_kv_heads_duplicate_when_fewer_than_ranks():
    layout = QkvLayout(num_heads=4, num_kv_heads=1, head_dim=2)
    q, k, v = torch.randn(8, 3), torch.randn(2, 3), torch.randn(2, 3)
    pieces = [shard([q, k, v], Split.QKV, 4, r, layout) for r in range(4)]
    for r, piece in enumerate(pieces):  # every rank owns a full copy of the single KV head
        assert torch.equal(piece, torch.cat([q[2 * r:2 * r + 2], k, v]))
    assert all(torch.equal(a, b) for a, b in zip(unshard(pieces, Split.QKV, layout), (q, k, v)))


def test_corrupted_kv_duplicate_is_detected():
    layout = QkvLayout(num_heads=2, num_kv_heads=1, head_dim=2)
    q, k, v = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3)
    pieces = [shard([q, k, v], Split.QKV, 2, r, layout) for r in range(2)]
    pieces[1][2:4] += 1
    with pytest.raises(CheckpointError, match="duplicated KV heads differ"):
        unshard(pieces, Split.QKV, layout)


@pytest.mark.parametrize("split,shape", [(Split.COLUMN, (8, 3)), (Split.ROW, (3, 8)), (Split.VOCAB, (10, 3)),
                                         (Split.REPLICATE, (5,))])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_unshard_roundtrip(split, shape, tp):
    t = torch.randn(shape)
    pieces = [shard([t], split, tp, r) for r in range(tp)]
    assert all(tuple(p.shape) == shard_shape(shape, split, tp) for p in pieces)
    (back,) = unshard(pieces, split, vocab_size=shape[0])
    assert torch.equal(back, t)


def test_pad_vocab_size():
    assert [pad_vocab_size(v, 4) for v in (250, 252, 253)] == [252, 252, 256]
