"""The distribution a request samples from: target logits → probabilities (temperature, top-k, top-p), and
one seeded draw from it. Pure numpy; the acceptance rules in `trtspec.speculative.acceptance` consume these."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from trtspec.errors import ConfigError

# Cumulative sums of softmax outputs are off by a few ulps; a nucleus that reaches top_p within this slack
# counts as reaching it, so log-probability logits of [0.5, 0.25, ...] at top_p = 0.75 keep two tokens.
_TOP_P_SLACK = 1e-12


# what each field must be (the CLI's flags and the server's request fields say the same)
RULES = {"temperature": "a finite number >= 0 (0 means greedy)", "top_k": "an integer >= 0 (0 switches top-k off)",
         "top_p": "a number in (0, 1] (1 switches top-p off)", "seed": "an integer or None"}


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How a request samples: temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not self.temperature >= 0 or math.isinf(self.temperature):
            _invalid("temperature", self.temperature)
        if not _is_int(self.top_k) or self.top_k < 0:
            _invalid("top_k", self.top_k)
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            _invalid("top_p", self.top_p)
        if self.seed is not None and not _is_int(self.seed):
            _invalid("seed", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Return float64 probabilities [..., V]: temperature, then top-k, then top-p; greedy gives a one-hot."""
    logits = np.asarray(logits, dtype=np.float64)  # [..., V]
    if params.greedy:
        # np.argmax returns the first maximum, so ties go to the lowest token id.
        return np.eye(logits.shape[-1])[np.argmax(logits, axis=-1)]
    probs = softmax(logits / params.temperature)
    if 0 < params.top_k < probs.shape[-1]:
        probs = _keep(probs, _top_k_mask(probs, params.top_k))
    if params.top_p < 1:
        probs = _keep(probs, _top_p_mask(probs, params.top_p))
    return probs


def softmax(logits: np.ndarray) -> np.ndarray:
    """Return softmax over the last axis in float64 (max-subtracted, so large logits do not overflow)."""
    logits = np.asarray(logits, dtype=np.float64)
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from a [V] distribution; it need not be normalised, tokens with mass 0 never come out."""
    cdf = np.cumsum(probs, dtype=np.float64)  # [V]
    if not cdf[-1] > 0 or not np.isfinite(cdf[-1]):
        raise ValueError(f"cannot sample from a distribution with total mass {cdf[-1]}")
    # side="right" skips zero-mass tokens: token i is drawn iff cdf[i-1] <= u < cdf[i].
    token = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(token, int(np.flatnonzero(probs)[-1]))  # u rounded up to cdf[-1]: last token with mass


def make_rng(seed: int | None) -> np.random.Generator:
    """Return the request's generator: seeded when `seed` is an int, fresh OS entropy when None."""
    return np.random.default_rng(seed)


def _top_k_mask(probs: np.ndarray, k: int) -> np.ndarray:
    """Mark exactly the k most likely tokens per row; ties at the boundary keep the lowest ids."""
    order = np.argsort(-probs, axis=-1, kind="stable")  # [..., V], most likely first
    keep_sorted = np.arange(probs.shape[-1]) < k  # [V]
    return _unsort(np.broadcast_to(keep_sorted, probs.shape), order)


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Mark the smallest most-likely set whose mass reaches top_p (always at least the top token)."""
    order = np.argsort(-probs, axis=-1, kind="stable")  # [..., V], most likely first
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # [..., V], mass of the more likely tokens
    return _unsort(mass_before < top_p - _TOP_P_SLACK, order)


def _unsort(sorted_mask: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Scatter a mask given in `order` back to token-id order."""
    mask = np.empty(order.shape, dtype=bool)
    np.put_along_axis(mask, order, sorted_mask, axis=-1)
    return mask


def _keep(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Zero the tokens outside `mask` and renormalise each row."""
    kept = np.where(mask, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _invalid(field: str, value: object) -> None:
    raise ConfigError(f"{field} {value!r} is invalid: it must be {RULES[field]}")
