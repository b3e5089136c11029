"""The engine interface the speculative loop drives; every backend (torch reference, ONNX Runtime) implements it.

KV-cache convention: a sequence's committed cache holds every token except the last emitted one (the
"root"). A verify step feeds the root in slot 0 and draft nodes in slots 1..n at positions
committed_length + depth, attending to the whole committed cache plus their tree ancestors; `commit` then
keeps the KV rows of the listed slots (slot 0 and the accepted path, in order) and drops the rest.
The EAGLE draft network has its own cache with the same rule: `draft_extend` commits, `draft_step` does not.
An engine may also offer `verify_batch(items)` (one step over several sequences; the loop uses it when present) and
`draft_extend_batch(items)` (EAGLE draft extensions of several sequences in one run; EagleProposer uses it) and
`medusa_logits_batch(hidden)` (the Medusa heads over several sequences' hidden states; MedusaProposer uses it).
Slot profiles: an engine runs a verify step over the smallest of its `slot_profiles` that holds the draft (padding
within it) and may offer `step_costs()` (spec.step_costs.StepCosts: each profile's cost relative to a plain step),
which training-free drafters budget their drafts against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


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
        """EAGLE: append committed draft entries (token_{t+1}, feature_t); return their hidden and logits."""

    def draft_step(self, seq: int, token_ids: np.ndarray, features: np.ndarray, depths: np.ndarray,
                   mask: np.ndarray) -> StepOutput:
        """EAGLE: run tree nodes through the draft network after its committed cache, without committing."""

    def close(self, seq: int) -> None:
        """Free the sequence's caches."""
