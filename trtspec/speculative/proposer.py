"""What every drafter hands the loop: a tree of draft tokens rooted at the last emitted token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trtspec.speculative.engine import BatchedEngine, Engine, StepOutput
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.tree import Tree, chain_tree


@dataclass(frozen=True)
class Draft:
    """Draft tokens laid out on a tree: tokens[0] is the root (last emitted token), tokens[i] node i."""

    tree: Tree
    tokens: np.ndarray  # int64 [n+1]
    # the drafter's estimate that each node is accepted (node i + 1), when it has one: an in-flight batch then
    # weighs every row's draft against the batch's step cost and may shrink it (Proposer.shrink)
    node_p: np.ndarray | None = None
    # the drafter's own probability of each node's token given its parent (a trained drafter's softmax), when it
    # has one: back-off learns acceptance rates per band of it, so it drafts on the steps where the drafter is sure
    confidence: np.ndarray | None = None


class Proposer(Protocol):
    """A drafter: sees the prefill and every verify step of one sequence, proposes the next tree.

    A drafter class may also offer a static `observe_batch(proposers, steps)`: the in-flight loop then hands it the
    steps of all its sequences at once (EAGLE extends every draft cache in one run, Medusa runs its heads once).
    A drafter whose drafts carry `node_p` offers `shrink(max_nodes)`: keep the most probable nodes of the draft it
    just proposed and return that draft (which it then observes)."""

    def start(self, engine: Engine, seq: int, prefill: StepOutput, prompt_ids: np.ndarray, root: int) -> None: ...

    def propose(self, root: int) -> Draft: ...

    def observe(self, verify: StepOutput, accepted: Accepted) -> None: ...


EMPTY_TREE = chain_tree(0)


class NoDraft:
    """Speculation off: every step verifies the root alone, i.e. plain decoding through the same engine."""

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        pass

    def propose(self, root: int) -> Draft:
        return Draft(EMPTY_TREE, np.array([root], dtype=np.int64))

    def observe(self, verify, accepted) -> None:
        pass


class GivenDraft:
    """Draft tokens that came with the request (a draft model's continuation, sent by a draft-target loop): after the
    prefill picked `root`, the rest of the given draft is verified as one chain. The loop verifies it once
    (GenerationConfig.external_draft) and only when the draft's first token is `root`."""

    def __init__(self, draft: tuple[int, ...]):
        self.rest = np.asarray(draft[1:], dtype=np.int64)

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        pass

    def propose(self, root: int) -> Draft:
        return Draft(chain_tree(len(self.rest)), np.concatenate([[root], self.rest]).astype(np.int64))

    def observe(self, verify, accepted) -> None:
        pass


def batch_engine(proposers: list) -> BatchedEngine | None:
    """The engine every proposer drafts on (their `engine`) when it is a BatchedEngine, else None: the caller then
    lets each proposer observe alone."""
    engine = proposers[0].engine
    if isinstance(engine, BatchedEngine) and all(p.engine is engine for p in proposers):
        return engine
    return None


def observe_one_by_one(proposers: list, steps: list) -> None:
    for proposer, (verify, accepted) in zip(proposers, steps):
        proposer.observe(verify, accepted)


def log_softmax(logits: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Log-probabilities over the last axis, computed in `dtype` (float32 for a drafter that scores several rows of
    the whole vocabulary every step), the normaliser summed in float64."""
    shifted = logits.astype(dtype, copy=False) - logits.max(axis=-1, keepdims=True).astype(dtype)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float64)).astype(dtype)


def token_probabilities(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The softmax probability of each of `tokens` under `logits` [V]: one pass over the vocabulary, in float32."""
    top = logits.max()
    return np.exp(logits[tokens] - top) / np.exp(logits - top).sum()


def top_ranked(logits: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring token ids in descending order (ties: lower id first)."""
    k = min(k, logits.shape[-1])
    part = np.argpartition(-logits, k - 1)[:k] if k < logits.shape[-1] else np.arange(logits.shape[-1])
    return part[np.lexsort((part, -logits[part]))]
