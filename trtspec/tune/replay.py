"""Drafting replayed offline over the model's own greedy outputs: what `trtspec tune` predicts τ from.

`record_greedy` decodes prompts plainly (greedy) once and keeps, for every output token, the target's top-k at the
row that produced it and, on a Medusa engine, where each head ranked the token it was predicting. At T = 0 a
speculative run emits exactly that output, so a drafter's run can be replayed without the model:

- `replay_drafter` feeds the recorded continuation to a training-free proposer (ngram, suffix) step by step: it
  proposes a tree, the replay accepts the longest path that matches the recording (the greedy rule), hands the
  proposer the accepted tokens and synthetic logits rows carrying the recorded top-k (what Token Recycling reads),
  and counts steps, accepted tokens, slot profiles and the proposer's own time;
- `replay_tree` walks a Medusa tree over the recorded head ranks: at each step the accepted length is the longest
  prefix of the true tokens' ranks that is a path of the tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.engine import StepOutput
from trtspec.speculative.proposer import EMPTY_TREE, Draft, top_ranked
from trtspec.speculative.stats import SpecStats

TOP_K = 8  # target top-k kept per row (Token Recycling reads its recycle_top_k <= this)
HEAD_RANKS = 10  # Medusa: ranks kept per head; a token ranked lower counts as "not in the top HEAD_RANKS"


@dataclass
class Recording:
    """One prompt's greedy output and what the model said along it."""

    prompt_ids: list[int]
    output_ids: list[int]
    # [T, TOP_K]: row j is the target's top-k at the row that produced output_ids[j] (T - 1 rows when the output
    # ended on its end token: the step that emitted it is not observed, and no replay needs its row)
    top: np.ndarray
    # [T, heads]: the rank of output_ids[j + 1 + h] among head h's candidates at that same row (HEAD_RANKS: lower
    # or past the end); None when the engine has no Medusa heads
    head_ranks: np.ndarray | None = None
    head_s: float = 0.0  # time spent running the heads over the recording (their cost per step, times steps)
    # the plain decode's own time after the first token, the recorder's work left out: the plain step as the loop
    # runs it on this machine now
    plain_decode_s: float = 0.0


class GreedyRecorder:
    """A drafter that drafts nothing (plain decoding) and records the target's top-k rows, and the heads' ranks."""

    def __init__(self, heads: int = 0):
        self.heads = heads
        self.engine = None
        self.top: list[np.ndarray] = []
        self.head_top: list[np.ndarray] = []  # [heads, HEAD_RANKS] per row
        self.head_s = 0.0
        self.record_s = 0.0  # all of the recorder's own work (top-k rows, heads)

    def start(self, engine, seq, prefill: StepOutput, prompt_ids, root) -> None:
        self.engine = engine
        self._row(prefill.logits[-1], None if prefill.hidden is None else prefill.hidden[-1])

    def propose(self, root: int) -> Draft:
        return Draft(EMPTY_TREE, np.array([root], dtype=np.int64))

    def observe(self, verify: StepOutput, accepted: Accepted) -> None:
        self._row(verify.logits[0], None if verify.hidden is None else verify.hidden[0])

    def _row(self, logits: np.ndarray, hidden) -> None:
        start = time.perf_counter()
        self.top.append(top_ranked(logits, TOP_K))
        if self.heads:
            heads_start = time.perf_counter()
            heads = self.engine.medusa_logits(hidden)  # [heads, V]
            self.head_s += time.perf_counter() - heads_start
            self.head_top.append(np.stack([top_ranked(row, HEAD_RANKS) for row in heads]))
        self.record_s += time.perf_counter() - start

    def recording(self, prompt_ids: list[int], output_ids: list[int], decode_s: float = 0.0) -> Recording:
        n = len(output_ids)
        top = np.stack(self.top[:n])
        ranks = None
        if self.heads:
            ranks = np.full((n, self.heads), HEAD_RANKS, dtype=np.int64)
            for j, candidates in enumerate(self.head_top[:n]):
                for h in range(self.heads):
                    if j + 1 + h < n:
                        hit = np.flatnonzero(candidates[h] == output_ids[j + 1 + h])
                        ranks[j, h] = hit[0] if hit.size else HEAD_RANKS
        # the first row (the prefill's) is not decode time
        first = self.record_s / max(1, len(self.top))
        plain = max(0.0, decode_s - (self.record_s - first))
        return Recording(list(prompt_ids), list(output_ids), top, ranks, self.head_s, plain)


def record_greedy(generator, prompts: list[list[int]], max_tokens: int, *, heads: int = 0,
                  advance=lambda: None) -> list[Recording]:
    """Plain greedy decoding of each prompt on the generator's engine, recorded (module docstring)."""
    from trtspec.speculative.loop import GenerationConfig, generate

    config = GenerationConfig(max_tokens=max_tokens, end_id=generator.manifest.model.end_id)
    out = []
    for ids in prompts:
        recorder = GreedyRecorder(heads)
        result = generate(generator.engine, ids, recorder, config)
        out.append(recorder.recording(ids, result.output_ids, result.total_s - result.ttft_s))
        advance()
    return out


@dataclass
class Replayed:
    """A drafter replayed over recordings: its statistics as a run would count them, and its own time."""

    stats: SpecStats = field(default_factory=SpecStats)
    tokens: int = 0  # output tokens after the first (what the verify steps emitted)

    def merge(self, other: Replayed) -> Replayed:
        return Replayed(self.stats.merge(other.stats), self.tokens + other.tokens)


def replay_drafter(proposer, recording: Recording, costs, vocab_size: int, max_tokens: int) -> Replayed:
    """Replay one recording through a fresh training-free `proposer` (module docstring), as a run of `max_tokens`
    would go: a recording longer than that (by K) lets the last step accept past the end, as a run counts it."""
    g, top = recording.output_ids, recording.top
    end = min(max_tokens, len(g))
    stats = SpecStats()
    start = time.perf_counter()
    proposer.start(None, None, StepOutput(_rows(top[:1], vocab_size)), np.asarray(recording.prompt_ids), g[0])
    stats.draft_s += time.perf_counter() - start
    pos = 1  # tokens emitted so far: g[0] came from the prefill
    while pos < end:
        start = time.perf_counter()
        draft = proposer.propose(g[pos - 1])
        stats.draft_s += time.perf_counter() - start
        slots = _accepted_path(draft, g, pos)
        stats.record(drafted=draft.tree.num_nodes, depth=draft.tree.depth, accepted=len(slots),
                     slots=costs.profile_for(draft.tree.num_nodes + 1))
        if pos + len(slots) + 1 >= end:  # the run ends within this step: nothing left to draft
            break
        emitted = tuple(g[pos:pos + len(slots) + 1])  # the accepted tokens, then the bonus token
        logits = np.zeros((draft.tree.num_nodes + 1, vocab_size), np.float32)  # [K+1, V]: accepted rows only
        for i, slot in enumerate((0, *slots)):
            logits[slot] = _rows(top[pos + i:pos + i + 1], vocab_size)[0]
        start = time.perf_counter()
        proposer.observe(StepOutput(logits), Accepted(slots, emitted, slots[-1] if slots else 0))
        stats.draft_s += time.perf_counter() - start
        pos += len(emitted)
    finish = getattr(proposer, "finish", None)
    if finish is not None:
        finish(list(g[:end]))
    return Replayed(stats, end - 1)


def _accepted_path(draft: Draft, g: list[int], pos: int) -> tuple[int, ...]:
    """The greedy rule on the recording: the longest root-to-leaf path whose tokens are g[pos], g[pos + 1], ..."""
    tree, tokens = draft.tree, draft.tokens
    path, node = [], 0
    while pos + len(path) < len(g):
        want = g[pos + len(path)]
        child = next((c for c in range(1, tree.num_nodes + 1)
                      if int(tree.parents[c]) == node and int(tokens[c]) == want), None)
        if child is None:
            break
        path.append(child)
        node = child
    return tuple(path)


def _rows(top: np.ndarray, vocab_size: int) -> np.ndarray:
    """Logits rows [n, V] whose top-k is each row of `top` in order (every other token below them)."""
    rows = np.zeros((len(top), vocab_size), np.float32)
    for i, ids in enumerate(top):
        rows[i, ids] = np.arange(len(ids), 0, -1, dtype=np.float32)
    return rows


def replay_tree(recordings: list[Recording], choices: list[list[int]], max_tokens: int, costs=None) -> SpecStats:
    """A Medusa tree (rank paths) walked over the recorded head ranks: steps and accepted tokens at T = 0 of a run
    of `max_tokens`."""
    from trtspec.speculative.tree import build_tree

    paths = {tuple(c) for c in choices}
    tree = build_tree([list(c) for c in choices])
    slots = costs.profile_for(tree.num_nodes + 1) if costs is not None else 0
    stats = SpecStats()
    for r in recordings:
        g, ranks = r.output_ids, r.head_ranks
        end, pos = min(max_tokens, len(g)), 1
        while pos < end:
            accepted = 0
            while accepted < ranks.shape[1] and tuple(ranks[pos - 1, :accepted + 1]) in paths:
                accepted += 1
            stats.record(drafted=tree.num_nodes, depth=tree.depth, accepted=accepted, slots=slots)
            pos += accepted + 1
    return stats
