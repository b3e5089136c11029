"""Tensor- and pipeline-parallel layout of TensorRT-LLM checkpoints: which tensors split how, and both directions.

Conventions (TensorRT-LLM `convert_utils`): column-parallel weights split dim 0, row-parallel weights split
dim 1, the fused qkv holds per-rank [q_r; k_r; v_r] with KV heads duplicated when there are fewer than
tp_size of them, and vocabulary-sized heads are zero-padded to a multiple of tp_size before the split.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import torch

from trtspec.errors import CheckpointError, ConfigError


class Split(enum.Enum):
    REPLICATE = "replicate"
    COLUMN = "column"  # dim 0
    ROW = "row"  # dim 1
    QKV = "qkv"  # fused q, k, v; each split on dim 0
    VOCAB = "vocab"  # dim 0 after zero-padding to pad_vocab_size(V, T)


# TRT-LLM tensor name pattern → how it is split across TP ranks. The one table both writer and reader use.
SPLIT_RULES: tuple[tuple[str, Split], ...] = (
    (r".*\.attention\.qkv\.(weight|bias)$", Split.QKV),
    (r".*\.(attention\.dense|mlp\.proj)\.weight$", Split.ROW),
    (r".*\.(attention\.dense|mlp\.proj)\.bias$", Split.REPLICATE),
    (r".*\.mlp\.(fc|gate)\.(weight|bias)$", Split.COLUMN),
    (r"^medusa_heads\.\d+\.medusa_layers\.\d+\.linear\.(weight|bias)$", Split.COLUMN),
    (r"^eagle_nets\.\d+\.drafter\.fc\.(weight|bias)$", Split.COLUMN),
    # ReDrafter: every drafter Linear is a ColumnLinear (tensorrt_llm/models/redrafter/drafter.py), its lm_head
    # sized to the padded vocabulary
    (r"^drafter\.(input_proj|layers\.\d+\.linear|rnn_u|rnn_w)\.(weight|bias)$", Split.COLUMN),
    (r"^(lm_head|medusa_heads\.\d+\.lm_head|eagle_nets\.\d+\.lm_head|drafter\.lm_head)\.weight$", Split.VOCAB),
    (r".*(layernorm|ln_f)\.weight$", Split.REPLICATE),
    (r".*vocab_embedding\.weight$", Split.REPLICATE),
)


def split_of(name: str) -> Split:
    """How the TRT-LLM tensor `name` is laid out across tensor-parallel ranks."""
    for pattern, split in SPLIT_RULES:
        if re.match(pattern, name):
            return split
    raise CheckpointError(f"tensor {name} is not part of any TensorRT-LLM model trtspec knows")


@dataclass(frozen=True, kw_only=True)
class Mapping:
    """World layout: rank = tp_rank + pp_rank * tp_size (TensorRT-LLM `Mapping`)."""

    tp_size: int = 1
    pp_size: int = 1

    def __post_init__(self):
        if self.tp_size < 1 or self.pp_size < 1:
            raise ConfigError(f"tp_size and pp_size must be >= 1, got tp_size={self.tp_size} pp_size={self.pp_size}")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp_size

    def pp_layers(self, num_layers: int, pp_rank: int) -> range:
        per_stage = num_layers // self.pp_size
        return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}


@dataclass(frozen=True)
class QkvLayout:
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def kv_heads_per_rank(self, tp: int) -> int:
        return max(self.num_kv_heads, tp) // tp

    def rank_rows(self, tp: int) -> tuple[int, int]:
        """Rows of q and of each of k, v on one rank."""
        return self.num_heads * self.head_dim // tp, self.kv_heads_per_rank(tp) * self.head_dim


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


def shard_shape(shape: tuple[int, ...], split: Split, tp: int, qkv: QkvLayout | None = None) -> tuple[int, ...]:
    """Shape of one rank's piece of a full tensor of `shape` (for QKV: the q source shape)."""
    if split is Split.REPLICATE:
        return shape
    if split is Split.ROW:
        return (shape[0], shape[1] // tp)
    if split is Split.COLUMN:
        return (shape[0] // tp, *shape[1:])
    if split is Split.VOCAB:
        return (pad_vocab_size(shape[0], tp) // tp, *shape[1:])
    q_rows, kv_rows = qkv.rank_rows(tp)
    return (q_rows + 2 * kv_rows, *shape[1:])


def shard(sources: list[torch.Tensor], split: Split, tp: int, rank: int,
          qkv: QkvLayout | None = None) -> torch.Tensor:
    """Rank `rank`'s piece; `sources` is [tensor], or [q, k, v] for QKV."""
    if split is Split.QKV:
        q, k, v = sources
        k, v = _dup_kv(k, qkv, tp), _dup_kv(v, qkv, tp)
        return torch.cat([_chunk(t, tp, rank, 0) for t in (q, k, v)], dim=0)
    (t,) = sources
    if split is Split.REPLICATE:
        return t
    if split is Split.ROW:
        return _chunk(t, tp, rank, 1)
    if split is Split.VOCAB:
        pad = pad_vocab_size(t.shape[0], tp) - t.shape[0]
        if pad:
            t = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))], dim=0)
    return _chunk(t, tp, rank, 0)


def unshard(pieces: list[torch.Tensor], split: Split, qkv: QkvLayout | None = None,
            vocab_size: int | None = None) -> tuple[torch.Tensor, ...]:
    """Reassemble the full tensor from all TP ranks' pieces; QKV returns (q, k, v)."""
    if split is Split.REPLICATE:
        return (pieces[0],)
    if split is Split.ROW:
        return (torch.cat(pieces, dim=1),)
    if split is Split.QKV:
        tp = len(pieces)
        q_rows, kv_rows = qkv.rank_rows(tp)
        parts = [p.split([q_rows, kv_rows, kv_rows], dim=0) for p in pieces]
        q, k, v = (torch.cat([p[i] for p in parts], dim=0) for i in range(3))
        return q, _undup_kv(k, qkv, tp), _undup_kv(v, qkv, tp)
    full = torch.cat(pieces, dim=0)
    if split is Split.VOCAB and vocab_size is not None:
        full = full[:vocab_size]
    return (full,)


def _chunk(t: torch.Tensor, tp: int, rank: int, dim: int) -> torch.Tensor:
    assert t.shape[dim] % tp == 0, (t.shape, tp, dim)
    return t.chunk(tp, dim=dim)[rank].contiguous()


def _dup_kv(t: torch.Tensor, qkv: QkvLayout, tp: int) -> torch.Tensor:
    """Repeat each KV head tp / num_kv_heads times so every rank owns one (TRT-LLM `dup_kv_weight`)."""
    if qkv.num_kv_heads >= tp:
        return t
    reps = tp // qkv.num_kv_heads
    heads = t.reshape(qkv.num_kv_heads, 1, qkv.head_dim, *t.shape[1:])
    return heads.expand(-1, reps, *heads.shape[2:]).reshape(-1, *t.shape[1:])


def _undup_kv(t: torch.Tensor, qkv: QkvLayout, tp: int) -> torch.Tensor:
    if qkv.num_kv_heads >= tp:
        return t
    reps = tp // qkv.num_kv_heads
    heads = t.reshape(qkv.num_kv_heads, reps, qkv.head_dim, *t.shape[1:])
    if not all(torch.equal(heads[:, 0], heads[:, r]) for r in range(1, reps)):
        raise CheckpointError("duplicated KV heads differ between tensor-parallel ranks; the checkpoint is corrupt")
    return heads[:, 0].reshape(-1, *t.shape[1:])


def check_tp_divisibility(tp: int, *, num_heads: int, num_kv_heads: int, hidden_size: int,
                          intermediate_size: int, where: str) -> None:
    """Raise a ConfigError naming the field when tp_size cannot shard the model."""
    for field, value in (("num_attention_heads", num_heads), ("hidden_size", hidden_size),
                         ("intermediate_size", intermediate_size)):
        if value % tp:
            raise ConfigError(f"--tp-size {tp} does not divide {field}={value} ({where})")
    if num_kv_heads >= tp and num_kv_heads % tp:
        raise ConfigError(f"--tp-size {tp} does not divide num_key_value_heads={num_kv_heads} ({where})")
    if num_kv_heads < tp and tp % num_kv_heads:
        raise ConfigError(
            f"--tp-size {tp} is not a multiple of num_key_value_heads={num_kv_heads} ({where}); "
            "KV heads can only be duplicated a whole number of times")
