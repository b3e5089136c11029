"""Back-off for drafters that do not budget their own drafts (Medusa heads, EAGLE-1/2, lookahead).

A drafter's full tree is worth its slots only when enough of it is accepted: on a CPU a step over T slots costs c(T)
plain steps (`StepCosts`), and the drafter's own work costs more. `Backoff` wraps such a drafter and, per sequence,
shrinks each draft to the nodes that pay (rates learnt per node kind, and per band of the drafter's confidence where
it says one), or verifies it whole (`prunable` False: lookahead), and rests (plain steps, the drafter only recording
what was committed) while nothing pays, looking again at growing intervals. Only how much is drafted changes, never
what is emitted, so greedy output stays plain greedy output and the target distribution is kept at T > 0. The
rules, step by step: docs/drafting.md, "Methods with a tree of their own".
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trtspec.speculative.ngram_proposer import AcceptanceModel, _budget, _Node, drafter_kind
from trtspec.speculative.proposer import EMPTY_TREE, Draft, observe_one_by_one
from trtspec.speculative.step_costs import StepCosts
from trtspec.speculative.tree import Tree, tree_from_choices

EXPLORE_EVERY, EXPLORE_MAX = 8, 64  # a resting drafter looks again after this many steps, backing off to the max
LOOK_SHARE = 0.02  # and never more often than its looks' extra cost (in plain steps) allows for this share of steps
EMA = 0.2  # weight of the newest drafting step in the drafter's measured time
# this sequence's recent steps steer its drafts: the prior counts for two trials, a trial's weight halves in about
# seven more of its kind
PRIOR_WEIGHT, DECAY = 2.0, 0.9
WHOLE_PRIOR_GAIN = 1.0  # a whole draft's accepted tokens per step before any was measured: worth a first look
RECENT_DRAFTS = 6  # a drafter that says its confidence is judged by this many of its latest drafts
DEFAULT_STEP_MS = 40.0  # a plain step's time where the verify curve has no measured milliseconds


class Backoff:
    """A drafter's trees, shrunk to what the verify curve says pays, resting while nothing does (module docstring).

    The drafter should offer `defer` / `catch_up`, else it observes every step even while resting; one whose
    `prunable` is False is verified whole or not at all."""

    def __init__(self, drafter, costs: StepCosts, *, model: AcceptanceModel | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.drafter, self.costs, self.clock = drafter, costs, clock
        self.model = model if model is not None else AcceptanceModel(prior_weight=PRIOR_WEIGHT, decay=DECAY)
        self._deferrable = all(hasattr(drafter, m) for m in ("defer", "catch_up"))
        self._prunable = getattr(drafter, "prunable", True)
        self._accepted = [0.0, 0.0]  # a whole draft's accepted tokens and drafting steps (decayed as the rates are)
        self._pending: list = []  # deferred entries of the steps the drafter rested
        self._drafter_ms: float | None = None  # measured time of a drafting step (catch-up, propose, observe)
        self._recent: deque[_Shape] = deque(maxlen=RECENT_DRAFTS)  # a confident drafter's latest drafts' shapes
        self._resting, self._rest_steps, self._rest_for = False, 0, EXPLORE_EVERY
        self._drafted = False  # the drafter ran this step
        self._pause = 0.0  # the drafter's time in this step's propose (ms)
        self._kept: list[int] = []  # the full draft's node behind each verified slot (slot i + 1)
        self._full: Draft | None = None  # the drafter's draft this step
        self._nodes: list[_Node] = []  # its nodes (node i + 1 of the full draft)
        self._shape: _Shape | None = None  # the full draft's shape
        self._chosen: list[int] = []  # the kept ones, most probable first
        self._draft: Draft | None = None  # what was verified
        self.steps = self.drafting_steps = 0
        whole = getattr(drafter, "max_nodes", None)
        if not self._prunable and whole is not None and (1.0 + self._gain) / costs.cost(whole + 1) <= 1.0:
            # its whole draft would not pay even at the prior: rest, and let even the first look wait as long as
            # the later ones must (its cost over a plain step, spread over LOOK_SHARE of the steps)
            self._resting, self._rest_for = True, max(EXPLORE_EVERY, _look_floor(costs.cost(whole + 1), 0.0))

    # ---- the proposer protocol ------------------------------------------------------------------------------

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        self.drafter.start(engine, seq, prefill, prompt_ids, root)

    def propose(self, root: int) -> Draft:
        self.steps += 1
        self._drafted = False
        if self._resting:
            self._rest_steps += 1
            if self._rest_steps < self._rest_for:
                self._draft = Draft(EMPTY_TREE, np.array([root], dtype=np.int64))
                return self._draft
        looking, began = self._resting, self.clock()
        if self._pending:
            self.drafter.catch_up(self._pending)
            self._pending = []
        full = self.drafter.propose(root)
        self._drafted, self._full = True, full
        self.drafting_steps += 1
        self._shape = _shape_of(full)
        self._nodes = _nodes_of(self._shape, self.model)
        n = full.tree.num_nodes
        self._chosen = _budget(self._nodes, self.costs, n) if self._prunable else list(range(n))
        if looking and not self._chosen and self._nodes:  # a look tries the most probable node at least
            self._chosen = [min(range(n), key=lambda i: (-self._nodes[i].p, self._nodes[i].depth, i))]
        self._pause = 1000 * (self.clock() - began)  # the drafter's share so far; observe adds the rest
        return self._lay_out()

    def shrink(self, max_nodes: int) -> Draft:
        """Keep the `max_nodes` most probable nodes of the draft just proposed (an in-flight batch's budget)."""
        if not self._drafted or not self._prunable:
            return self._draft
        self._chosen = self._chosen[:max_nodes]
        return self._lay_out()

    def observe(self, verify, accepted) -> None:
        if not self._drafted:
            self._record_rest(verify, accepted)
            return
        began = self.clock()
        self._learn(accepted)
        self.drafter.observe(verify, accepted)
        self._settle(1000 * (self.clock() - began))

    @staticmethod
    def observe_batch(proposers: list[Backoff], steps: list) -> None:
        """`observe` for several sequences: the drafting ones' drafters of one kind observe together when their kind
        can (`observe_batch`: one heads run, one draft extension), the resting ones only record."""
        kinds: dict[type, list] = {}
        for proposer, step in zip(proposers, steps):
            if proposer._drafted:
                kinds.setdefault(type(proposer.drafter), []).append((proposer, step))
            else:
                proposer._record_rest(*step)
        for kind, group in kinds.items():
            clock = group[0][0].clock
            began = clock()
            for proposer, (_, accepted) in group:
                proposer._learn(accepted)
            drafters, kind_steps = [p.drafter for p, _ in group], [s for _, s in group]
            if len(group) > 1 and hasattr(kind, "observe_batch"):
                kind.observe_batch(drafters, kind_steps)
            else:
                observe_one_by_one(drafters, kind_steps)
            share = 1000 * (clock() - began) / len(group)
            for proposer, _ in group:
                proposer._settle(share)

    def finish(self, output_ids: list[int]) -> None:
        finish = getattr(self.drafter, "finish", None)
        if finish is not None:
            finish(output_ids)

    # ---- internals ------------------------------------------------------------------------------------------

    def _lay_out(self) -> Draft:
        """The verified draft: the kept nodes of the full draft as a subtree (node_p: their estimates, by which an
        in-flight batch may shrink it further)."""
        full = self._full
        if not self._prunable:
            self._kept = list(range(1, full.tree.num_nodes + 1))
            self._draft = full
            return full
        tree, self._kept = subtree(full.tree, sorted(i + 1 for i in self._chosen))
        p = np.array([self._nodes[i - 1].p for i in self._kept])
        self._draft = Draft(tree, full.tokens[[0, *self._kept]], p)
        return self._draft

    def _learn(self, accepted) -> None:
        """Count every verified node whose parent was accepted as a trial of its kind; the whole draft's gain."""
        draft, on_path = self._draft, {0, *accepted.slots}
        for slot in range(1, draft.tree.num_nodes + 1):
            if int(draft.tree.parents[slot]) in on_path:
                self.model.record(self._nodes[self._kept[slot - 1] - 1].kind, slot in on_path)
        self._accepted = [DECAY * self._accepted[0] + accepted.num_accepted, DECAY * self._accepted[1] + 1]

    @property
    def _gain(self) -> float:
        """A whole draft's expected accepted tokens per step: what it has had, the prior counting for PRIOR_WEIGHT
        steps."""
        tokens, steps = self._accepted
        return (tokens + PRIOR_WEIGHT * WHOLE_PRIOR_GAIN) / (steps + PRIOR_WEIGHT)

    def _settle(self, observe_ms: float) -> None:
        """The drafting step's drafter time (propose and observe), then whether to rest."""
        ms = self._pause + observe_ms
        self._drafter_ms = ms if self._drafter_ms is None else (1 - EMA) * self._drafter_ms + EMA * ms
        self._decide_rest()

    def _decide_rest(self) -> None:
        """Rest when the drafter's best shrunk draft is worth less than a plain step once its own time counts."""
        step_ms = self.costs.step_ms[0] if self.costs.step_ms else DEFAULT_STEP_MS
        overhead = (self._drafter_ms or 0.0) / step_ms
        if self._prunable:
            # a drafter sure on some steps and not on others (one that says its confidence) is judged by its recent
            # drafts at today's rates, any other by this one
            if self._full.confidence is None:
                best = self._best_value(self._nodes, overhead)
            else:
                self._recent.append(self._shape)
                rates: dict = {}  # each kind's rate, once for all the recent drafts
                best = float(np.mean([self._best_value(_nodes_of(shape, self.model, rates), overhead)
                                      for shape in self._recent]))
        else:
            best = (1.0 + self._gain) / (self.costs.cost(self._full.tree.num_nodes + 1) + overhead)
        if best > 1.0:
            self._resting, self._rest_for = False, EXPLORE_EVERY
            return
        floor = _look_floor(self.costs.cost(len(self._kept) + 1), overhead)  # the next look costs about this one
        doubled = min(2 * self._rest_for, EXPLORE_MAX) if self._resting else EXPLORE_EVERY  # a look that did not pay
        self._resting, self._rest_steps, self._rest_for = True, 0, max(doubled, floor)

    def _best_value(self, nodes: list[_Node], overhead: float) -> float:
        """Expected tokens per unit of cost of the best shrunk draft of these nodes, the drafter's time counted."""
        ranked = sorted((n.p for n in nodes), reverse=True)
        gain = np.concatenate([[0.0], np.cumsum(ranked)])
        return max(((1.0 + gain[min(s - 1, len(ranked))]) / (c + overhead)
                    for s, c in zip(self.costs.profiles[1:], self.costs.relative[1:])), default=0.0)

    def _record_rest(self, verify, accepted) -> None:
        if self._deferrable:
            self._pending.append(self.drafter.defer(verify, accepted))
        else:
            self.drafter.observe(verify, accepted)


def _look_floor(cost: float, overhead: float) -> int:
    """The fewest steps between looks that cost `cost` plain steps plus the drafter's `overhead` (in plain steps)
    for their extra cost to stay within LOOK_SHARE of the steps."""
    return math.ceil((cost - 1.0 + overhead) / LOOK_SHARE)


@dataclass(frozen=True)
class _Shape:
    """What the back-off needs of a draft, read once: each node's parent (-1: the root), depth and kind (depth, rank
    among its siblings, the band of the drafter's confidence where it says one)."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    kinds: tuple[tuple, ...]


def _shape_of(draft: Draft) -> _Shape:
    tree, confidence = draft.tree, draft.confidence
    nodes = range(1, tree.num_nodes + 1)
    return _Shape(tuple(int(tree.parents[i]) - 1 for i in nodes), tuple(int(tree.position_offsets[i]) for i in nodes),
                  tuple(drafter_kind(int(tree.position_offsets[i]), int(tree.ranks[i]),
                                     None if confidence is None else float(confidence[i - 1])) for i in nodes))


def _nodes_of(shape: _Shape, model: AcceptanceModel, rates: dict | None = None) -> list[_Node]:
    """The draft's nodes with their estimated acceptance probabilities: the conditional rates of their kinds
    multiplied down their paths (`rates` caches each kind's rate across calls of one decision)."""
    rates = {} if rates is None else rates
    nodes: list[_Node] = []
    for parent, depth, kind in zip(shape.parents, shape.depths, shape.kinds):
        if kind not in rates:
            rates[kind] = model.rate(kind)
        nodes.append(_Node(0, parent, kind, rates[kind] * (nodes[parent].p if parent >= 0 else 1.0), depth))
    return nodes


def subtree(tree: Tree, keep: list[int]) -> tuple[Tree, list[int]]:
    """The tree of the kept nodes (prefix closed, node indices of `tree`) and the old index of each new node."""
    kept = set(keep)
    choice_of: dict[int, tuple[int, ...]] = {0: ()}
    used: dict[int, int] = {}
    for node in sorted(keep, key=lambda i: (int(tree.position_offsets[i]), int(tree.ranks[i]), i)):
        parent = int(tree.parents[node])
        assert parent == 0 or parent in kept, "a kept draft must be prefix closed"
        rank = used.get(parent, 0)
        used[parent] = rank + 1
        choice_of[node] = (*choice_of[parent], rank)
    by_choice = {c: i for i, c in choice_of.items() if i}
    new = tree_from_choices(tuple(sorted(by_choice, key=lambda c: (len(c), c))))
    return new, [by_choice[c] for c in new.choices]
