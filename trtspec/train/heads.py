"""The frozen base lm_head (and embedding) the drafters share, and accuracy@k.

Training logits cover only the active vocabulary (every token id the training labels use, SmolLM2 ShareGPT
replies: ≈ 10 % of the vocabulary): the cross-entropy of a self-distilled label only needs its competitors that
the base actually emits, and the lm_head product is what dominates the cost of training on a CPU. Evaluation
always uses the full vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trtspec.checkpoint.hf_config import BaseModelConfig
from trtspec.checkpoint.tensorfile import open_hf_weights
from trtspec.errors import CheckpointError

IGNORE = -100


def base_tensors(base: Path, cfg: BaseModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding [V, H], lm_head [V, H]) of a HF base, float32; tied models share one tensor."""
    store = open_hf_weights(base)
    embed = store.load("model.embed_tokens.weight").float()
    key = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    if key not in store:
        raise CheckpointError(f"{base}: {key} not found; the drafters need the base lm_head")
    lm_head = embed if cfg.tie_word_embeddings else store.load(key).float()
    return embed, lm_head


class SharedLmHead(nn.Module):
    """Frozen lm_head; `active` (sorted token ids) restricts the training logits."""

    def __init__(self, weight: torch.Tensor, active: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)  # [V, H], never trained nor checkpointed
        vocab = weight.shape[0]
        active = torch.arange(vocab) if active is None else active
        self.register_buffer("active_weight", weight[active].contiguous(), persistent=False)  # [Va, H]
        index = torch.full((vocab,), IGNORE, dtype=torch.long)
        index[active] = torch.arange(len(active))
        self.register_buffer("index", index, persistent=False)  # [V] token id → active row or IGNORE

    def train_logits(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, H], labels [N] token ids → (logits [N, Va], labels as active rows; IGNORE kept)."""
        target = torch.where(labels == IGNORE, IGNORE, self.index[labels.clamp(min=0)])
        return hidden @ self.active_weight.T, target

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T  # [N, V]


def active_vocabulary(label_arrays, vocab_size: int) -> torch.Tensor:
    """Sorted ids of every token used as a label."""
    used = torch.zeros(vocab_size, dtype=torch.bool)
    for labels in label_arrays:
        labels = torch.as_tensor(labels)
        used[labels[labels != IGNORE]] = True
    return torch.nonzero(used).flatten()


@torch.no_grad()
def accuracy_at(logits: torch.Tensor, labels: torch.Tensor, top_k: int, ignore: int = IGNORE) -> dict:
    """{"top1": …, "top{k}": …, "accuracy_at": [acc@1 … acc@k], "positions": n} over labels != ignore."""
    keep = labels != ignore
    n = int(keep.sum())
    if n == 0:
        return {"top1": 0.0, f"top{top_k}": 0.0, "accuracy_at": [0.0] * top_k, "positions": 0}
    ranked = logits[keep].topk(top_k, dim=-1).indices  # [n, k]
    hit = (ranked == labels[keep][:, None]).cumsum(-1).clamp(max=1).float().mean(0)  # [k] acc@1..k
    acc = [round(float(a), 4) for a in hit]
    return {"top1": acc[0], f"top{top_k}": acc[-1], "accuracy_at": acc, "positions": n}
