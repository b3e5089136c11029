"""ReDrafter drafters over a frozen base, trained on self-distilled data (Apple's recurrent drafter, arXiv 2403.09919).

At a reply position i the base's final hidden state h_i predicts token t_{i+1}; the drafter, fed h_i and the tokens
t_{i+1} .. t_{i+d} through its recurrence, predicts t_{i+d+1} at depth d = 1 .. D (teacher forcing on the base's own
greedy continuation, as the beam search reads them at inference: onnx_graph.redrafter_graph). Loss = the mean
cross-entropy over depths. The drafter's lm_head is the base's over its first `hidden` columns and zero over the
others, frozen, as Medusa heads share the base's: the ResBlocks (identity at the start) learn to move the recurrent
state into what the lm_head reads, and every vocabulary row scores alike in training (active rows, heads.py) and at
inference. The token embedding is the base's, frozen. Exported as apple/ml-recurrent-drafter saves
a drafter (`config.json`, `model.safetensors`, the `lm_head.{i}` spelling), which `trtspec convert --redrafter`
reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trtspec.errors import ConfigError
from trtspec.model.reference import MedusaLayer
from trtspec.train.data import Sample
from trtspec.train.heads import IGNORE, SharedLmHead, accuracy_at


class ReDrafterModule(nn.Module):
    """The drafter (input_proj when exit_dim ≠ 2 · hidden, `num_layers` ResBlocks; rnn_u / rnn_w with the recurrence)
    over the frozen base embedding, its lm_head the base's on the first `hidden` columns and zero on the others,
    frozen (heads.SharedLmHead: training logits over the active vocabulary, every row scored alike)."""

    def __init__(self, embed: torch.Tensor, lm_head: SharedLmHead, *, num_layers: int, exit_dim: int, rnn: bool):
        super().__init__()
        hidden = embed.shape[1]
        if exit_dim < hidden:
            raise ConfigError(f"--exit-dim {exit_dim} is below the base's hidden size {hidden}: the drafter's lm_head "
                              "starts as the base's over the first hidden columns")
        self.register_buffer("embed", embed, persistent=False)  # [V, H], the base's, never trained
        self.hidden_size, self.exit_dim, self.rnn = hidden, exit_dim, rnn
        self.input_proj = None
        if exit_dim != 2 * hidden:  # the hidden state through at first: [h, state] → [h, 0 ...]
            self.input_proj = nn.Linear(2 * hidden, exit_dim)
            nn.init.zeros_(self.input_proj.weight)
            nn.init.zeros_(self.input_proj.bias)
            with torch.no_grad():
                self.input_proj.weight[:hidden, :hidden] = torch.eye(hidden)
        self.layers = nn.ModuleList(MedusaLayer(exit_dim) for _ in range(num_layers))
        for p in self.layers.parameters():
            nn.init.zeros_(p)  # identity ResBlocks at the start, as the Medusa heads start
        self.rnn_w = nn.Linear(hidden, hidden, bias=False) if rnn else None
        self.rnn_u = nn.Linear(hidden, hidden) if rnn else None
        if rnn:
            nn.init.eye_(self.rnn_w.weight)  # the embedding itself at the first depth
            nn.init.eye_(self.rnn_u.weight)
            nn.init.zeros_(self.rnn_u.bias)
        self.lm_head = lm_head

    def states(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [N, D] (t_{i+1} .. t_{i+D}) → the recurrence's states [N, D, H]."""
        embedded = self.embed[tokens]  # [N, D, H]
        if not self.rnn:
            return embedded.cumsum(dim=1)
        out, state = [], None
        for d in range(tokens.shape[1]):
            state = self.rnn_w(embedded[:, d]) + (0 if state is None else self.rnn_u(state))
            out.append(state)
        return torch.stack(out, dim=1)

    def exit(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """hidden [N, H], tokens [N, D] → the drafter's last hidden [N, D, E] (before the lm_head)."""
        states = self.states(tokens)
        x = torch.cat([hidden[:, None].expand(-1, states.shape[1], -1), states], dim=-1)
        if self.input_proj is not None:
            x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x)
        return x

    def full_lm_head(self) -> torch.Tensor:
        """The exported lm_head [V, E]: the base's rows, zero past the first hidden columns."""
        weight = self.lm_head.weight
        return torch.cat([weight, weight.new_zeros(weight.shape[0], self.exit_dim - self.hidden_size)], dim=1)


@dataclass(frozen=True)
class DepthBatch:
    features: torch.Tensor  # [N, H] float16
    tokens: torch.Tensor  # [N, D] int64, t_{i+1} .. t_{i+D} (0 past the end)
    labels: torch.Tensor  # [N, D] int64, t_{i+2} .. t_{i+D+1}, IGNORE past the end


def positions(samples: list[Sample], depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every reply position with a next token: features [N, H], input tokens [N, D], labels [N, D]."""
    feats, inputs, labels = [], [], []
    for s in samples:
        ids, n = np.asarray(s.ids, np.int64), len(s.features)
        start = max(0, s.prompt_len - 1)
        for i in range(start, min(n, len(ids) - 2)):
            window = ids[i + 1:i + 2 + depth]  # t_{i+1} .. t_{i+D+1}
            tok = np.zeros(depth, np.int64)
            lab = np.full(depth, IGNORE, np.int64)
            tok[:min(depth, len(window))] = window[:depth]
            lab[:len(window) - 1] = window[1:]
            feats.append(np.asarray(s.features[i]))
            inputs.append(tok)
            labels.append(lab)
    if not feats:
        return np.zeros((0, 0), np.float16), np.zeros((0, depth), np.int64), np.zeros((0, depth), np.int64)
    return np.stack(feats), np.stack(inputs), np.stack(labels)


def make_batches(samples: list[Sample], depth: int, batch_size: int) -> list[DepthBatch]:
    feats, tokens, labels = (torch.from_numpy(a) for a in positions(samples, depth))
    return [DepthBatch(feats[i:i + batch_size], tokens[i:i + batch_size], labels[i:i + batch_size])
            for i in range(0, len(feats), batch_size)]


def loss_fn(model: ReDrafterModule):
    def compute(batch: DepthBatch, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        x = model.exit(batch.features.float(), batch.tokens)[..., :model.hidden_size]  # what the lm_head reads
        logits, target = model.lm_head.train_logits(x.flatten(0, 1), batch.labels.flatten())
        return F.cross_entropy(logits, target, ignore_index=IGNORE), len(batch.labels)
    return compute


@torch.no_grad()
def evaluate(model: ReDrafterModule, samples: list[Sample], depth: int, top_k: int) -> dict:
    """Per-depth accuracy@1..top_k over the full vocabulary on held-out reply positions, teacher-forced."""
    feats, tokens, labels = positions(samples, depth)
    x = model.exit(torch.from_numpy(feats).float(), torch.from_numpy(tokens))[..., :model.hidden_size]
    logits = model.lm_head.full_logits(x)  # [N, D, V]
    return {"depths": [{"depth": d + 1, "predicts": f"t+{d + 2}",
                        **accuracy_at(logits[:, d], torch.from_numpy(labels[:, d]), top_k, IGNORE)}
                       for d in range(depth)]}


def export(model: ReDrafterModule, out: Path, *, dtype: torch.dtype, extra: dict) -> list[str]:
    """apple/ml-recurrent-drafter's layout: ResBlocks `lm_head.{i}.linear.*`, the last layer `lm_head.{N}.weight`,
    `input_proj.*` when exit_dim ≠ 2 · hidden, `rnn_u.*` / `rnn_w.weight` with the recurrence."""
    from safetensors.torch import save_file

    n = len(model.layers)
    tensors = {f"lm_head.{n}.weight": model.full_lm_head()}
    for i, layer in enumerate(model.layers):
        tensors[f"lm_head.{i}.linear.weight"] = layer.linear.weight.detach()
        tensors[f"lm_head.{i}.linear.bias"] = layer.linear.bias.detach()
    if model.input_proj is not None:
        tensors["input_proj.weight"], tensors["input_proj.bias"] = (model.input_proj.weight.detach(),
                                                                    model.input_proj.bias.detach())
    if model.rnn:
        tensors.update({"rnn_w.weight": model.rnn_w.weight.detach(), "rnn_u.weight": model.rnn_u.weight.detach(),
                        "rnn_u.bias": model.rnn_u.bias.detach()})
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600
    config = {"architectures": ["Drafter"], "model_type": "recurrent_drafting_drafter",
              "hidden_size": model.hidden_size, "exit_dim": model.exit_dim, "num_draft_layers": n,
              "num_lookback_tokens": -1, "rnn": model.rnn, "vocab_size": int(model.embed.shape[0]),
              "torch_dtype": str(dtype).removeprefix("torch."), "trtspec_train": extra}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["model.safetensors", "config.json"]
