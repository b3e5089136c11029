"""The engine interface the speculative core drafts and verifies against; the backends implement it (ONNX Runtime in
`trtspec.runtime.ort_engine`, the torch reference in `trtspec.model.torch_engine`), and nothing here imports one.

KV-cache convention: a sequence's committed cache holds every token except the last emitted one (the
"root"). A verify step feeds the root in slot 0 and draft nodes in slots 1..n at positions
committed_length + depth, attending to the whole committed cache plus their tree ancestors; `commit` then
keeps the KV rows of the listed slots (slot 0 and the accepted path, in order) and drops the rest.
The EAGLE draft network has its own cache with the same rule: `draft_extend` commits, `draft_step` does not.
An engine may also be a `BatchedEngine`: one call over several sequences for the verify step (the loop uses it), the
EAGLE draft extensions (EagleProposer) and the Medusa heads (MedusaProposer).
Chains only: an engine whose `chains_only` is True computes a verify slot bit-identically to a plain step only when
the slot's ancestors fill the slots just before it (a chain: slot i at depth i); a slot on a second branch of a tree
computes differently in the last bits. The core then drafts chains on it (`methods.make_proposer`), so greedy
speculation stays token-for-token plain decoding. (Quantized ONNX Runtime engines: int8 activation rounding turns
those last bits into logit differences of up to 0.7; see trtspec.runtime.ort_engine.)
Slot profiles: an engine runs a verify step over the smallest of its `slot_profiles` that holds the draft (padding
within it) and may be a `CostedEngine` (`step_costs()`: each profile's cost relative to a plain step, measured),
which training-free drafters budget their drafts against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from trtspec.speculative.step_costs import StepCosts


@dataclass
class StepOutput:
    """What one forward pass returns for the T fed slots."""

    logits: np.ndarray  # [T, V] float32
    hidden: np.ndarray | None = None  # [T, H] final hidden states (Medusa / EAGLE features, draft hidden)
    slots: int = 0  # the slot profile the step ran over (1: a plain step; 0: not reported)


class Engine(Protocol):
    vocab_size: int
    max_draft_len: int  # K: a verify step feeds at most K + 1 slots
    slot_profiles: tuple[int, ...]  # the slot counts a verify step runs over, ascending, the last K + 1
    num_medusa_heads: int
    has_eagle_draft: bool
    chains_only: bool  # verify steps are exact for chains only: draft chains (see above)

    def open(self) -> int:
        """Start a sequence; return its id."""

    def prefill(self, seq: int, token_ids: np.ndarray) -> StepOutput:
        """Run the prompt; its KV is committed. Outputs cover every prompt position."""

    def verify(self, seq: int, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray) -> StepOutput:
        """Feed n + 1 slots (tokens [n+1], depths [n+1], ancestor mask [n+1, n+1]) without committing."""

    def commit(self, seq: int, slots: tuple[int, ...]) -> None:
        """Keep the KV of these slots of the last verify step, in this order; drop the others."""

    def medusa_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Medusa: the heads' logits [num_medusa_heads, V] over one final hidden state [H]."""

    def draft_extend(self, seq: int, token_ids: np.ndarray, features: np.ndarray) -> StepOutput:
        """EAGLE: append committed draft entries (token_{t+1}, feature_t); return their hidden states and the last
        entry's logits (the next draft grows from it)."""

    def draft_step(self, seq: int, token_ids: np.ndarray, features: np.ndarray, depths: np.ndarray,
                   mask: np.ndarray) -> StepOutput:
        """EAGLE: run tree nodes through the draft network after its committed cache, without committing."""

    def close(self, seq: int) -> None:
        """Free the sequence's caches."""


@runtime_checkable
class BatchedEngine(Protocol):
    """The calls an engine offers over several sequences at once (the ONNX Runtime engine has them all)."""

    def verify_batch(self, items: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> list[StepOutput]:
        """`verify` for several sequences (seq, tokens, depths, mask) in one forward pass."""

    def draft_extend_batch(self, items: list[tuple[int, np.ndarray, np.ndarray]]) -> list[StepOutput]:
        """EAGLE: `draft_extend` for several sequences (seq, token_ids, features) in one run."""

    def medusa_logits_batch(self, hidden: np.ndarray) -> np.ndarray:
        """Medusa: the heads' logits [B, num_medusa_heads, V] over B final hidden states [B, H]."""


@runtime_checkable
class CostedEngine(Protocol):
    """An engine that knows what a verify step over each of its slot profiles costs on this machine."""

    def step_costs(self) -> StepCosts:
        """Each slot profile's measured step time relative to a plain step."""
