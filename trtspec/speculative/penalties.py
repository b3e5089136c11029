"""Repetition, presence and frequency penalties, with TensorRT-LLM's semantics, applied along draft paths.

TensorRT-LLM (`cpp/tensorrt_llm/kernels/penaltyKernels.cu`, batchApplyPenalty) counts every token of the sequence so
far, the prompt included, and changes the logit of each token that occurred (`_penalize`), after the embedding bias
and the temperature.

Speculation stays lossless because a verify row is penalized with the counts of its own context: the prompt, the
output so far, and the draft tokens on the path to the row's node (`apply_penalties`), which is exactly what plain
decoding counts when it reaches that position.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from trtspec.errors import ConfigError


@dataclass(frozen=True)
class Penalties:
    """A request's penalties; the defaults switch each one off."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("repetition_penalty", self.repetition), ("presence_penalty", self.presence),
                            ("frequency_penalty", self.frequency)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if not self.repetition > 0:
            raise ConfigError(f"repetition_penalty must be > 0 (1 is off), got {self.repetition!r}")

    @property
    def active(self) -> bool:
        return self.repetition != 1 or self.presence != 0 or self.frequency != 0


def token_counts(token_ids, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in token_ids: int64 [vocab_size]."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    return np.bincount(ids, minlength=vocab_size)[:vocab_size]


def apply_penalties(logits: np.ndarray, counts: np.ndarray, paths: list[list[int]], penalties: Penalties,
                    temperature: float) -> None:
    """Penalize logits [rows, V] in place: row i with `counts` (the prompt and output so far) plus the tokens of
    paths[i] (the draft tokens between the output and the position row i predicts)."""
    scale = np.float32(temperature if temperature > 0 else 1.0)
    # the draft-path tokens' raw logits, before the shared counts change them
    extra = [(i, Counter(path)) for i, path in enumerate(paths) if path]
    raw = [(i, np.fromiter(c, np.int64, len(c)), np.fromiter(c.values(), np.int64, len(c))) for i, c in extra]
    raw = [(i, tokens, more, logits[i, tokens].copy()) for i, tokens, more in raw]
    seen = np.flatnonzero(counts)
    if seen.size:
        logits[:, seen] = _penalize(logits[:, seen], counts[seen], penalties, scale)
    for i, tokens, more, values in raw:
        logits[i, tokens] = _penalize(values, counts[tokens] + more, penalties, scale)


def _penalize(values: np.ndarray, n: np.ndarray, penalties: Penalties, scale: np.float32) -> np.ndarray:
    """The penalized logits of tokens that occurred n >= 1 times:

        l ← l · r if l < 0 else l / r      (repetition_penalty r > 0; 1 is off)
        l ← l − p                          (presence_penalty p; 0 is off)
        l ← l − f · n                      (frequency_penalty f; 0 is off)

    trtspec applies the temperature later (sampling.logits_to_probs divides by T), so p and f · n come `scale` = T
    times larger off the raw logit: the same distribution. Greedy decoding (T = 0) penalizes the raw logits, as
    TensorRT-LLM does at its default temperature 1 with top_k 1."""
    r = np.float32(penalties.repetition)
    out = np.where(values < 0, values * r, values / r) if r != 1 else values
    return (out - (np.float32(penalties.presence) + np.float32(penalties.frequency) * n.astype(np.float32))
            * scale).astype(np.float32)
