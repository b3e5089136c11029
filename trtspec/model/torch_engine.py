"""The torch reference engine: the Engine interface over the reference network, one sequence per call.

It is the oracle the ONNX Runtime engine is checked against and the engine the loop's tests run on; it is
not on the serving path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.model.eagle_draft import EagleDraftModel
from trtspec.model.reference import ReferenceModel
from trtspec.speculative.engine import StepOutput


@dataclass
class _Cache:
    key: torch.Tensor  # [L, 1, nkv, P, hd]
    value: torch.Tensor

    @property
    def length(self) -> int:
        return self.key.shape[3]

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.key, self.value = torch.cat([self.key, key], dim=3), torch.cat([self.value, value], dim=3)


@dataclass
class _Sequence:
    base: _Cache
    draft: _Cache | None
    pending: tuple[torch.Tensor, torch.Tensor] | None = None  # new K/V of the last verify, [L, 1, nkv, n+1, hd]


class TorchEngine:
    """Reference engine over ReferenceModel (+ EagleDraftModel); fp32 by default."""

    def __init__(self, model: ReferenceModel, draft: EagleDraftModel | None = None, *, max_draft_len: int = 64):
        self.model, self.draft = model.eval(), draft.eval() if draft is not None else None
        self.vocab_size = model.config.vocab_size
        self.max_draft_len = max_draft_len
        self.slot_profiles = (max_draft_len + 1,) if max_draft_len else ()  # exact slots: no padding here
        self.num_medusa_heads = model.config.num_medusa_heads
        self.has_eagle_draft = draft is not None
        self.chains_only = False  # fp32 reference: trees verify alike
        self._seqs: dict[int, _Sequence] = {}
        self._ids = itertools.count()

    @classmethod
    def from_checkpoint(cls, directory: str | Path, *, dtype: torch.dtype = torch.float32,
                        max_draft_len: int | None = None) -> TorchEngine:
        ckpt = read_trtllm_checkpoint(directory)
        model = ReferenceModel.from_checkpoint(ckpt, dtype=dtype)
        draft = EagleDraftModel.from_checkpoint(ckpt, dtype=dtype) if "eagle_net_config" in ckpt.config else None
        return cls(model, draft, max_draft_len=max_draft_len or ckpt.config.get("max_draft_len") or 64)

    def open(self) -> int:
        seq = next(self._ids)
        draft = _Cache(*self.draft.empty_cache(1)) if self.draft is not None else None
        self._seqs[seq] = _Sequence(_Cache(*self.model.empty_cache(1)), draft)
        return seq

    def close(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    @torch.inference_mode()
    def prefill(self, seq: int, token_ids: np.ndarray) -> StepOutput:
        state = self._seqs[seq]
        t = len(token_ids)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        out = self._run(state.base, token_ids, np.arange(t), mask)
        state.base.append(out.new_key, out.new_value)
        return _step_output(out)

    @torch.inference_mode()
    def verify(self, seq: int, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray) -> StepOutput:
        state = self._seqs[seq]
        assert len(tokens) <= self.max_draft_len + 1, (len(tokens), self.max_draft_len)
        out = self._run(state.base, tokens, state.base.length + np.asarray(depths), torch.tensor(mask))
        state.pending = (out.new_key, out.new_value)
        return _step_output(out)

    def commit(self, seq: int, slots: tuple[int, ...]) -> None:
        state = self._seqs[seq]
        index = torch.tensor(slots, dtype=torch.long)
        key, value = state.pending
        state.base.append(key.index_select(3, index), value.index_select(3, index))
        state.pending = None

    @torch.inference_mode()
    def medusa_logits(self, hidden: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(hidden))[None].to(next(self.model.parameters()).dtype)  # [1, H]
        return torch.stack([head(x)[0] for head in self.model.medusa_heads]).float().numpy()  # [heads, V]

    @torch.inference_mode()
    def draft_extend(self, seq: int, token_ids: np.ndarray, features: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        t = len(token_ids)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        out = self._run_draft(cache, token_ids, features, cache.length + np.arange(t), mask)
        cache.append(out.new_key, out.new_value)
        return StepOutput(out.logits[0].float().numpy(), out.hidden[0].float().numpy())

    @torch.inference_mode()
    def draft_step(self, seq: int, token_ids: np.ndarray, features: np.ndarray, depths: np.ndarray,
                   mask: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        # a depth-1 node is the entry right after the committed ones: position = draft length + depth - 1
        out = self._run_draft(cache, token_ids, features, cache.length + np.asarray(depths) - 1,
                              torch.tensor(mask))
        return StepOutput(out.logits[0].float().numpy(), out.hidden[0].float().numpy())

    def _run(self, cache: _Cache, tokens, positions, mask: torch.Tensor):
        ids, pos = _ids(tokens), _ids(positions)
        attn = torch.cat([torch.ones(len(tokens), cache.length, dtype=torch.bool), mask], dim=1)[None]
        return self.model(ids, pos, attn, cache.key, cache.value)

    def _run_draft(self, cache: _Cache, tokens, features, positions, mask: torch.Tensor):
        feats = torch.as_tensor(np.asarray(features))[None].to(self.draft_dtype)
        attn = torch.cat([torch.ones(len(tokens), cache.length, dtype=torch.bool), mask], dim=1)[None]
        return self.draft(_ids(tokens), feats, _ids(positions), attn, cache.key, cache.value)

    @property
    def draft_dtype(self) -> torch.dtype:
        return next(self.draft.parameters()).dtype


def _ids(values) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64))[None]


def _step_output(out) -> StepOutput:
    return StepOutput(out.logits[0].float().numpy(), out.hidden[0].float().numpy())
