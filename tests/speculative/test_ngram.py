"""The training-free drafter: prompt lookup, Token Recycling, the slot budget, and losslessness at T = 0 and T > 0."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from trtspec.errors import ConfigError
from trtspec.speculative.engine import StepOutput
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.ngram_proposer import (NGRAM, RECYCLED, AcceptanceModel, NgramConfig, NgramProposer, SuffixIndex,
                                         _budget, _Node)
from trtspec.speculative.proposer import NoDraft
from trtspec.speculative.sampling import SamplingParams
from trtspec.speculative.step_costs import StepCosts

COSTS = StepCosts((1, 2, 3, 5, 9, 17), (1.0, 1.06, 1.09, 1.13, 1.34, 1.60))


class MarkovEngine:
    """A target whose next-token distribution depends on the last token only (row `tok` of `table`): every slot's
    logits are exact, so the loop's output distribution can be checked against the chain itself."""

    def __init__(self, table: np.ndarray, max_draft_len: int = 16):
        self.logits = np.log(table)
        self.vocab_size, self.max_draft_len = table.shape[0], max_draft_len
        self.slot_profiles, self.num_medusa_heads, self.has_eagle_draft = (2, 3, 5, 9, 17), 0, False
        self._ids = itertools.count()

    def open(self):
        return next(self._ids)

    def prefill(self, seq, token_ids):
        return StepOutput(self.logits[np.asarray(token_ids)])

    def verify(self, seq, tokens, depths, mask):
        slots = next(s for s in (1, *self.slot_profiles) if s >= len(tokens))
        return StepOutput(self.logits[np.asarray(tokens)], slots=slots)

    def commit(self, seq, slots):
        pass

    def close(self, seq):
        pass

    def step_costs(self):
        return COSTS


def _deterministic_table(vocab: int, seed: int = 0) -> np.ndarray:
    """A peaked chain: greedy decoding cycles, so prompt lookup finds long matches."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, 0.3), size=vocab) + 1e-6
    return table / table.sum(axis=1, keepdims=True)


# ---- the index and the budget ----------------------------------------------------------------------------

def test_suffix_index_finds_earlier_occurrences_only():
    index = SuffixIndex(3)
    index.extend([5, 6, 7, 5, 6])
    assert index.continuations(2) == [2]  # "5 6" occurred at 0..1, continued at position 2
    assert index.continuations(1) == [2]  # "6" occurred at 1 (its occurrence at 4 is the suffix itself)
    index.extend([8])
    assert index.continuations(1) == []  # "8" never occurred before
    assert index.continuations(3) == []


def test_suffix_index_positions_follow_each_occurrence():
    index = SuffixIndex(2)
    index.extend([1, 2, 1, 2, 1])
    assert index.continuations(1) == [1, 3]  # "1" at 0 and 2, continued at 1 and 3
    assert index.continuations(2) == [3]  # "2 1" at 1..2, continued at 3
    assert [index.tokens[p] for p in index.continuations(1)] == [2, 2]


def _node(p, parent=-1, depth=1):
    return _Node(0, parent, (NGRAM, 3, depth, 0), p, depth)


def test_budget_takes_the_profile_with_most_tokens_per_cost():
    chain = [_node(0.9 ** d, d - 2, d) for d in range(1, 17)]  # a confident 16-token chain
    assert len(_budget(chain, COSTS, 16)) == 16
    weak = [_node(0.04)]  # 1.04 tokens for 1.06x the cost: a plain step is worth more
    assert _budget(weak, COSTS, 16) == []
    medium = [_node(0.5 ** d, d - 2, d) for d in range(1, 17)]  # 1 + 0.5 + 0.25 + ... : 2 or 4 nodes, not 16
    assert len(_budget(medium, COSTS, 16)) in (2, 4)


def test_budget_respects_the_node_limit_and_keeps_parents_first():
    chain = [_node(0.95 ** d, d - 2, d) for d in range(1, 17)]
    chosen = _budget(chain, COSTS, 5)
    assert chosen == [0, 1, 2, 3]  # 5 nodes would need 6 slots: the 5-slot profile holds 4


def test_acceptance_model_learns_from_its_counts():
    model = AcceptanceModel()
    kind = (NGRAM, 2, 1, 0)
    prior = model.rate(kind)
    for _ in range(40):
        model.record(kind, False)
    assert model.rate(kind) < prior / 5
    for _ in range(400):
        model.record((RECYCLED, 0, 1), True)
    assert model.rate((RECYCLED, 0, 1)) > 0.95


@pytest.mark.parametrize("kwargs,message", [
    ({"min_ngram": 3, "max_ngram": 2}, "ngram range is empty: min_ngram 3 > max_ngram 2"),
    ({"max_ngram": 0}, "max_ngram must be a positive int, got 0"),
    ({"recycle_top_k": -1}, "recycle_top_k must be a non-negative int, got -1"),
    ({"max_draft_len": "4"}, "max_draft_len must be a non-negative int, got '4'"),
])
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        NgramConfig(**kwargs)


# ---- drafts --------------------------------------------------------------------------------------------

def test_a_repeated_passage_is_drafted_as_a_long_chain():
    proposer = NgramProposer(COSTS)
    passage = list(range(10, 30))
    proposer.start(None, 0, None, np.array(passage + [1, 2] + passage[:4]), passage[4])
    draft = proposer.propose(passage[4])
    assert draft.tree.num_nodes >= 8 and draft.tree.depth == draft.tree.num_nodes  # a chain
    assert draft.tokens[1:].tolist() == passage[5:5 + draft.tree.num_nodes]


def test_disagreeing_occurrences_become_branches_most_recent_first():
    proposer = NgramProposer(COSTS, NgramConfig(recycle_top_k=0))
    prompt = [7, 8, 9, 1, 2, 3, 9, 1, 2, 4, 5, 9, 1]
    proposer.start(None, 0, None, np.array(prompt[:-1]), prompt[-1])
    draft = proposer.propose(prompt[-1])
    children = draft.tree.children[0]
    assert [int(draft.tokens[c]) for c in children] == [2]  # both earlier "9 1" continue with 2
    (two,) = children
    assert [int(draft.tokens[c]) for c in draft.tree.children[two]] == [4, 3]  # the most recent first


def test_chains_draft_the_most_probable_path_only():
    """An engine that verifies chains only exactly (quantized) gets the candidates' most probable walk, a chain."""
    prompt = [7, 8, 9, 1, 2, 3, 9, 1, 2, 4, 5, 9, 1]
    proposer = NgramProposer(COSTS, NgramConfig(recycle_top_k=0), chains=True)
    proposer.model.counts[(NGRAM, 2, 2, 1)] = [99.0, 100.0]  # second-ranked continuations accepted 99 times in 100
    proposer.start(None, 0, None, np.array(prompt[:-1]), prompt[-1])
    draft = proposer.propose(prompt[-1])
    assert list(draft.tree.parents) == list(range(-1, draft.tree.num_nodes))  # a chain
    assert draft.tokens[1:3].tolist() == [2, 3]  # below 2 the branch to 3 now beats the most recent 4
    assert np.all(np.diff(draft.node_p) <= 0)


def test_token_recycling_drafts_when_nothing_matches():
    proposer = NgramProposer(COSTS, NgramConfig(recycle_top_k=2))
    logits = np.zeros((3, 50), np.float32)
    logits[2, 41], logits[2, 42] = 5.0, 4.0  # after token 33 the target liked 41, then 42
    proposer.start(None, 0, StepOutput(logits), np.array([31, 32, 33]), 34)
    assert proposer.recycled[33].tolist() == [41, 42]  # the prefill's rows seeded the table
    assert proposer.propose(34).tree.num_nodes == 0  # "34" never occurred, and nothing is known to follow it
    proposer.observe(StepOutput(logits[[2]]), Accepted((), (33,), 0))  # the step after root 34 gave 33
    assert proposer.recycled[34].tolist() == [41, 42]
    proposer.model.counts[(RECYCLED, 0, 1)] = [90.0, 100.0]  # a well-tested recycled top-1
    draft = proposer.propose(33)  # "33" occurred once, followed by 34; recycling adds 41 beside it
    assert sorted(int(draft.tokens[c]) for c in draft.tree.children[0])[:2] == [34, 41]


def test_observe_counts_only_tried_nodes():
    proposer = NgramProposer(COSTS, NgramConfig(recycle_top_k=0))
    passage = list(range(10, 30))
    proposer.start(None, 0, None, np.array(passage + passage[:3]), passage[3])
    draft = proposer.propose(passage[3])
    n = draft.tree.num_nodes
    verify = StepOutput(np.zeros((n + 1, 40), np.float32))
    proposer.observe(verify, Accepted((1, 2), (int(draft.tokens[1]), int(draft.tokens[2]), 0), 2))
    trials = sum(c[1] for c in proposer.model.counts.values())
    hits = sum(c[0] for c in proposer.model.counts.values())
    assert (hits, trials) == (2, 3)  # depths 1 and 2 accepted, depth 3 tried and rejected, deeper untried


# ---- lossless ----------------------------------------------------------------------------------------------

def _prompts(vocab, n, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(2, 30))) for _ in range(n)]


def test_greedy_output_is_plain_greedy_output_batch_1_and_8():
    engine = MarkovEngine(_deterministic_table(12))
    prompts = _prompts(12, 16)
    config = GenerationConfig(max_tokens=40)
    plain = [generate(engine, p, NoDraft(), config).output_ids for p in prompts]
    model = AcceptanceModel()
    alone = [generate(engine, p, NgramProposer(COSTS, model=model), config) for p in prompts]
    assert [r.output_ids for r in alone] == plain
    batched = generate_batch(engine, [Request(p, NgramProposer(COSTS, model=model), config) for p in prompts],
                             max_batch_size=8)
    assert [r.output_ids for r in batched] == plain
    accepted = sum(r.stats.accepted_tokens for r in alone)
    assert accepted > 200  # the chain cycles: most tokens come from drafts
    profiles = set().union(*(r.stats.profile_steps for r in alone))
    assert len(profiles) >= 3  # drafts of different lengths ran in different profiles


def assert_keeps_the_target_distribution(new_proposer, runs: int = 6000, engine_class=None) -> None:
    """Three tokens sampled at T = 1 after a repetitive prompt: their joint frequencies over `runs` seeded runs
    follow the chain's own probabilities (chi-square p > 1e-4), while drafts are accepted often. `engine_class`: a
    MarkovEngine subclass the proposer needs (default MarkovEngine)."""
    vocab = 4
    table = np.random.default_rng(11).dirichlet(np.full(vocab, 0.7), size=vocab)
    engine = (engine_class or MarkovEngine)(table)
    prompt = np.array([0, 1, 2, 3] * 4 + [0, 1])
    outcomes, accepted = [], 0
    for seed in range(runs):
        config = GenerationConfig(max_tokens=3, sampling=SamplingParams(temperature=1.0, seed=seed))
        result = generate(engine, prompt, new_proposer(), config)
        outcomes.append(int(np.ravel_multi_index(result.output_ids, (vocab,) * 3)))
        accepted += result.stats.accepted_tokens
    expected = np.array([table[1, a] * table[a, b] * table[b, c]
                         for a, b, c in itertools.product(range(vocab), repeat=3)])
    counts = np.bincount(outcomes, minlength=vocab ** 3)
    assert chisquare(counts, expected * counts.sum()).pvalue > 1e-4
    assert accepted > runs / 6


def test_sampled_output_keeps_the_target_distribution():
    model = AcceptanceModel()
    assert_keeps_the_target_distribution(lambda: NgramProposer(COSTS, model=model))


def test_a_batch_shrinks_drafts_to_what_pays_for_every_row():
    """Seven rows with nothing to draft and one with a confident 16-token chain: where a batch's slots are dear the
    chain is cut to the profile that pays for the whole batch; where they are cheap it stays whole."""
    from trtspec.speculative.loop import _Decoding, _fit_batch

    passage = list(range(10, 40))

    table = _deterministic_table(50)
    table[10:39] = 1e-4
    table[np.arange(10, 39), np.arange(11, 40)] = 1.0  # the passage continues itself: the root after it is its next
    table /= table.sum(axis=1, keepdims=True)

    def batch(costs):
        engine = MarkovEngine(table)
        engine.step_costs = lambda: costs
        decodings = []
        for row in range(8):
            proposer = NgramProposer(costs, NgramConfig(recycle_top_k=0))
            prompt = passage + [1, 2] + passage[:5] if row == 0 else [45 + row % 4]
            decodings.append(_Decoding(engine, Request(np.array(prompt), proposer, GenerationConfig(max_tokens=4))))
            for match in (4, 6, 10):
                for depth in (1, 2, 3, 4):
                    proposer.model.counts[(NGRAM, match, depth, 0)] = [97.0, 100.0]
        drafts = [d.propose() for d in decodings]
        return drafts, _fit_batch(engine, decodings, drafts)

    steep = StepCosts(COSTS.profiles, COSTS.relative, batch=8, batch_relative=(1.5, 1.6, 1.7, 1.8, 3.5, 7.0))
    before, after = batch(steep)
    assert before[0].tree.num_nodes >= 8 and sum(d.tree.num_nodes for d in before[1:]) == 0
    assert after[0].tree.num_nodes == 4 < before[0].tree.num_nodes  # the 5-slot profile pays for all eight
    assert after[0].tokens.tolist() == before[0].tokens[:after[0].tree.num_nodes + 1].tolist()  # its first nodes
    flat = StepCosts(COSTS.profiles, COSTS.relative, batch=8, batch_relative=(1.1, 1.12, 1.14, 1.16, 1.3, 1.6))
    before, after = batch(flat)
    assert after[0].tree.num_nodes == before[0].tree.num_nodes
