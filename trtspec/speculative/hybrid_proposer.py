"""Hybrid drafting: a trained drafter's tree (Medusa heads, EAGLE-1 or EAGLE-2) and the training-free candidates
(prompt lookup, the suffix sources, Token Recycling) merged into one tree that fits the engine's slot profiles.

Every candidate node gets an estimated acceptance probability (`ngram_proposer.AcceptanceModel`) and the step drafts
the nodes and profile that maximise expected tokens per unit of verify cost. The drafter runs only where its
accepted nodes pay for its own measured time, looking again now and then; on the steps it skips it records what was
committed (`defer`) and catches up in one run before it drafts (`catch_up`). How the trie is merged and when the
drafter runs: docs/drafting.md, "Hybrid drafting, in detail".
"""

from __future__ import annotations

import time

# the same look-again intervals, smoothing and default step time as the back-off of trees (one definition)
from trtspec.speculative.backoff import DEFAULT_STEP_MS, EMA, EXPLORE_EVERY, EXPLORE_MAX
from trtspec.speculative.ngram_proposer import DRAFTER, NgramProposer, _Node, drafter_kind
FIRST_LOOK_BELOW = 1.0  # the drafter first drafts on a step whose other candidates expect fewer tokens than this


class HybridProposer(NgramProposer):
    """`NgramProposer`'s candidates plus a trained drafter's tree, under one budget."""

    def __init__(self, drafter, costs, config, **kwargs):
        super().__init__(costs, config, **kwargs)
        self.drafter = drafter
        self._deferrable = all(hasattr(drafter, m) for m in ("defer", "catch_up", "start_deferred"))
        self._pending: list = []  # deferred entries of the steps the drafter skipped
        self._drafter_ms: float | None = None  # measured time of a drafting step (catch-up + propose)
        self._drafter_gain = 0.5  # its accepted nodes per step where it drafted (a prior, then measured)
        self._since_drafted, self._explore_every = 0, EXPLORE_EVERY
        self._drafted = self._exploring = False  # the drafter drafted this step (because it was time to look)
        self.drafter_steps = self.steps = 0

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        super().start(engine, seq, prefill, prompt_ids, root)
        if self._deferrable:  # the drafter's pass over the prompt waits until it first drafts
            self._pending.append(self.drafter.start_deferred(engine, seq, prefill, prompt_ids, root))
        else:
            self.drafter.start(engine, seq, prefill, prompt_ids, root)

    def _candidates(self) -> list[_Node]:
        nodes: list[_Node] = []
        children: dict[tuple[int, int], int] = {}
        self._lookup(nodes, children)
        for kind, source in self.sources:
            self._source_candidates(nodes, children, kind, source)
        self.steps += 1
        self._drafted = self._drafter_pays(nodes)
        if self._drafted:
            self._drafter_candidates(nodes, children)
        self._recycle_candidates(nodes)
        return nodes

    def _drafter_pays(self, nodes: list[_Node]) -> bool:
        self._since_drafted += 1
        self._exploring = False
        if not self._deferrable:
            return True
        if self._drafter_ms is None:  # never drafted: first where the sequence itself offers little
            return sum(node.p for node in nodes) < FIRST_LOOK_BELOW
        step_ms = self.costs.step_ms[0] if self.costs.step_ms else DEFAULT_STEP_MS
        if self._drafter_gain * step_ms > self._drafter_ms:
            return True
        self._exploring = self._since_drafted >= self._explore_every
        return self._exploring

    def _drafter_candidates(self, nodes: list[_Node], children: dict) -> None:
        began = time.perf_counter()
        if self._pending:
            self.drafter.catch_up(self._pending)
            self._pending = []
        draft = self.drafter.propose(self.index.tokens[-1])
        ms = 1000 * (time.perf_counter() - began)
        self._drafter_ms = ms if self._drafter_ms is None else (1 - EMA) * self._drafter_ms + EMA * ms
        self._since_drafted, self.drafter_steps = 0, self.drafter_steps + 1
        tree, placed = draft.tree, {0: -1}  # drafter tree node → candidate index (its root: -1)
        for node in range(1, tree.num_nodes + 1):  # tree order: parents first
            parent = placed.get(int(tree.parents[node]))
            if parent is None:
                continue  # its parent was pruned
            token = int(draft.tokens[node])
            existing = children.get((parent, token))
            if existing is not None:
                nodes[existing].support += 1
                placed[node] = existing
                continue
            depth = int(tree.position_offsets[node])
            kind = drafter_kind(depth, int(tree.ranks[node]),
                                None if draft.confidence is None else float(draft.confidence[node - 1]))
            p = self.model.rate(kind) * (nodes[parent].p if parent >= 0 else 1.0)
            if p < 0.01:
                continue
            placed[node] = children[(parent, token)] = len(nodes)
            nodes.append(_Node(token, parent, kind, p, (nodes[parent].depth if parent >= 0 else 0) + 1))

    def observe(self, verify, accepted) -> None:
        if self._drafted and self._draft is not None:
            on_path = set(accepted.slots)
            gain = sum(1 for node in on_path if self._kinds[node - 1][0] == DRAFTER)
            self._drafter_gain = (1 - EMA) * self._drafter_gain + EMA * gain
            if self._exploring:
                self._explore_every = EXPLORE_EVERY if gain else min(2 * self._explore_every, EXPLORE_MAX)
        super().observe(verify, accepted)
        if self._deferrable:
            self._pending.append(self.drafter.defer(verify, accepted))
        else:
            self.drafter.observe(verify, accepted)
