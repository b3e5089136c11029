"""Medusa drafting: a static tree filled from the heads' top-k candidates at the last accepted position.

At slot s the base logits give the next token (the tree root), head h the token h + 2 positions after s,
so a node at depth d and rank r takes the r-th best candidate of head d − 1.
"""

from __future__ import annotations

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.engine import Engine, StepOutput
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.proposer import Draft, batch_engine, observe_one_by_one, token_probabilities, top_ranked
from trtspec.speculative.tree import Tree


class MedusaProposer:
    def __init__(self, tree: Tree, num_heads: int):
        if tree.depth > num_heads:
            raise ConfigError(f"tree depth {tree.depth} exceeds the {num_heads} Medusa heads of the engine")
        self.tree = tree
        self.engine: Engine | None = None
        self._head_logits: np.ndarray | None = None  # [num_heads, V] at the last accepted slot

    def start(self, engine: Engine, seq, prefill: StepOutput, prompt_ids, root) -> None:
        self.engine = engine
        self._head_logits = engine.medusa_logits(prefill.hidden[-1])

    def propose(self, root: int) -> Draft:
        tree = self.tree
        candidates = [top_ranked(self._head_logits[d], k) for d, k in enumerate(tree.topks)]
        probs = [token_probabilities(self._head_logits[d], c) for d, c in enumerate(candidates)]
        tokens = np.empty(tree.num_nodes + 1, dtype=np.int64)
        confidence = np.empty(tree.num_nodes, dtype=np.float64)
        tokens[0] = root
        for node in range(1, tree.num_nodes + 1):
            head, rank = tree.position_offsets[node] - 1, tree.ranks[node]
            tokens[node], confidence[node - 1] = candidates[head][rank], probs[head][rank]
        return Draft(tree, tokens, confidence=confidence)

    def observe(self, verify: StepOutput, accepted: Accepted) -> None:
        self._head_logits = self.engine.medusa_logits(verify.hidden[accepted.last_slot])

    # deferred observation (hybrid drafting): only the last step's hidden state matters
    @staticmethod
    def defer(verify: StepOutput, accepted: Accepted):
        return np.array(verify.hidden[accepted.last_slot], copy=True)

    def start_deferred(self, engine: Engine, seq, prefill: StepOutput, prompt_ids, root):
        self.engine = engine
        return np.array(prefill.hidden[-1], copy=True)

    def catch_up(self, entries: list) -> None:
        self._head_logits = self.engine.medusa_logits(entries[-1])

    @staticmethod
    def observe_batch(proposers: list[MedusaProposer], steps: list[tuple[StepOutput, Accepted]]) -> None:
        """`observe` for several sequences: one run of the heads over every sequence's last accepted hidden state
        when they share an engine that has `medusa_logits_batch`."""
        engine = batch_engine(proposers)
        if engine is None:
            return observe_one_by_one(proposers, steps)
        hidden = np.stack([verify.hidden[accepted.last_slot] for verify, accepted in steps])
        logits = engine.medusa_logits_batch(hidden)
        for proposer, rows in zip(proposers, logits):
            proposer._head_logits = rows
