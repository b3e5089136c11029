"""The EAGLE-1/2 drafter of a TensorRT-LLM `EagleForCausalLM` checkpoint (`eagle_nets.0`), in plain torch.

h = fc(cat([embed(token_{t+1}), feature_t])), then the draft decoder layers (layer 0 without input_layernorm),
no final norm; logits = the base lm_head applied to h. The feature of the first step is the base's post-ln_f
hidden state; later steps feed back the drafter's own `hidden`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from trtspec.checkpoint.model_shape import ModelShape
from trtspec.errors import CheckpointError
from trtspec.model.reference import (DecoderLayer, check_all_used, check_step_inputs, empty_cache, load_weights,
                                     open_checkpoint, run_layers)
from trtspec.model.rope import rope_cos_sin, rope_inv_freq

if TYPE_CHECKING:
    from trtspec.checkpoint.trtllm_reader import TrtllmCheckpoint

# Module parameter prefix → checkpoint tensor prefix (every EagleNet k holds the same weights; 0 is loaded).
DRAFT_PREFIXES = {"vocab_embedding.": "eagle_nets.0.drafter.vocab_embedding.", "fc.": "eagle_nets.0.drafter.fc.",
                  "layers.": "eagle_nets.0.drafter.layers.", "lm_head.": "eagle_nets.0.lm_head."}


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [B, T, H] output of the draft layers (no final norm): the next step's feature
    logits: torch.Tensor  # [B, T, V] float32 = base lm_head(hidden)
    new_key: torch.Tensor  # [Ld, B, nkv_d, T, hd_d], RoPE applied
    new_value: torch.Tensor  # [Ld, B, nkv_d, T, hd_d]


class EagleDraftModel(nn.Module):
    """One EagleNet: embedding, fc over [embedding | feature], the draft decoder layers, the base lm_head."""

    def __init__(self, config: ModelShape, *, dtype: torch.dtype = torch.float32):
        super().__init__()
        c, self.config, self.dtype = config, config, dtype
        self.vocab_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=True)  # TRT-LLM's fc always has a bias
        self.layers = nn.ModuleList(DecoderLayer(c, input_norm=j > 0) for j in range(c.num_layers))
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.to(dtype)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)  # [hd/2] float32, never cast

    @classmethod
    def from_checkpoint(cls, ckpt: TrtllmCheckpoint | str | Path, *,
                        dtype: torch.dtype = torch.float32) -> EagleDraftModel:
        """Load `eagle_nets.0` of an EagleForCausalLM checkpoint after checking every copy is identical."""
        ckpt = open_checkpoint(ckpt)
        base = ModelShape.from_trtllm(ckpt.config)
        if base.eagle is None:
            raise CheckpointError(f"{ckpt.directory}: architecture is {base.architecture}, not EagleForCausalLM; "
                                  "convert the base with --eagle <draft dir> to get an EAGLE drafter")
        check_identical_copies(ckpt, base.num_eagle_layers)
        model = cls(dataclasses.replace(base.eagle, vocab_size=base.vocab_size), dtype=dtype)
        used = load_weights(model, ckpt, DRAFT_PREFIXES)
        check_all_used(ckpt, used, lambda name: name.startswith("eagle_nets.0."))
        return model.eval()

    def forward(self, input_ids, features, position_ids, attention_mask, past_key, past_value) -> DraftOutput:
        """One draft step over T tokens with their features [B, T, H]; attention_mask [B, T, P+T]."""
        check_step_inputs(self.config, input_ids, position_ids, attention_mask, past_key, past_value)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids)  # [B, T, hd]
        x = torch.cat([self.vocab_embedding(input_ids), features.to(self.dtype)], dim=-1)  # [B, T, 2H], embed first
        hidden, new_key, new_value = run_layers(self.layers, self.fc(x), cos, sin, attention_mask,
                                                past_key, past_value)
        return DraftOutput(hidden, self.lm_head(hidden).float(), new_key, new_value)

    def empty_cache(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return an empty past (P = 0): keys and values [Ld, B, nkv_d, 0, hd_d]."""
        return empty_cache(self.config, batch, self.dtype)


def check_identical_copies(ckpt: TrtllmCheckpoint, num_eagle_layers: int) -> None:
    """TensorRT-LLM stores the one draft num_eagle_layers times; every eagle_nets.{k} must equal eagle_nets.0."""
    copies = [{n.removeprefix(f"eagle_nets.{k}.") for n in ckpt.names() if n.startswith(f"eagle_nets.{k}.")}
              for k in range(num_eagle_layers)]
    fix = "reconvert the checkpoint with `trtspec convert --eagle`"
    for k, names in enumerate(copies[1:], start=1):
        odd = sorted(names ^ copies[0])
        if odd:
            has, lacks = (0, k) if odd[0] in copies[0] else (k, 0)
            raise CheckpointError(f"{ckpt.directory}: tensor eagle_nets.{has}.{odd[0]} has no twin "
                                  f"eagle_nets.{lacks}.{odd[0]}; every EagleNet holds the same draft; {fix}")
    for name in sorted(copies[0]):
        first = ckpt.tensor(f"eagle_nets.0.{name}")
        for k in range(1, num_eagle_layers):
            if not torch.equal(first, ckpt.tensor(f"eagle_nets.{k}.{name}")):
                raise CheckpointError(f"{ckpt.directory}: tensor eagle_nets.{k}.{name} differs from "
                                      f"eagle_nets.0.{name}; every EagleNet must hold the same draft weights; {fix}")
