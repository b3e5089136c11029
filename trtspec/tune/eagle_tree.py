"""EAGLE-1 trees for `trtspec tune`: the engine's draft teacher-forced along its greedy output, the rank of every
true token recorded per depth, and the tree of each node budget with the greatest expected acceptance over them.

At T = 0 the accepted path follows the greedy output, so drafting the one chain of true tokens at every root gives
the inputs every tree's path would see; a tree accepts at a root the longest path of its nodes whose ranks are the
recorded ones (`replay.replay_tree`). Exact up to floating point (the tests compare replayed and real steps). Why
this is exact, and how the tree is chosen: docs/tuning.md, "EAGLE-1 trees for tune".
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from trtspec.tune.replay import HEAD_RANKS, GreedyRecorder, Recording
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.engine import StepOutput

TIMED_PROMPTS = 2  # recordings the drafting time of each tree is measured over


@dataclass
class EagleRecording(Recording):
    """A greedy recording with the target's features along it; `head_ranks` [T, depth] holds the draft's ranks
    (row j, column d - 1: the rank of output_ids[j + d] at depth d of a tree rooted at output_ids[j]; HEAD_RANKS or
    more: not among the candidates kept, past the end, or after a depth that missed)."""

    features: np.ndarray | None = None  # [prompt + T - 1, H]: row t the target's final hidden at position t


class _FeatureRecorder(GreedyRecorder):
    """GreedyRecorder that also keeps the target's features (the prefill's rows, then each step's)."""

    def __init__(self):
        super().__init__(0)
        self.features: list[np.ndarray] = []

    def start(self, engine, seq, prefill: StepOutput, prompt_ids, root) -> None:
        start = time.perf_counter()
        self.features.append(np.array(prefill.hidden, np.float32, copy=True))
        self.record_s += time.perf_counter() - start
        super().start(engine, seq, prefill, prompt_ids, root)

    def observe(self, verify: StepOutput, accepted: Accepted) -> None:
        start = time.perf_counter()
        self.features.append(np.array(verify.hidden[:1], np.float32, copy=True))
        self.record_s += time.perf_counter() - start
        super().observe(verify, accepted)


def record_features(generator, prompts: list[list[int]], max_tokens: int, *, advance=lambda: None) \
        -> list[EagleRecording]:
    """`replay.record_greedy` keeping the target's features too (what the draft reads)."""
    from trtspec.speculative.loop import GenerationConfig, generate

    config = GenerationConfig(max_tokens=max_tokens, end_id=generator.manifest.model.end_id)
    out = []
    for ids in prompts:
        recorder = _FeatureRecorder()
        result = generate(generator.engine, ids, recorder, config)
        r = recorder.recording(ids, result.output_ids, result.total_s - result.ttft_s)
        out.append(EagleRecording(r.prompt_ids, r.output_ids, r.top, None, 0.0, r.plain_decode_s,
                                  features=np.concatenate(recorder.features)))
        advance()
    return out


def roots(recording: Recording, max_tokens: int) -> int:
    """The roots a run of `max_tokens` can draft from: output positions 0 .. min(max_tokens, T) - 2."""
    return max(0, min(max_tokens, len(recording.output_ids)) - 1)


def teacher_force(engine, recording: EagleRecording, depth: int, max_tokens: int, max_rank: int = HEAD_RANKS,
                  advance=lambda amount=1: None) -> np.ndarray:
    """The draft's ranks along the recording (module docstring), set as its `head_ranks` and returned: per root one
    draft extension by the emitted token, and one draft step per depth after the first while the true token stays
    among the top `max_rank` (no tree goes deeper there)."""
    g, features, p = recording.output_ids, recording.features, len(recording.prompt_ids)
    n = len(g)
    ranks = np.full((n, depth), max_rank, dtype=np.int64)
    count = roots(recording, max_tokens)
    seq = engine.open()
    try:
        entry = engine.draft_extend(seq, np.asarray([*recording.prompt_ids[1:], g[0]], np.int64), features[:p])
        for j in range(count):
            feature = entry.hidden[-1]  # the root's draft state: the last committed entry's hidden and logits
            ranks[j, 0] = _rank(entry.logits[-1], g[j + 1], max_rank)
            fed = [feature]  # nodes 1..d read (the true token, the draft hidden of the node before)
            d = 1
            while d < depth and j + d + 1 < n and ranks[j, d - 1] < max_rank:
                out = engine.draft_step(seq, np.asarray(g[j + 1:j + d + 1], np.int64), np.stack(fed),
                                        np.arange(1, d + 1), np.tril(np.ones((d, d), dtype=bool)))
                ranks[j, d] = _rank(out.logits[d - 1], g[j + d + 1], max_rank)
                fed = [feature, *out.hidden[:d]]
                d += 1
            if j + 1 < count:  # the next root's state: the emitted token g[j + 1] with the target's feature before it
                entry = engine.draft_extend(seq, np.asarray(g[j + 1:j + 2], np.int64), features[p + j:p + j + 1])
            advance()
    finally:
        engine.close(seq)
    recording.head_ranks = ranks
    return ranks


def _rank(logits: np.ndarray, token: int, max_rank: int) -> int:
    """The token's rank among the draft's candidates as the proposer orders them (`top_ranked`), else max_rank."""
    from trtspec.speculative.proposer import top_ranked

    hit = np.flatnonzero(top_ranked(logits, max_rank) == token)
    return int(hit[0]) if hit.size else max_rank


def depth_accuracies(recordings: list[Recording], max_tokens: int, depth: int, max_rank: int = HEAD_RANKS) \
        -> list[list[float]]:
    """a[d][i]: the share of roots whose true token d + 1 ahead the draft ranked i-th, among the roots where the
    true tokens of depths 1..d were all among the top `max_rank` (the path so far accepted by some tree)."""
    rows = [r.head_ranks[:roots(r, max_tokens), :depth] for r in recordings]
    rows = np.concatenate(rows) if rows else np.zeros((0, depth), np.int64)
    out = []
    for d in range(depth):
        reached = rows[(rows[:, :d] < max_rank).all(axis=1), d]
        out.append([float(np.mean(reached == i)) if reached.size else 0.0 for i in range(max_rank)])
    return out


def node_probabilities(recordings: list[Recording], max_tokens: int, max_rank: int = HEAD_RANKS) \
        -> dict[tuple[int, ...], float]:
    """Each node's probability: the share of roots whose recorded ranks begin with its path (ranks < max_rank)."""
    counts: Counter = Counter()
    total = 0
    for r in recordings:
        for row in r.head_ranks[:roots(r, max_tokens)].tolist():
            total += 1
            for d, rank in enumerate(row):
                if rank >= max_rank:
                    break
                counts[tuple(row[:d + 1])] += 1
    return {path: c / total for path, c in counts.items()} if total else {}


def expected_length(probabilities: dict[tuple[int, ...], float], choices: list[list[int]]) -> float:
    """A tree's expected acceptance length per root under the measured node probabilities."""
    return 1.0 + sum(probabilities.get(tuple(c), 0.0) for c in choices)


def drafting_ms(engine, recordings: list[EagleRecording], trees: dict[str, object], max_tokens: int) -> dict:
    """Each tree's drafting time per step in milliseconds as the runtime spends it: the median of EagleProposer's
    `propose` with that tree plus the median of its `observe` (one draft extension), over the roots of the first
    TIMED_PROMPTS recordings, the trees taking turns at every root (the load of the moment shared alike)."""
    from trtspec.speculative.eagle_proposer import EagleProposer

    names = list(trees)
    propose: dict[str, list[float]] = {name: [] for name in names}
    observe: list[float] = []
    for r in recordings[:TIMED_PROMPTS]:
        g, p = r.output_ids, len(r.prompt_ids)
        proposer = EagleProposer(next(iter(trees.values())))
        seq = engine.open()
        try:
            proposer.start(engine, seq, StepOutput(np.zeros((p, 0), np.float32), r.features[:p]),
                           np.asarray(r.prompt_ids), g[0])
            for j in range(roots(r, max_tokens)):
                for i in range(len(names)):
                    name = names[(i + j) % len(names)]
                    proposer.tree = trees[name]
                    start = time.perf_counter()
                    proposer.propose(g[j])
                    propose[name].append(time.perf_counter() - start)
                if j + 1 < roots(r, max_tokens):
                    start = time.perf_counter()
                    proposer.observe(StepOutput(np.zeros((1, 0), np.float32), r.features[p + j:p + j + 1]),
                                     Accepted((), (g[j + 1],), 0))
                    observe.append(time.perf_counter() - start)
        finally:
            engine.close(seq)
    extend = float(np.median(observe)) if observe else 0.0
    return {name: 1000 * ((float(np.median(times)) if times else 0.0) + extend) for name, times in propose.items()}
