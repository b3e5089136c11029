"""Training-free drafts from the sequence itself: prompt lookup (n-gram matches) and Token Recycling, budgeted; and
with method `suffix`, the same suffix looked up in a corpus (`Datastore`) and in the server's recent outputs.

Every candidate node gets an estimated probability of acceptance (the product down its path of rates learnt online
per kind of node, `AcceptanceModel`), and the step drafts, on the engine's verify curve (`StepCosts`), the nodes
and slot profile that maximise expected tokens per unit of cost, or nothing where a plain step is worth more.
Drafts are deterministic token choices (q = 1), so greedy output is plain greedy output and the tree rejection rule
keeps the target distribution at T > 0. Each source and the budget, in detail: docs/drafting.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.proposer import Draft
from trtspec.speculative.step_costs import StepCosts
from trtspec.speculative.tree import EMPTY_CHOICES, Tree, tree_from_choices

NGRAM, RECYCLED = "ngram", "recycled"
SUFFIX_RECENT, SUFFIX_CORPUS = "suffix-recent", "suffix-corpus"  # node kinds of the suffix sources
DRAFTER = "drafter"  # a trained drafter's node in a hybrid draft (hybrid_proposer): (DRAFTER, depth, rank)
PROMPT_ROWS_RECYCLED = 256  # the prefill's last rows whose top-k seed the Token Recycling table


@dataclass(frozen=True, kw_only=True)
class NgramConfig:
    """Per-request drafting options (`generate --ngram`, the Triton `ngram` parameters)."""

    max_ngram: int = 4  # longest suffix matched
    min_ngram: int = 1  # shortest suffix matched
    max_occurrences: int = 3  # most recent earlier occurrences whose continuations are drafted
    recycle_top_k: int = 2  # Token Recycling: successors kept per token (0: off)
    recycle_depth: int = 3  # Token Recycling: deepest recycled level
    max_draft_len: int | None = None  # at most this many draft tokens (None: the engine's K)
    suffix_samples: int = 32  # suffix sources: occurrences whose continuations are read per lookup

    def __post_init__(self):
        for name in ("max_ngram", "min_ngram", "max_occurrences", "suffix_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ngram {name} must be a positive int, got {value!r}")
        if self.min_ngram > self.max_ngram:
            raise ConfigError(f"ngram range is empty: min_ngram {self.min_ngram} > max_ngram {self.max_ngram}")
        for name in ("recycle_top_k", "recycle_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"ngram {name} must be a non-negative int, got {value!r}")
        if self.max_draft_len is not None and (isinstance(self.max_draft_len, bool) or
                                               not isinstance(self.max_draft_len, int) or self.max_draft_len < 0):
            raise ConfigError(f"ngram max_draft_len must be a non-negative int, got {self.max_draft_len!r}")


# Prior conditional acceptance rates (a node accepted given its parent was), by node kind, learnt online from there:
# a continuation after a long match is right far more often than after a one-token match (docs/results.md).
PRIOR_WEIGHT = 4.0
MATCH_BUCKETS = (1, 2, 3, 4, 6, 10)  # a match of m tokens counts as the largest bucket <= m
NGRAM_PRIOR = {1: 0.20, 2: 0.45, 3: 0.60, 4: 0.75, 6: 0.80, 10: 0.85}
RECYCLED_PRIOR = (0.30, 0.10, 0.05)  # by rank among the recycled successors
# suffix sources: by match length, times a factor by how often the node followed its parent among the occurrences
# read (FREQ_BUCKETS: 0 = its parent was seen once, then >= 0.9, >= 0.6, >= 0.3, below)
SUFFIX_PRIOR = {1: 0.15, 2: 0.30, 3: 0.45, 4: 0.55, 6: 0.60, 10: 0.65}
FREQ_BUCKETS = (0.9, 0.6, 0.3)
FREQ_FACTOR = (0.7, 1.0, 0.75, 0.45, 0.2)
DRAFTER_PRIOR = (0.45, 0.15, 0.08, 0.05)  # a trained drafter's node by its rank among its siblings (depth 1)
# a trained drafter that says how sure it is (Draft.confidence): its nodes learn their rates per band of that
# probability (the bands' lower edges after 0), from the same prior, since how well it is calibrated is not known
CONFIDENCE_BANDS = (0.1, 0.3, 0.6)
LONGEST_MATCH = max(MATCH_BUCKETS)


class AcceptanceModel:
    """Conditional acceptance rates per node kind, counted over every drafted node whose parent was accepted.

    One model may be shared by every sequence of a generator (rates converge across requests); it only steers how
    much is drafted, never what is emitted. `decay` < 1 weighs a kind's older trials down at each new one (a model
    that follows the text it drafts for); `prior_weight` is how many trials the prior counts for."""

    def __init__(self, *, prior_weight: float = PRIOR_WEIGHT, decay: float = 1.0):
        self.counts: dict[tuple, list[float]] = {}
        self.prior_weight, self.decay = prior_weight, decay

    def rate(self, kind: tuple) -> float:
        hits, trials = self.counts.get(kind, (0.0, 0.0))
        return (hits + self.prior_weight * _prior(kind)) / (trials + self.prior_weight)

    def record(self, kind: tuple, accepted: bool) -> None:
        counts = self.counts.setdefault(kind, [0.0, 0.0])
        counts[0] = self.decay * counts[0] + accepted
        counts[1] = self.decay * counts[1] + 1

    def to_dict(self) -> dict:
        return {"/".join(map(str, k)): round(self.rate(k), 3) for k in sorted(self.counts, key=str)}


def _prior(kind: tuple) -> float:
    if kind[0] == NGRAM:
        _, match, _, rank = kind
        return NGRAM_PRIOR[match] * (0.4 if rank else 1.0)
    if kind[0] == DRAFTER:
        _, depth, rank = kind[:3]
        return DRAFTER_PRIOR[rank] * (0.85 ** (depth - 1))
    if kind[0] in (SUFFIX_RECENT, SUFFIX_CORPUS):
        _, match, depth, freq = kind
        return SUFFIX_PRIOR[match] * FREQ_FACTOR[freq] * (0.95 ** (depth - 1))
    _, rank, depth = kind
    return RECYCLED_PRIOR[min(rank, len(RECYCLED_PRIOR) - 1)] * (0.8 ** (depth - 1))


def drafter_kind(depth: int, rank: int, confidence: float | None = None) -> tuple:
    """A trained drafter's node kind: (DRAFTER, depth, rank among its siblings), and the band of the drafter's own
    probability for it where it has one (then ranks past the first are one kind: the band says the rest)."""
    if confidence is None:
        return DRAFTER, min(depth, 4), min(rank, 3)
    return DRAFTER, min(depth, 4), min(rank, 1), bisect.bisect_right(CONFIDENCE_BANDS, confidence)


class SuffixIndex:
    """Every n-gram (n = 1..max_n) of a growing token sequence → the positions right after its occurrences."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens: list[int] = []
        self._after: list[dict[tuple, list[int]]] = [{} for _ in range(max_n + 1)]

    def extend(self, tokens) -> None:
        seq, after = self.tokens, self._after
        for token in tokens:
            seq.append(int(token))
            j = len(seq) - 1  # the n-grams ending at j - 1 are now followed by position j
            for n in range(1, min(self.max_n, j) + 1):
                after[n].setdefault(tuple(seq[j - n:j]), []).append(j)

    def continuations(self, n: int) -> list[int]:
        """Where earlier occurrences of the last n tokens continue (oldest first); [] when none."""
        if n > len(self.tokens):
            return []
        return self._after[n].get(tuple(self.tokens[-n:]), [])


@dataclass
class _Node:
    token: int
    parent: int  # index in the candidate list, -1: the root
    kind: tuple
    p: float  # estimated probability that the node is accepted
    depth: int
    support: int = 1


class NgramProposer:
    """Prompt lookup plus Token Recycling over one sequence, drafting what the verify curve says pays."""

    def __init__(self, costs: StepCosts, config: NgramConfig = NgramConfig(), *,
                 model: AcceptanceModel | None = None, max_draft_len: int | None = None,
                 sources: tuple = (), recent=None, chains: bool = False):
        """`sources`: (node kind, source) pairs with a `lookup` (datastore.Datastore / RecentOutputs), asked after
        the sequence itself; `recent`: a RecentOutputs that gets this sequence's output when it finishes; `chains`:
        draft only the most probable path of the candidates (engines that verify chains only exactly)."""
        self.config, self.model = config, model if model is not None else AcceptanceModel()
        self.sources, self.recent, self.chains = tuple(sources), recent, chains
        limit = min(x for x in (costs.max_slots - 1, config.max_draft_len, max_draft_len) if x is not None)
        self.costs, self.max_nodes = costs, limit
        self.index = SuffixIndex(config.max_ngram)
        self.recycled: dict[int, np.ndarray] = {}  # token → the target's top-k next tokens after it, best first
        self._kinds: list[tuple] = []  # kind of each node of the last draft (node i + 1)
        self._draft: Draft | None = None
        self._nodes: list[_Node] = []  # the last step's candidates
        self._chosen: list[int] = []  # the drafted ones, most probable first

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        self.index.extend(prompt_ids)
        self.index.extend([root])
        if self.config.recycle_top_k and prefill is not None:  # the rows the prefill has logits for (the CPU
            rows = min(len(prefill.logits), len(prompt_ids), PROMPT_ROWS_RECYCLED)  # engine: the last one)
            self._recycle(np.asarray(prompt_ids)[len(prompt_ids) - rows:], prefill.logits[len(prefill.logits) - rows:])

    def propose(self, root: int) -> Draft:
        nodes = self._candidates() if self.max_nodes else []
        if self.chains:
            nodes = _best_path(nodes)
        self._nodes, self._chosen = nodes, _budget(nodes, self.costs, self.max_nodes)
        return self._lay_out(root)

    def shrink(self, max_nodes: int) -> Draft:
        """Keep the `max_nodes` most probable nodes of the draft just proposed (an in-flight batch's budget)."""
        self._chosen = self._chosen[:max_nodes]
        return self._lay_out(int(self._draft.tokens[0]))

    def _lay_out(self, root: int) -> Draft:
        nodes = self._nodes
        tree, order = _tree_of(nodes, self._chosen)
        self._kinds = [nodes[i].kind for i in order]
        tokens = np.array([root, *(nodes[i].token for i in order)], dtype=np.int64)
        self._draft = Draft(tree, tokens, np.array([nodes[i].p for i in order]))
        return self._draft

    def observe(self, verify, accepted) -> None:
        draft = self._draft
        if draft is not None and draft.tree.num_nodes:
            on_path = {0, *accepted.slots}
            for node in range(1, draft.tree.num_nodes + 1):
                if int(draft.tree.parents[node]) in on_path:  # tried: its parent was accepted
                    self.model.record(self._kinds[node - 1], node in on_path)
        if self.config.recycle_top_k and draft is not None:
            rows = [0, *accepted.slots]
            self._recycle(draft.tokens[rows], verify.logits[rows])
        self.index.extend(accepted.tokens)

    def finish(self, output_ids: list[int]) -> None:
        """The sequence ended: its output joins the shared recent outputs (method suffix)."""
        if self.recent is not None:
            self.recent.add(output_ids)

    # ---- candidates ----------------------------------------------------------------------------------------

    def _candidates(self) -> list[_Node]:
        nodes: list[_Node] = []
        children: dict[tuple[int, int], int] = {}  # (parent, token) → node, shared by every source
        self._lookup(nodes, children)
        for kind, source in self.sources:
            self._source_candidates(nodes, children, kind, source)
        self._recycle_candidates(nodes)
        return nodes

    def _lookup(self, nodes: list[_Node], children: dict) -> None:
        """The continuations of the longest matched suffix, most recent occurrence first, merged into a trie."""
        cfg, seq = self.config, self.index.tokens
        for n in range(min(cfg.max_ngram, len(seq) - 1), cfg.min_ngram - 1, -1):
            starts = self.index.continuations(n)
            if starts:
                break
        else:
            return
        fanout: dict[int, int] = {}  # parent → children so far (the next child's rank)
        for start in reversed(starts[-cfg.max_occurrences:]):
            match = _bucket(_match_length(seq, start, n))
            parent, depth = -1, 0
            for token in seq[start:start + self.max_nodes]:
                depth += 1
                node = children.get((parent, token))
                if node is None:
                    rank = fanout.get(parent, 0)
                    fanout[parent] = rank + 1
                    kind = (NGRAM, match, min(depth, 4), min(rank, 1))
                    p = self.model.rate(kind) * (nodes[parent].p if parent >= 0 else 1.0)
                    node = len(nodes)
                    nodes.append(_Node(token, parent, kind, p, depth))
                    children[(parent, token)] = node
                else:
                    nodes[node].support += 1
                parent = node

    def _source_candidates(self, nodes: list[_Node], children: dict, name: str, source) -> None:
        """The continuations a suffix source read for the sequence's longest suffix it has seen, counted into a
        trie; each new node's kind carries how often it followed its parent there (nodes the sequence itself
        already drafted are kept as they are)."""
        cfg = self.config
        match = source.lookup(self.index.tokens, min_ngram=cfg.min_ngram, max_positions=cfg.suffix_samples,
                              depth=self.max_nodes)
        if match.empty:
            return
        rows = match.continuations.tolist()
        local: dict[tuple[int, int], int] = {}  # (local parent, token) → local node
        count, token_of, parent_of, depth_of = [], [], [], []
        for row in rows:
            parent = -1
            for depth, token in enumerate(row, start=1):
                if token < 0:
                    break
                node = local.get((parent, token))
                if node is None:
                    node = local[(parent, token)] = len(count)
                    count.append(0)
                    token_of.append(token)
                    parent_of.append(parent)
                    depth_of.append(depth)
                count[node] += 1
                parent = node
        match_bucket, placed = _bucket(match.n), {}
        for node in range(len(count)):  # creation order: parents first
            lparent = parent_of[node]
            if lparent >= 0 and lparent not in placed:
                continue  # its parent was pruned
            parent = placed[lparent] if lparent >= 0 else -1
            token = token_of[node]
            existing = children.get((parent, token))
            if existing is not None:
                nodes[existing].support += count[node]
                placed[node] = existing
                continue
            seen = count[lparent] if lparent >= 0 else len(rows)
            kind = (name, match_bucket, min(depth_of[node], 4), _freq_bucket(count[node], seen))
            p = self.model.rate(kind) * (nodes[parent].p if parent >= 0 else 1.0)
            if p < 0.01:
                continue
            placed[node] = children[(parent, token)] = len(nodes)
            nodes.append(_Node(token, parent, kind, p, depth_of[node], count[node]))

    def _recycle_candidates(self, nodes: list[_Node]) -> None:
        """Token Recycling below the root (and below its recycled children), where the root's top child from the
        lookup is not already the same token."""
        cfg = self.config
        if not cfg.recycle_top_k or not cfg.recycle_depth:
            return
        taken = {nodes[i].token for i in range(len(nodes)) if nodes[i].parent == -1}
        frontier = [(-1, self.index.tokens[-1], 1.0)]
        for depth in range(1, cfg.recycle_depth + 1):
            nxt = []
            for parent, token, p_parent in frontier:
                successors = self.recycled.get(token)
                if successors is None:
                    continue
                for rank, succ in enumerate(successors[:cfg.recycle_top_k].tolist()):
                    if parent == -1 and succ in taken:
                        continue
                    kind = (RECYCLED, rank, min(depth, 3))
                    p = self.model.rate(kind) * p_parent
                    if p < 0.01:
                        continue
                    nodes.append(_Node(succ, parent, kind, p, depth))
                    nxt.append((len(nodes) - 1, succ, p))
            frontier = nxt

    def _recycle(self, tokens: np.ndarray, logits: np.ndarray) -> None:
        """Keep each token's top-k successors under these logits rows (k argmax passes: far cheaper than a partial
        sort of a 49 k vocabulary)."""
        if len(tokens) == 0:
            return
        rows = np.array(logits, dtype=np.float32, copy=True)  # [r, V], masked below
        top = np.empty((len(rows), self.config.recycle_top_k), np.int64)
        at = np.arange(len(rows))
        for j in range(top.shape[1]):
            top[:, j] = rows.argmax(axis=-1)
            rows[at, top[:, j]] = -np.inf
        for token, row in zip(np.asarray(tokens).tolist(), top):
            self.recycled[token] = row


def _match_length(seq: list[int], start: int, n: int) -> int:
    """How many tokens before `start` equal the sequence's last ones (at least n, which the index matched; counted
    on up to LONGEST_MATCH)."""
    end, m = len(seq), n
    while m < LONGEST_MATCH and start - m - 1 >= 0 and seq[start - m - 1] == seq[end - m - 1]:
        m += 1
    return m


def _bucket(match: int) -> int:
    return max(b for b in MATCH_BUCKETS if b <= match)


def _freq_bucket(count: int, seen: int) -> int:
    """0 when the parent was seen once, else 1..4 by the share of its occurrences this child followed."""
    if seen < 2:
        return 0
    share = count / seen
    return 1 + sum(share < b for b in FREQ_BUCKETS)


def _best_path(nodes: list[_Node]) -> list[_Node]:
    """The candidates' most probable root-to-leaf walk: from the root, the most probable child each time (the first
    found among equals), re-linked as a chain."""
    kids: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):  # parents come before their children
        kids.setdefault(node.parent, []).append(i)
    path, parent = [], -1
    while parent in kids:
        best = max(kids[parent], key=lambda i: (nodes[i].p, -i))
        node = nodes[best]
        path.append(_Node(node.token, len(path) - 1, node.kind, node.p, node.depth, node.support))
        parent = best
    return path


def _budget(nodes: list[_Node], costs: StepCosts, max_nodes: int) -> list[int]:
    """The nodes to draft: for each slot profile its most probable nodes that fit, the profile with the most
    expected tokens per unit of step cost; [] when a plain step is worth more."""
    if not nodes:
        return []
    # parents before children among equals: a child's p never exceeds its parent's
    ranked = sorted(range(len(nodes)), key=lambda i: (-nodes[i].p, nodes[i].depth, i))[:max_nodes]
    gain = np.concatenate([[0.0], np.cumsum([nodes[i].p for i in ranked])])
    best, best_value = 0, 1.0  # a plain step: one token for one step's cost
    for slots, cost in zip(costs.profiles[1:], costs.relative[1:]):
        m = min(slots - 1, len(ranked))
        value = (1.0 + gain[m]) / cost
        if value > best_value + 1e-9:
            best, best_value = m, value
        if slots - 1 >= len(ranked):
            break
    return ranked[:best]


def _tree_of(nodes: list[_Node], chosen: list[int]) -> tuple[Tree, list[int]]:
    """The draft tree of the chosen nodes and the candidate index of each tree node (node i + 1)."""
    if not chosen:
        return tree_from_choices(EMPTY_CHOICES), []
    chosen_set = set(chosen)
    choice_of: dict[int, tuple[int, ...]] = {}
    rank_used: dict[int, int] = {}
    for i in sorted(chosen):  # candidate order puts parents first
        parent = nodes[i].parent
        assert parent == -1 or parent in chosen_set, "draft nodes must be prefix closed"
        rank = rank_used.get(parent, 0)
        rank_used[parent] = rank + 1
        choice_of[i] = (*choice_of.get(parent, ()), rank)
    by_choice = {c: i for i, c in choice_of.items()}
    tree = tree_from_choices(tuple(sorted(choice_of.values(), key=lambda c: (len(c), c))))
    return tree, [by_choice[c] for c in tree.choices]
