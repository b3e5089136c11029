"""The engine interface the speculative core drafts and verifies against; the backends implement it (ONNX Runtime in
`trtspec.runtime.ort_engine`, the torch reference in `trtspec.model.torch_engine`), and nothing here imports one.

An `Engine` keeps each sequence's committed KV cache (every token but the root, the last emitted one); a verify step
feeds the root and the draft nodes, and `commit` keeps the rows of the accepted slots. A `BatchedEngine` runs one
call over several sequences; a `CostedEngine` reports each slot profile's measured cost relative to a plain step,
which the training-free drafters budget against. An engine whose `chains_only` is True computes a verify slot exactly
as a plain step only on a chain, and the core then drafts chains. The cache convention and slot profiles in full:
docs/design.md (The speculative core); chains only: docs/quantization-exactness.md.
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
    has_redrafter: bool  # a ReDrafter drafter graph (redrafter_step)
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

    def redrafter_step(self, hidden: np.ndarray, tokens: np.ndarray, state: np.ndarray,
                       has_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ReDrafter: one beam-search step over N beams: the base's hidden state [N, H], each beam's last token [N],
        the recurrence's state [N, H] and whether it has one yet [N, 1] → next-token logits [N, V], next state."""

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
