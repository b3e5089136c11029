"""EAGLE drafting: the draft network reads (token_{t+1}, feature_t) and predicts the next feature and token.

EAGLE-1 fills a static tree level by level; EAGLE-2 grows a dynamic tree (expand the top_k best nodes of
each level by cumulative log-probability, then keep the total_tokens best nodes overall). Tree nodes are
re-fed with their ancestors at every level, so the draft cache only ever holds committed entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.engine import Engine, StepOutput
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.proposer import (Draft, batch_engine, log_softmax, observe_one_by_one, token_probabilities,
                                         top_ranked)
from trtspec.speculative.tree import DynamicTree, Tree, build_tree


@dataclass
class _Candidates:
    """The nodes EAGLE-2 has drafted so far; parent -1 means a child of the root."""

    parent: list[int] = field(default_factory=list)
    token: list[int] = field(default_factory=list)
    score: list[float] = field(default_factory=list)  # cumulative log-probability
    depth: list[int] = field(default_factory=list)

    def add(self, parent: int, token: int, score: float, depth: int) -> int:
        for name, value in (("parent", parent), ("token", token), ("score", score), ("depth", depth)):
            getattr(self, name).append(value)
        return len(self.token) - 1

    def lineage(self, nodes: list[int]) -> list[int]:
        """The nodes and all their ancestors, ordered by depth then index."""
        seen: set[int] = set()
        for n in nodes:
            while n >= 0 and n not in seen:
                seen.add(n)
                n = self.parent[n]
        return sorted(seen, key=lambda i: (self.depth[i], i))


class EagleProposer:
    def __init__(self, tree: Tree | None = None, *, dynamic: DynamicTree | None = None):
        if (tree is None) == (dynamic is None):
            raise ConfigError("EAGLE drafting takes either a static tree (EAGLE-1) or dynamic parameters (EAGLE-2)")
        self.tree, self.dynamic = tree, dynamic
        self.engine: Engine | None = None
        self._seq = -1
        self._feature: np.ndarray | None = None  # [H] draft hidden of the last committed entry
        self._logits: np.ndarray | None = None  # [V] its logits: scores the root's children

    def start(self, engine: Engine, seq: int, prefill: StepOutput, prompt_ids: np.ndarray, root: int) -> None:
        self.engine, self._seq = engine, seq
        tokens = np.append(np.asarray(prompt_ids[1:], dtype=np.int64), root)  # entry t reads (token t+1, feature t)
        self._extend(tokens, prefill.hidden)

    def observe(self, verify: StepOutput, accepted: Accepted) -> None:
        self._extend(*_entries(verify, accepted))

    # deferred observation (hybrid drafting skips the drafter on steps where it does not pay): `defer` keeps what a
    # step commits to the draft cache, `catch_up` extends the cache by several steps' entries in one run
    @staticmethod
    def defer(verify: StepOutput, accepted: Accepted):
        return _entries(verify, accepted)

    def start_deferred(self, engine: Engine, seq: int, prefill: StepOutput, prompt_ids: np.ndarray, root: int):
        """`start` without the draft run over the prompt: its entries, for a later `catch_up`."""
        self.engine, self._seq = engine, seq
        tokens = np.append(np.asarray(prompt_ids[1:], dtype=np.int64), root)
        return tokens, np.array(prefill.hidden, dtype=np.float32, copy=True)

    def catch_up(self, entries: list) -> None:
        self._extend(np.concatenate([t for t, _ in entries]), np.concatenate([f for _, f in entries]))

    @staticmethod
    def observe_batch(proposers: list[EagleProposer], steps: list[tuple[StepOutput, Accepted]]) -> None:
        """`observe` for several sequences: one batched draft extension when they share an engine that has one."""
        engine = batch_engine(proposers)
        if engine is None:
            return observe_one_by_one(proposers, steps)
        outs = engine.draft_extend_batch([(p._seq, *_entries(*step)) for p, step in zip(proposers, steps)])
        for proposer, out in zip(proposers, outs):
            proposer._take(out)

    def _extend(self, tokens: np.ndarray, features: np.ndarray) -> None:
        self._take(self.engine.draft_extend(self._seq, tokens, features))

    def _take(self, extension: StepOutput) -> None:
        """Keep the last committed entry's draft hidden and logits: the next tree grows from them."""
        self._feature, self._logits = extension.hidden[-1], extension.logits[-1]

    def propose(self, root: int) -> Draft:
        return self._static(root) if self.tree is not None else self._dynamic(root)

    def _static(self, root: int) -> Draft:
        tree = self.tree
        tokens = np.zeros(tree.num_nodes + 1, dtype=np.int64)
        tokens[0] = root
        confidence = np.empty(tree.num_nodes, dtype=np.float64)
        hidden: dict[int, np.ndarray] = {0: self._feature}
        ranked: dict[int, np.ndarray] = {}
        probs: dict[int, np.ndarray] = {}
        logits: dict[int, np.ndarray] = {0: self._logits}
        for depth in range(1, tree.depth + 1):
            level = [i for i in range(1, tree.num_nodes + 1) if tree.position_offsets[i] == depth]
            for node in level:
                parent = tree.parents[node]
                if parent not in ranked:
                    widest = max(tree.ranks[c] for c in tree.children[parent]) + 1
                    ranked[parent] = top_ranked(logits[parent], widest)
                    probs[parent] = token_probabilities(logits[parent], ranked[parent])
                tokens[node] = ranked[parent][tree.ranks[node]]
                confidence[node - 1] = probs[parent][tree.ranks[node]]
            expanding = [n for n in level if tree.children[n]]
            if expanding:
                fed = sorted({a for n in expanding for a in np.flatnonzero(tree.mask[n]) if a != 0})
                feats = np.stack([hidden[tree.parents[i]] for i in fed])
                out = self.engine.draft_step(self._seq, tokens[fed], feats, tree.position_offsets[fed],
                                              tree.mask[np.ix_(fed, fed)])
                for j, node in enumerate(fed):
                    hidden[node], logits[node] = out.hidden[j], out.logits[j]
        return Draft(tree, tokens, confidence=confidence)

    def _dynamic(self, root: int) -> Draft:
        p = self.dynamic
        cands = _Candidates()
        logp = log_softmax(self._logits)
        frontier = [cands.add(-1, int(t), float(logp[t]), 1) for t in top_ranked(logp, p.top_k)]
        hidden: dict[int, np.ndarray] = {}
        for depth in range(2, p.depth + 1):
            fed = cands.lineage(frontier)
            out = self._draft_candidates(cands, fed, hidden)
            children = []
            for j, node in enumerate(fed):
                hidden[node] = out.hidden[j]
                if node in frontier:
                    lp = log_softmax(out.logits[j])
                    children += [cands.add(node, int(t), cands.score[node] + float(lp[t]), depth)
                                 for t in top_ranked(lp, p.top_k)]
            frontier = sorted(children, key=lambda i: (-cands.score[i], i))[:p.top_k]
        return _tree_from_candidates(cands, root, p.total_tokens)

    def _draft_candidates(self, cands: _Candidates, fed: list[int], hidden: dict[int, np.ndarray]) -> StepOutput:
        position = {node: j for j, node in enumerate(fed)}
        mask = np.zeros((len(fed), len(fed)), dtype=bool)  # [m, m] ancestor mask among the fed nodes
        for j, node in enumerate(fed):
            n = node
            while n >= 0:
                mask[j, position[n]] = True
                n = cands.parent[n]
        feats = np.stack([self._feature if cands.parent[n] < 0 else hidden[cands.parent[n]] for n in fed])
        return self.engine.draft_step(self._seq, np.array([cands.token[n] for n in fed]), feats,
                                       np.array([cands.depth[n] for n in fed]), mask)


def _entries(verify: StepOutput, accepted: Accepted) -> tuple[np.ndarray, np.ndarray]:
    """The draft entries a verify step commits: each emitted token with the feature of the slot before it (the
    root's, then each accepted node's)."""
    slots = [0, *accepted.slots]
    return np.asarray(accepted.tokens, dtype=np.int64), verify.hidden[slots]


def _tree_from_candidates(cands: _Candidates, root: int, total_tokens: int) -> Draft:
    """Keep the total_tokens best candidates (a child never outranks its parent) and lay them out as a tree."""
    keep = sorted(range(len(cands.token)), key=lambda i: (-cands.score[i], cands.depth[i], i))[:total_tokens]
    choice: dict[int, tuple[int, ...]] = {-1: ()}
    siblings: dict[int, int] = {}
    for node in sorted(keep, key=lambda i: (cands.depth[i], -cands.score[i], i)):
        parent = cands.parent[node]
        rank = siblings.get(parent, 0)
        siblings[parent] = rank + 1
        choice[node] = (*choice[parent], rank)
    tree = build_tree([list(choice[n]) for n in keep])
    node_of = {choice[n]: n for n in keep}
    tokens = np.array([root] + [cands.token[node_of[c]] for c in tree.choices], dtype=np.int64)
    confidence = np.array([math.exp(cands.score[n] - (cands.score[cands.parent[n]] if cands.parent[n] >= 0 else 0.0))
                           for n in (node_of[c] for c in tree.choices)])
    return Draft(tree, tokens, confidence=confidence)
