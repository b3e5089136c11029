"""EAGLE-1 draft over a frozen base: one decoder layer over fc([embed(token_{t+1}), feature_t]), trained on
self-distilled features.

The draft predicts the next feature f_{t+1}; loss = SmoothL1(f̂_{t+1}, f_{t+1}) (mean over h) + 0.1 · CE of
base_lm_head(f̂_{t+1}) against token t+2, with uniform noise U(−a, a) on the input features (EAGLE's
augmentation). The layer is trtspec's reference DecoderLayer (layer 0: no input_layernorm), so training runs the
same network, RoPE and positions as the engine. Exported in the EAGLE repository layout (`config.json`,
`model.safetensors` with `fc.*` and `layers.0.*`; `embed_tokens` optional, it is a frozen copy of the base's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtspec.checkpoint.draft_vocab import DraftVocab
from trtspec.checkpoint.hf_config import BaseModelConfig
from trtspec.checkpoint.model_shape import ModelShape
from trtspec.model.reference import DecoderLayer
from trtspec.model.rope import rope_cos_sin, rope_inv_freq
from trtspec.train.data import Sample
from trtspec.train.heads import IGNORE, SharedLmHead, accuracy_at

CE_WEIGHT = 0.1
UNROLL_DECAY = 0.8  # weight of depth d's loss: 0.8^(d - 1)
# reference DecoderLayer parameter → EAGLE (HF LLaMA) name; q/k/v are separate in both
EXPORT_NAMES = {
    "attention.q.weight": "self_attn.q_proj.weight", "attention.k.weight": "self_attn.k_proj.weight",
    "attention.v.weight": "self_attn.v_proj.weight", "attention.dense.weight": "self_attn.o_proj.weight",
    "mlp.fc.weight": "mlp.gate_proj.weight", "mlp.gate.weight": "mlp.up_proj.weight",
    "mlp.proj.weight": "mlp.down_proj.weight", "post_layernorm.weight": "post_attention_layernorm.weight",
}


def draft_config(cfg: BaseModelConfig, intermediate_size: int | None = None) -> ModelShape:
    """The draft layer's shape: the base's attention and RoPE, one layer, an optionally narrower MLP."""
    return ModelShape(
        architecture="LlamaForCausalLM", hidden_size=cfg.hidden_size, num_layers=1, num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=intermediate_size or cfg.intermediate_size,
        vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings, qkv_bias=False,
        o_bias=False, mlp_bias=False, hidden_act="silu", dtype="float32")


class EagleDraftModule(nn.Module):
    def __init__(self, config: ModelShape, embed: torch.Tensor, lm_head: SharedLmHead):
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.register_buffer("embed", embed, persistent=False)  # [V, H] frozen base embedding
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList([DecoderLayer(config, input_norm=False)])
        self.lm_head = lm_head
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(self, tokens, features, positions, mask, past=None):
        """tokens [T], features [T, H], positions [T], mask [T, P+T] → (hidden [T, H], key, value [1, nkv, T, hd])."""
        cos, sin = rope_cos_sin(self.inv_freq, positions[None])
        x = self.fc(torch.cat([self.embed[tokens], features], dim=-1))[None]  # [1, T, H], embedding first
        c = self.config
        pk, pv = past if past is not None else (torch.zeros(1, c.num_kv_heads, 0, c.head_dim),) * 2
        out, k, v = self.layers[0](x, cos, sin, mask[None], pk, pv)
        return out[0], k, v


@dataclass(frozen=True)
class SequenceBatch:
    tokens: torch.Tensor  # [T] entry i reads token ids[i + 1] ...
    features: torch.Tensor  # [T, H] ... and feature i (float16)
    target_features: torch.Tensor  # [T, H] feature i + 1
    labels: torch.Tensor  # [T] token ids[i + 2], IGNORE outside the reply
    ids: torch.Tensor  # [T + 2] the whole sequence (the deeper depths read further tokens)


def sequence(s: Sample) -> SequenceBatch:
    ids = torch.from_numpy(np.asarray(s.ids, np.int64))
    feats = torch.from_numpy(np.array(s.features))  # a copy: the cache is a read-only memmap
    t = len(feats) - 1  # entries 0..n-2 have a next feature to regress to
    labels = ids[2:2 + t].clone()
    labels[: max(0, s.prompt_len - 1)] = IGNORE  # entries before the one that reads the first reply token
    return SequenceBatch(ids[1:1 + t], feats[:t], feats[1:1 + t], labels, ids)


def loss_fn(model: EagleDraftModule, noise: float, ce_weight: float = CE_WEIGHT, unroll: int = 1):
    """EAGLE-1's loss at depth 1, plus (unroll > 1, "training-time test") the same loss at depths 2..unroll,
    where the draft reads its own predicted features as it does when drafting a tree, weighted 0.8^(d - 1)."""
    def compute(b: SequenceBatch, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        feats = b.features.float()
        feats = feats + (torch.rand(feats.shape, generator=gen) - 0.5) * (2 * noise)  # U(-noise, noise)
        total, weights, count = 0.0, 0.0, 0
        for d, (hidden, labels, targets) in enumerate(depth_outputs(model, b, feats, unroll), start=1):
            keep = labels != IGNORE
            if not keep.any():
                break
            reg = F.smooth_l1_loss(hidden[keep], targets[keep].float(), reduction="none").mean(-1).mean()
            logits, target = model.lm_head.train_logits(hidden[keep], labels[keep])
            w = UNROLL_DECAY ** (d - 1)
            total, weights = total + w * (reg + ce_weight * F.cross_entropy(logits, target)), weights + w
            count = count or int(keep.sum())
        return total / weights, count
    return compute


def select_draft_vocab(batches: list[SequenceBatch], size: int, vocab_size: int) -> DraftVocab | None:
    """The `size` target ids the training labels use most (ties: lower id first), or None for 0 / ≥ vocab."""
    if size <= 0 or size >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for b in batches:
        labels = b.labels[b.labels != IGNORE]
        counts.index_add_(0, labels, torch.ones_like(labels))
    order = torch.argsort(-counts, stable=True)[:size]  # most used first, ties by lower id
    return DraftVocab.from_target_ids(order.numpy(), vocab_size)


@torch.no_grad()
def evaluate(model: EagleDraftModule, samples: list[Sample], top_k: int, depth: int = 4,
             draft_vocab: DraftVocab | None = None) -> dict:
    """Per-depth accuracy@1..top_k on held-out replies, as the tree drafts them (over the draft vocabulary when
    there is one, else the full vocabulary); with a draft vocabulary also the share of labels it covers.

    Depth 1 reads true features; depth d reads the draft's own hidden from depth d − 1 and the true token
    (the path so far accepted), attending to the true entries up to its root plus its own ancestors."""
    logits_by_depth, labels_by_depth = [[] for _ in range(depth)], [[] for _ in range(depth)]
    outside = ~draft_vocab.maps()["t2d"] if draft_vocab is not None else None  # [V] ids the draft never scores
    for s in samples:
        b = sequence(s)
        for d, (hidden, labels, _) in enumerate(depth_outputs(model, b, b.features.float(), depth)):
            keep = labels != IGNORE
            logits = model.lm_head.full_logits(hidden[keep])
            if outside is not None:
                logits[:, outside] = -torch.inf
            logits_by_depth[d].append(logits)
            labels_by_depth[d].append(labels[keep])
    out = []
    for d in range(depth):
        acc = accuracy_at(torch.cat(logits_by_depth[d]), torch.cat(labels_by_depth[d]), top_k)
        out.append({"depth": d + 1, **acc})
    if outside is None:
        return {"depths": out}
    labels = torch.cat(labels_by_depth[0])
    covered = 1 - float(outside[labels].float().mean()) if len(labels) else 0.0
    return {"depths": out, "draft_vocab": {"size": draft_vocab.size, "held_out_coverage": round(covered, 4)}}


def depth_outputs(model: EagleDraftModule, b: SequenceBatch, features: torch.Tensor, depth: int):
    """Yield (hidden [n, H], labels [n], target features [n, H]) for depths 1..depth over one sequence.

    Depth 1 reads the (given) true features; depth d reads the draft's own hidden from depth d − 1 at the same
    entry and the true token (the path so far accepted), attending to the true entries up to its root plus its
    own ancestors: entry i at depth d reads ids[i + d], predicts feature i + d and token ids[i + d + 1]."""
    t = len(b.tokens)
    hidden, k, v = model(b.tokens, features, torch.arange(t), torch.ones(t, t, dtype=torch.bool).tril())
    keys, values = [k], [v]
    yield hidden, b.labels, b.target_features
    ids, valid = b.ids, b.labels != IGNORE
    for d in range(2, depth + 1):
        n = t - (d - 1)
        if n <= 0:
            return
        tril, eye = torch.ones(t, t, dtype=torch.bool).tril()[:n], torch.eye(t, dtype=torch.bool)[:n]
        # row i sees the true entries ≤ i, its own ancestors at depths 2..d-1, and itself
        mask = torch.cat([tril, *[eye] * (d - 2), torch.eye(n, dtype=torch.bool)], dim=1)  # [n, (d-1)·t + n]
        past = (torch.cat(keys, dim=2), torch.cat(values, dim=2))
        hidden, k, v = model(ids[d:d + n], hidden[:n], torch.arange(n) + d - 1, mask, past)
        pad = torch.zeros(1, k.shape[1], t - n, k.shape[3])  # pad to t rows for the eye masks
        keys.append(torch.cat([k, pad], dim=2))
        values.append(torch.cat([v, pad], dim=2))
        labels = ids[d + 1:d + 1 + n].clone()
        labels[~valid[:n]] = IGNORE
        yield hidden, labels, b.target_features[d - 1:d - 1 + n]


def export(model: EagleDraftModule, out: Path, *, base: Path, cfg: BaseModelConfig, dtype: torch.dtype,
           with_embeddings: bool, extra: dict, draft_vocab: DraftVocab | None = None) -> list[str]:
    """Write the EAGLE-1 repository layout into `out` (plus EAGLE-3's d2t / t2d with a draft vocabulary);
    return the file names."""
    from safetensors.torch import save_file

    tensors = {"fc.weight": model.fc.weight, "fc.bias": model.fc.bias}
    for name, p in model.layers[0].named_parameters():
        tensors[f"layers.0.{EXPORT_NAMES[name]}"] = p
    if with_embeddings:
        tensors["embed_tokens.weight"] = model.embed
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    if draft_vocab is not None:
        tensors.update(draft_vocab.maps())
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600
    c = model.config
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
              "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
              "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
              "rope_scaling": c.rope_scaling, "max_position_embeddings": c.max_position_embeddings,
              "hidden_act": "silu", "bias": True, "torch_dtype": str(dtype).removeprefix("torch."),
              "base_model_name_or_path": str(base), "trtspec_train": extra}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["model.safetensors", "config.json"]
