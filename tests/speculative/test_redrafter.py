"""ReDrafter's beam search and its tree, against a plain beam search and a Markov chain whose drafter is exact: the
beams are the search's, they merge into one tree, greedy output is plain greedy output with drafts accepted, and
sampled output keeps the chain's distribution."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trtspec.errors import ConfigError
from trtspec.speculative.engine import StepOutput
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.proposer import NoDraft
from trtspec.speculative.redrafter_proposer import FIRST_BEAM_ONLY, ReDrafterProposer, beam_search, beams_to_tree

from tests.speculative.test_ngram import MarkovEngine, _deterministic_table, assert_keeps_the_target_distribution


class StepRecorder:
    """A drafter step whose logits depend on the beam's token and its carried state (state = a running sum of the
    beam's tokens, started by the first step), so a beam that carried another beam's state scores differently."""

    def __init__(self, vocab: int, seed: int = 3):
        self.table = np.random.default_rng(seed).standard_normal((vocab, vocab))
        self.vocab, self.calls = vocab, []

    def __call__(self, hidden, tokens, state, has_state):
        self.calls.append(has_state.ravel().tolist())
        next_state = has_state * state + tokens[:, None].astype(np.float32)
        rows = (tokens + next_state[:, 0].astype(np.int64)) % self.vocab
        return self.table[rows], next_state


def plain_beam_search(step, root: int, beams: int, depth: int):
    """A beam search over Python lists, one beam at a time: (score, tokens, state) kept per beam."""
    alive = [(0.0, [root], np.zeros(1, np.float32), 0.0)] + [(FIRST_BEAM_ONLY, [root], np.zeros(1, np.float32), 0.0)
                                                             ] * (beams - 1)
    for _ in range(depth):
        grown = []
        for b, (score, tokens, state, has) in enumerate(alive):
            logits, next_state = step(np.zeros((1, 2)), np.array([tokens[-1]]), state[None], np.array([[has]]))
            log_probs = logits[0] - logits[0].max()
            log_probs = log_probs - np.log(np.exp(log_probs).sum())
            grown += [(score + log_probs[t], b, t, tokens + [t], next_state[0]) for t in range(len(log_probs))]
        grown.sort(key=lambda g: (-g[0], g[1] * 10_000 + g[2]))
        alive = [(s, tokens, state, 1.0) for s, _, _, tokens, state in grown[:beams]]
    return [tokens for _, tokens, _, _ in alive]


def test_the_beam_search_is_a_beam_search_and_beams_carry_their_own_state():
    step = StepRecorder(vocab=7)
    engine = SimpleNamespace(redrafter_step=step)
    beams, probs = beam_search(engine, np.zeros(2, np.float32), root=3, num_beams=3, draft_len=4)
    assert beams.tolist() == plain_beam_search(StepRecorder(vocab=7), 3, 3, 4)
    # the first depth scores the root once (upstream: every beam, all but one at -50000), without a state (rnn_embed(x,
    # None)); the later ones every beam, with its state
    assert step.calls[0] == [0] and all(c == [1, 1, 1] for c in step.calls[1:])
    assert beams.shape == (3, 5) and probs.shape == (3, 4) and np.all((probs > 0) & (probs <= 1))


def test_beams_merge_into_one_tree_shared_prefixes_once():
    beams = np.array([[9, 1, 2, 3], [9, 1, 2, 4], [9, 1, 5, 6], [9, 7, 8, 8]])
    probs = np.arange(12, dtype=float).reshape(4, 3) / 20
    tree, tokens, confidence = beams_to_tree(beams, probs)
    assert tree.num_nodes == 9  # 12 beam tokens, 3 of them shared prefixes (1, 1-2 twice, 1 again)
    paths = {tuple(tokens[n] for n in _path(tree, node)) for node in range(1, tree.num_nodes + 1)}
    assert paths == {(1,), (7,), (1, 2), (1, 5), (7, 8), (1, 2, 3), (1, 2, 4), (1, 5, 6), (7, 8, 8)}
    assert tokens[0] == 9
    first = {tuple(tokens[n] for n in _path(tree, node)): confidence[node - 1] for node in range(1, tree.num_nodes + 1)}
    assert first[(1,)] == probs[0, 0] and first[(1, 2, 4)] == probs[1, 2] and first[(7, 8)] == probs[3, 1]
    assert [tree.choices[i] for i in range(2)] == [(0,), (1,)]  # the best beam's branch first


def _path(tree, node: int) -> list[int]:
    out = []
    while node > 0:
        out.append(node)
        node = int(tree.parents[node])
    return out[::-1]


class MarkovReDrafterEngine(MarkovEngine):
    """The chain with an exact drafter: its next-token distribution is the chain's row of the beam's last token."""

    def __init__(self, table, max_draft_len: int = 16, num_beams: int = 2, draft_len: int = 3):
        super().__init__(table, max_draft_len)
        self.has_redrafter = True
        self.manifest = SimpleNamespace(redrafter={"num_beams": num_beams, "draft_len_per_beam": draft_len},
                                        lookahead=None)

    def prefill(self, seq, token_ids):
        out = super().prefill(seq, token_ids)
        return StepOutput(out.logits, hidden=np.zeros((len(out.logits), 2), np.float32))

    def verify(self, seq, tokens, depths, mask):
        out = super().verify(seq, tokens, depths, mask)
        return StepOutput(out.logits, hidden=np.zeros((len(out.logits), 2), np.float32), slots=out.slots)

    def redrafter_step(self, hidden, tokens, state, has_state):
        return self.logits[np.asarray(tokens)], state


def test_greedy_output_is_plain_greedy_and_an_exact_drafter_is_accepted():
    engine = MarkovReDrafterEngine(_deterministic_table(12))
    prompts = [np.array([0, 1, 2]), np.array([5, 5, 7, 1]), np.array([11])]
    plain = [generate(engine, p, NoDraft(), GenerationConfig(max_tokens=30)).output_ids for p in prompts]
    for backoff in (False, True):
        spec = [generate(engine, p, make_proposer("redrafter", engine, backoff=backoff),
                         GenerationConfig(max_tokens=30)) for p in prompts]
        assert [r.output_ids for r in spec] == plain
        if not backoff:  # the best beam is the chain's greedy path: whole beams land
            assert all(r.stats.accepted_tokens >= 20 for r in spec), [r.stats.accepted_tokens for r in spec]
    batched = generate_batch(engine, [Request(p, make_proposer("redrafter", engine), GenerationConfig(max_tokens=30))
                                      for p in prompts], max_batch_size=3)
    assert [r.output_ids for r in batched] == plain


def test_sampled_output_keeps_the_target_distribution():
    assert_keeps_the_target_distribution(
        lambda: ReDrafterProposer(2, 2), runs=4000,
        engine_class=lambda table: MarkovReDrafterEngine(table, num_beams=2, draft_len=2))


def test_an_engine_without_the_drafter_is_refused_in_one_line():
    engine = MarkovEngine(_deterministic_table(5))
    with pytest.raises(ConfigError, match="method redrafter needs an engine built from a ReDrafter checkpoint"):
        make_proposer("redrafter", engine)
    big = MarkovReDrafterEngine(_deterministic_table(5), max_draft_len=4, num_beams=3, draft_len=2)
    with pytest.raises(ConfigError, match="drafts up to 6 tokens per step but the engine's max_draft_len is 4"):
        make_proposer("redrafter", big)
