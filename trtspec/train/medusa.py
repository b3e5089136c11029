"""Medusa-1 heads over a frozen base: H heads of ResBlocks sharing the base lm_head, trained on self-distilled data.

Head k (0-based) reads the final hidden state at position i and predicts token i + 2 + k (the base predicts
i + 1). Loss = Σ_k 0.8^k · CE_k. Exported in the FasterDecoding heads-only layout (`medusa_lm_head.safetensors`
with `{k}.{l}.linear.{weight,bias}`, `config.json` with medusa_num_heads / medusa_num_layers, version "2"):
the heads reuse the base lm_head, so the artefact holds only H·L·(h² + h) numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtspec.model.reference import MedusaLayer
from trtspec.train.data import Sample
from trtspec.train.heads import SharedLmHead, accuracy_at

IGNORE = -100
DECAY = 0.8  # λ_k = 0.8^k, the Medusa paper's head weighting


class MedusaHeadsModule(nn.Module):
    """H heads × L ResBlocks (identity at initialisation: zero weight and bias) over a shared lm_head."""

    def __init__(self, hidden: int, num_heads: int, num_layers: int, lm_head: SharedLmHead):
        super().__init__()
        self.heads = nn.ModuleList(nn.ModuleList(MedusaLayer(hidden) for _ in range(num_layers))
                                   for _ in range(num_heads))
        for p in self.heads.parameters():
            nn.init.zeros_(p)
        self.lm_head = lm_head

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] → the heads' hidden states [heads, N, H] (before the lm_head)."""
        out = []
        for layers in self.heads:
            y = x
            for layer in layers:
                y = layer(y)
            out.append(y)
        return torch.stack(out)


@dataclass(frozen=True)
class PositionBatch:
    features: torch.Tensor  # [N, H] float16
    labels: torch.Tensor  # [N, heads] int64, IGNORE where the sequence has ended


def positions(samples: list[Sample], num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """Every reply position (from the one predicting the first reply token): features [N, H], labels [N, heads]."""
    feats, labels = [], []
    for s in samples:
        n = len(s.features)
        start = max(0, s.prompt_len - 1)
        ids = np.asarray(s.ids, np.int64)
        lab = np.full((n - start, num_heads), IGNORE, np.int64)
        for k in range(num_heads):
            src = ids[start + 2 + k:]  # label of position i for head k is ids[i + 2 + k]
            lab[:len(src), k] = src[: n - start]
        feats.append(np.asarray(s.features[start:]))
        labels.append(lab)
    return np.concatenate(feats), np.concatenate(labels)


def make_batches(samples: list[Sample], num_heads: int, batch_size: int) -> list[PositionBatch]:
    feats, labels = positions(samples, num_heads)
    keep = labels[:, 0] != IGNORE
    feats, labels = torch.from_numpy(feats[keep]), torch.from_numpy(labels[keep])
    return [PositionBatch(feats[i:i + batch_size], labels[i:i + batch_size]) for i in range(0, len(feats), batch_size)]


def loss_fn(model: MedusaHeadsModule):
    def compute(batch: PositionBatch, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        hidden = model.hidden(batch.features.float())  # [heads, N, H]
        total, weights = 0.0, 0.0
        for k in range(hidden.shape[0]):
            logits, target = model.lm_head.train_logits(hidden[k], batch.labels[:, k])  # [N, V_active], [N]
            if (target != IGNORE).any():
                total = total + DECAY ** k * F.cross_entropy(logits, target, ignore_index=IGNORE)
                weights += DECAY ** k
        return total / weights, len(batch.labels)
    return compute


@torch.no_grad()
def evaluate(model: MedusaHeadsModule, samples: list[Sample], top_k: int) -> dict:
    """Per-head accuracy@1..top_k over the full vocabulary on held-out reply positions."""
    feats, labels = positions(samples, len(model.heads))
    hidden = model.hidden(torch.from_numpy(feats).float())
    heads = []
    for k in range(hidden.shape[0]):
        acc = accuracy_at(model.lm_head.full_logits(hidden[k]), torch.from_numpy(labels[:, k]), top_k, IGNORE)
        heads.append({"head": k, "predicts": f"t+{k + 2}", **acc})
    return {"heads": heads}


def export(model: MedusaHeadsModule, out: Path, *, base: Path, dtype: torch.dtype, extra: dict) -> list[str]:
    """Write the FasterDecoding heads-only layout into `out`; return the file names."""
    from safetensors.torch import save_file

    tensors = {}
    for k, layers in enumerate(model.heads):
        for j, layer in enumerate(layers):
            tensors[f"{k}.{j}.linear.weight"] = layer.linear.weight.detach().to(dtype).contiguous()
            tensors[f"{k}.{j}.linear.bias"] = layer.linear.bias.detach().to(dtype).contiguous()
    save_file(tensors, str(out / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    (out / "medusa_lm_head.safetensors").chmod(0o644)  # safetensors writes 0600
    config = {"medusa_num_heads": len(model.heads), "medusa_num_layers": len(model.heads[0]), "version": "2",
              "base_model_name_or_path": str(base), "torch_dtype": str(dtype).removeprefix("torch."),
              "trtspec_train": extra}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["medusa_lm_head.safetensors", "config.json"]
