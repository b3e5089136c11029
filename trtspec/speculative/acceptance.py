"""Acceptance rules of the verify step: which drafted tokens the target keeps, and the one token it adds.

This module defines the words the rest of trtspec uses: a verify step feeds n + 1 slots (slot 0 the root, the last
committed token; slots 1..n draft-tree nodes) and `target[i]` is the target's distribution for the token after slot
i; the **accepted tokens** are a prefix of one root-to-leaf path; the **bonus token** is the one token every step
adds after them (vLLM's *recovered* token after a rejection, its bonus after a fully accepted path), so a step emits
`num_accepted + 1` tokens (`Accepted.tokens`). Rules: `accept_greedy` (temperature 0, all methods) and the lossless
`accept_rejection_tree` and `accept_rejection_chain` preserve the target's output distribution; `accept_typical`
(Medusa) is the one LOSSY rule. In full: docs/design.md (The speculative core).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trtspec.speculative.sampling import sample, softmax


@dataclass(frozen=True)
class Accepted:
    """The outcome of one verify step: the accepted draft slots and every token the step emits."""

    slots: tuple[int, ...]   # accepted draft slots (>= 1), root to leaf; () when none was accepted
    tokens: tuple[int, ...]  # the accepted draft tokens, then exactly one bonus token
    last_slot: int           # slot whose target distribution produced the bonus: slots[-1], or 0

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.slots) + 1, (self.slots, self.tokens)
        assert self.last_slot == (self.slots[-1] if self.slots else 0), (self.slots, self.last_slot)

    @property
    def num_accepted(self) -> int:
        return len(self.slots)


def accept_greedy(draft_tokens: np.ndarray, target_logits: np.ndarray, paths: np.ndarray) -> Accepted:
    """Accept the longest path prefix the target's argmax reproduces; the bonus is the argmax after it.

    draft_tokens: int [n+1] (slot 0 ignored); target_logits: [n+1, V]; paths: int [num_paths, depth+1].
    """
    if len(draft_tokens) == 1:  # no draft (plain decoding): the argmax after the root, nothing else to check
        return _emit((), draft_tokens, int(np.argmax(target_logits[0])))
    # Rule: draft at path[j+1] is accepted iff it equals argmax(target[path[j]]) and every earlier one was.
    predicted = np.argmax(target_logits, axis=-1)  # [n+1], the target's greedy token after each slot
    parents, kids, real = _edges(paths, len(predicted))
    match = real & (np.asarray(draft_tokens)[kids] == predicted[parents])  # [num_paths, depth]
    slots = _longest_prefix(kids, match)
    return _emit(slots, draft_tokens, int(predicted[slots[-1] if slots else 0]))


def accept_typical(draft_tokens: np.ndarray, target_logits: np.ndarray, paths: np.ndarray, *,
                   temperature: float, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3,
                   rng: np.random.Generator) -> Accepted:
    """Accept by Medusa typical acceptance (fast=True). LOSSY: the output does not follow the target's law.

    Temperature 0 is `accept_greedy`. The bonus token is the argmax even when temperature > 0, as in Medusa;
    `rng` is therefore unused and accepted only so every rule takes the same arguments.
    """
    if temperature == 0:
        return accept_greedy(draft_tokens, target_logits, paths)
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} must be >= 0")
    probs = softmax(np.asarray(target_logits, dtype=np.float64) / temperature)  # [n+1, V]
    entropy = -(probs * np.log(probs + 1e-5)).sum(axis=-1)  # [n+1]; Medusa's 1e-5 guard, kept for parity
    threshold = np.minimum(posterior_threshold, posterior_alpha * np.exp(-entropy))  # [n+1]
    parents, kids, real = _edges(paths, len(probs))
    p_draft = np.where(real, probs[parents, np.asarray(draft_tokens)[kids]], 0.0)  # [num_paths, depth]
    # Rule: draft x after slot u is typical iff p_u(x) > min(eps, delta * exp(-H(p_u))); prefix as greedy.
    # Among the longest prefixes the most likely one wins: largest sum of log p of its accepted tokens.
    typical = real & (p_draft > threshold[parents])  # [num_paths, depth]
    slots = _longest_prefix(kids, typical, weights=np.log(np.maximum(p_draft, 1e-300)))
    return _emit(slots, draft_tokens, int(np.argmax(target_logits[slots[-1] if slots else 0])))


def accept_rejection_tree(draft_tokens: np.ndarray, target_probs: np.ndarray,
                          children: Sequence[Sequence[int]], rng: np.random.Generator) -> Accepted:
    """Walk a tree of deterministic (top-k) drafts by EAGLE-2/3 lossless sampling (proposal q = 1).

    draft_tokens: int [n+1] (slot 0 ignored); target_probs: [n+1, V]; children: per slot, its child slots in
    rank order (n+1 entries).
    """
    _check_tree(draft_tokens, target_probs, children)
    node, slots = 0, []
    while True:
        residual = np.array(target_probs[node], dtype=np.float64)  # [V], unnormalised target at `node`
        child = _first_accepted_child(residual, children[node], draft_tokens, rng)
        if child is None:
            fallback = residual if residual.sum() > 0 else target_probs[node]  # only numerically reachable
            return _emit(tuple(slots), draft_tokens, sample(fallback, rng))
        slots.append(child)
        node = child


def accept_rejection_chain(draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray,
                           rng: np.random.Generator) -> Accepted:
    """Verify a chain drafted by sampling from q with classic speculative sampling (Leviathan / Chen).

    draft_tokens: int [k] for slots 1..k; draft_probs: [k, V], q_i that drew draft i; target_probs: [k+1, V].
    """
    tokens = [int(t) for t in draft_tokens]
    if not len(draft_probs) == len(tokens) == len(target_probs) - 1:
        raise ValueError(f"a chain of {len(tokens)} drafts needs {len(tokens)} draft_probs rows and "
                         f"{len(tokens) + 1} target_probs rows; got {len(draft_probs)} and {len(target_probs)}")
    for i, token in enumerate(tokens):
        p, q = target_probs[i], draft_probs[i]  # [V] each, for the token after slot i
        # Rule: accept with probability min(1, p(t) / q(t)); written u * q < p so q(t) = 0 cannot divide.
        if rng.random() * q[token] < p[token]:
            continue
        residual = np.maximum(np.asarray(p, dtype=np.float64) - q, 0.0)  # [V]; all zero only if p == q
        bonus = sample(residual if residual.sum() > 0 else p, rng)
        return Accepted(tuple(range(1, i + 1)), (*tokens[:i], bonus), i)
    return Accepted(tuple(range(1, len(tokens) + 1)), (*tokens, sample(target_probs[-1], rng)), len(tokens))


def _first_accepted_child(residual: np.ndarray, children: Sequence[int], draft_tokens: np.ndarray,
                          rng: np.random.Generator) -> int | None:
    """Try the children in rank order; return the first accepted one, zeroing `residual` at each rejection."""
    for child in children:
        token = int(draft_tokens[child])
        # Rule (q = 1): accept with probability p(t) / sum(p) under the renormalised residual; on rejection
        # p(t) <- 0. This samples exactly from p, one conditioning step per sibling.
        total = residual.sum()
        if total > 0 and rng.random() * total < residual[token]:
            return int(child)
        residual[token] = 0.0
    return None


def _edges(paths: np.ndarray, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split paths into (parent, child, is_real) arrays [num_paths, depth]; -1 padding is never real."""
    paths = np.asarray(paths, dtype=np.int64)  # [num_paths, depth+1]
    if paths.size == 0:
        paths = np.zeros((1, 1), dtype=np.int64)  # no draft: the root alone
    if paths.ndim != 2 or not (paths[:, 0] == 0).all() or paths.max() >= num_slots:
        raise ValueError(f"paths must be rows [0, slot, ...] of slots < {num_slots}, -1 padded; "
                         f"got {paths.tolist()}")
    parents, kids = paths[:, :-1], paths[:, 1:]
    return parents, kids, (kids >= 0) & (parents >= 0)


def _longest_prefix(kids: np.ndarray, ok: np.ndarray, weights: np.ndarray | None = None) -> tuple[int, ...]:
    """Return the slots of the longest all-`ok` path prefix; ties go to the larger summed weight, then the
    first (DFS) path."""
    prefix = np.cumprod(ok, axis=1).astype(bool)  # [num_paths, depth]
    lengths = prefix.sum(axis=1)  # [num_paths]
    candidates = np.flatnonzero(lengths == lengths.max())
    if weights is not None:
        score = np.where(prefix, weights, 0.0).sum(axis=1)[candidates]
        candidates = candidates[score == score.max()]
    best = int(candidates[0])
    return tuple(int(s) for s in kids[best, :lengths[best]])


def _emit(slots: tuple[int, ...], draft_tokens: np.ndarray, bonus: int) -> Accepted:
    """Build the step's outcome: the accepted slots' draft tokens, then the bonus."""
    tokens = tuple(int(draft_tokens[s]) for s in slots) + (int(bonus),)
    return Accepted(slots, tokens, slots[-1] if slots else 0)


def _check_tree(draft_tokens: np.ndarray, target_probs: np.ndarray, children: Sequence[Sequence[int]]) -> None:
    """Raise ValueError unless there is one children entry per slot and siblings carry distinct tokens."""
    if not len(children) == len(target_probs) == len(draft_tokens):
        raise ValueError(f"children, target_probs and draft_tokens need one entry per slot; got "
                         f"{len(children)}, {len(target_probs)} and {len(draft_tokens)}")
    for slot, kids in enumerate(children):
        tokens = [int(draft_tokens[c]) for c in kids]
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"children {list(kids)} of slot {slot} repeat a draft token ({tokens}); lossless "
                             f"tree sampling needs distinct sibling tokens")
