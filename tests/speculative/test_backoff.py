"""Back-off: a drafter whose drafts keep failing shrinks and then rests (plain steps), looks again at growing
intervals, and drafts again once its drafts are right; output stays plain greedy output (batch 1 and 8) and the
target distribution is kept at T > 0. Time is a fake clock here, so nothing depends on the machine's speed."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.backoff import EXPLORE_EVERY, EXPLORE_MAX, LOOK_SHARE, Backoff, subtree
from trtspec.speculative.lookahead_proposer import LookaheadConfig, LookaheadProposer
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.proposer import Draft, NoDraft
from trtspec.speculative.step_costs import StepCosts
from trtspec.speculative.tree import build_tree, chain_tree
from tests.speculative.test_ngram import (COSTS, MarkovEngine, _deterministic_table, _prompts,
                                          assert_keeps_the_target_distribution)


class FakeClock:
    """Each reading is a millisecond after the last: every drafter call looks equally cheap."""

    def __init__(self):
        self.now = itertools.count()

    def __call__(self) -> float:
        return next(self.now) / 1000


class ChainDrafter:
    """Drafts `depth` tokens along the table's greedy chain, or off it while `wrong()` says so."""

    def __init__(self, table: np.ndarray, depth: int, wrong=lambda: False):
        self.best, self.depth, self.wrong = table.argmax(axis=1), depth, wrong
        self.caught_up = self.observed = 0

    def start(self, engine, seq, prefill, prompt_ids, root):
        pass

    def propose(self, root: int) -> Draft:
        tokens, token = [root], root
        for _ in range(self.depth):
            token = int(self.best[token])
            tokens.append((token + 1) % len(self.best) if self.wrong() else token)
        return Draft(chain_tree(self.depth), np.array(tokens, np.int64))

    def observe(self, verify, accepted):
        self.observed += 1

    @staticmethod
    def defer(verify, accepted):
        return list(accepted.tokens)

    def catch_up(self, entries):
        self.caught_up += 1


def _run(engine, drafter, max_tokens=200, prompt=(1, 2, 3)):
    proposer = Backoff(drafter, COSTS, clock=FakeClock())
    result = generate(engine, np.array(prompt), proposer, GenerationConfig(max_tokens=max_tokens))
    return proposer, result


def test_a_drafter_that_keeps_failing_rests():
    table = _deterministic_table(12)
    engine = MarkovEngine(table)
    plain = generate(engine, np.array([1, 2, 3]), NoDraft(), GenerationConfig(max_tokens=200)).output_ids
    drafter = ChainDrafter(table, 4, wrong=lambda: True)
    proposer, result = _run(engine, drafter)
    assert result.output_ids == plain
    assert result.stats.accepted_tokens == 0
    assert proposer.drafting_steps < proposer.steps / 8  # after a few failures it only looks now and then
    assert result.stats.profile_steps[1] > 0.85 * result.stats.steps  # most steps are plain ones
    assert drafter.observed == proposer.drafting_steps  # a resting drafter only records (defer) ...
    assert drafter.caught_up >= 3  # ... and catches up before each look


def test_a_drafter_that_is_right_keeps_drafting_its_whole_tree():
    table = _deterministic_table(12)
    drafter = ChainDrafter(table, 4)
    proposer, result = _run(MarkovEngine(table), drafter)
    assert proposer.drafting_steps == proposer.steps
    assert result.stats.acceptance_length > 4.5  # 4 drafted, all accepted, plus the bonus token
    assert drafter.caught_up == 0


def test_a_drafter_that_turns_right_drafts_again_within_the_longest_rest():
    table = _deterministic_table(12)
    turn = 120  # steps of failing drafts before the drafter turns right
    proposer = None

    def wrong():
        return proposer.steps <= turn

    drafter = ChainDrafter(table, 4, wrong=wrong)
    proposer = Backoff(drafter, COSTS, clock=FakeClock())
    result = generate(MarkovEngine(table), np.array([1, 2, 3]), proposer, GenerationConfig(max_tokens=600))
    assert proposer.steps > turn + EXPLORE_MAX + 20
    # by the end it drafts every step: the tokens after the turn came mostly from drafts
    after = len(result.output_ids) - (turn + 1)
    steps_after = proposer.steps - turn
    assert after / steps_after > 3.0


class SometimesSureDrafter(ChainDrafter):
    """Right, and sure of it (confidence 0.9), on every `every`-th draft; wrong and unsure (0.02) on the others; or
    saying nothing of its confidence when `says` is False."""

    def __init__(self, table, depth, every, says=True):
        super().__init__(table, depth)
        self.every, self.says, self.drafts = every, says, 0

    def propose(self, root: int) -> Draft:
        self.drafts += 1
        sure = self.drafts % self.every == 0
        self.wrong = lambda: not sure
        draft = super().propose(root)
        return Draft(draft.tree, draft.tokens, confidence=np.full(self.depth, 0.9 if sure else 0.02) if self.says else None)


def test_a_drafter_that_says_its_confidence_drafts_where_it_is_sure():
    """The confidence bands learn that sure nodes are accepted and unsure ones are not: it keeps drafting (its sure
    steps pay for the rest), drafts little where it is unsure, and its output costs fewer plain steps' worth of
    verify steps than the same drafter's without its confidence, whose one rate per (depth, rank) averages the two."""
    table = _deterministic_table(12)
    engine = MarkovEngine(table)
    plain = generate(engine, np.array([1, 2, 3]), NoDraft(), GenerationConfig(max_tokens=300)).output_ids

    results = {}
    for says in (True, False):
        drafter = SometimesSureDrafter(table, 4, 3, says)
        proposer = Backoff(drafter, STEEP, clock=FakeClock())
        result = generate(engine, np.array([1, 2, 3]), proposer, GenerationConfig(max_tokens=300))
        assert result.output_ids == plain
        results[says] = proposer, result

    def cost(result):
        return sum(STEEP.cost(slots) * n for slots, n in result.stats.profile_steps.items())

    proposer, result = results[True]
    assert proposer.drafting_steps > 0.75 * proposer.steps  # it rests little (its sure drafts pay for the others)
    assert result.stats.accepted_tokens > 0.8 * result.stats.draft_tokens  # drafted where sure, little elsewhere
    assert results[False][1].stats.accepted_tokens < 0.5 * results[False][1].stats.draft_tokens
    assert cost(result) < 0.9 * cost(results[False][1])


def test_a_shrunk_tree_keeps_its_most_probable_nodes():
    """Medusa-like: a wide tree whose second-rank nodes never hit is cut to its first-rank chain."""
    table = _deterministic_table(12)

    class Wide(ChainDrafter):
        tree = build_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])

        def propose(self, root):
            tokens = np.zeros(self.tree.num_nodes + 1, np.int64)
            tokens[0] = root
            for node in range(1, self.tree.num_nodes + 1):
                parent = int(self.tree.parents[node])
                right = int(self.best[tokens[parent]])
                tokens[node] = (right + int(self.tree.ranks[node])) % len(self.best)
            return Draft(self.tree, tokens)

    proposer, result = _run(MarkovEngine(table), Wide(table, 0))
    assert proposer.drafting_steps == proposer.steps
    last = proposer._draft.tree  # the first-rank chain, and a sibling where the chain's profile has a slot free
    assert {(0,), (0, 0), (0, 0, 0)} <= set(last.choices) and last.num_nodes == 4
    assert result.stats.acceptance_length > 3.0


def test_subtree_reranks_the_kept_siblings():
    tree = build_tree([[0], [1], [2], [1, 0], [2, 0]])
    kept = [i for i in range(1, tree.num_nodes + 1) if tree.choices[i - 1] in ((2,), (2, 0), (0,))]
    new, old = subtree(tree, kept)
    assert new.choices == ((0,), (1,), (1, 0))
    assert [tree.choices[i - 1] for i in old] == [(0,), (2,), (2, 0)]


@pytest.mark.parametrize("wng", [(4, 3, 4), (2, 3, 2)])
def test_lookahead_backed_off_is_plain_greedy_output_batch_1_and_8(wng):
    engine = MarkovEngine(_deterministic_table(12))
    prompts = _prompts(12, 16)
    config = GenerationConfig(max_tokens=60)
    plain = [generate(engine, p, NoDraft(), config).output_ids for p in prompts]
    la = LookaheadConfig(*wng)
    alone = [generate(engine, p, Backoff(LookaheadProposer(la), COSTS, clock=FakeClock()), config) for p in prompts]
    assert [r.output_ids for r in alone] == plain
    batched = generate_batch(engine, [Request(p, Backoff(LookaheadProposer(la), COSTS, clock=FakeClock()), config)
                                      for p in prompts], max_batch_size=8)
    assert [r.output_ids for r in batched] == plain
    assert sum(r.stats.accepted_tokens for r in alone) > 200  # the chain cycles: it keeps drafting


def test_lookahead_on_text_with_nothing_to_find_rests_and_learns_the_text_meanwhile():
    vocab = 400
    table = np.random.default_rng(5).dirichlet(np.full(vocab, 0.05), size=vocab)  # long cycles: little to find
    engine = MarkovEngine(table)
    drafter = LookaheadProposer(LookaheadConfig(4, 3, 4))
    proposer = Backoff(drafter, COSTS, clock=FakeClock())
    result = generate(engine, np.arange(5), proposer, GenerationConfig(max_tokens=150))
    assert result.output_ids == generate(engine, np.arange(5), NoDraft(), GenerationConfig(max_tokens=150)).output_ids
    assert proposer.drafting_steps < proposer.steps / 2
    assert len(drafter.tokens) >= 5 + len(result.output_ids) - proposer._rest_steps - 1  # caught up at each look
    text = drafter.tokens
    assert tuple(text[-5:-3]) in drafter.pool.get(text[-6], ()) or proposer._resting


def test_sampled_output_keeps_the_target_distribution():
    table = np.random.default_rng(11).dirichlet(np.full(4, 0.7), size=4)
    assert_keeps_the_target_distribution(lambda: Backoff(LookaheadProposer(LookaheadConfig(2, 3, 2)), COSTS))
    assert_keeps_the_target_distribution(lambda: Backoff(ChainDrafter(table, 2), COSTS))


def test_make_proposer_backs_off_trained_drafters_and_lookahead_unless_told():
    engine = MarkovEngine(_deterministic_table(12))
    assert isinstance(make_proposer("lookahead", engine), Backoff)
    assert isinstance(make_proposer("lookahead", engine, backoff=False), LookaheadProposer)
    assert not isinstance(make_proposer("ngram", engine), Backoff)  # budgets itself


STEEP = StepCosts((1, 2, 3, 5, 9, 17), (1.0, 1.11, 1.23, 1.42, 1.93, 2.80))


def test_a_whole_draft_that_cannot_pay_even_at_the_prior_starts_resting_and_looks_seldom():
    """Lookahead 4,3,4 on a steep curve: 16 slots cost 2.8 plain steps, more than the prior gain could repay: the
    first look comes only after as many plain steps as keep looks under LOOK_SHARE of the steps, and so does the
    next; once the text cycles (copyable) the looks pay and it drafts every step."""
    engine = MarkovEngine(np.random.default_rng(5).dirichlet(np.full(400, 0.05), size=400))
    proposer = Backoff(LookaheadProposer(LookaheadConfig(4, 3, 4)), STEEP, clock=FakeClock())
    looks, observe = [], proposer.observe

    def recording(verify, accepted):
        if proposer._drafted:
            looks.append((proposer.steps, proposer._full.tree.num_nodes))
        observe(verify, accepted)

    proposer.observe = recording
    result = generate(engine, np.arange(5), proposer, GenerationConfig(max_tokens=400))
    assert result.output_ids == generate(engine, np.arange(5), NoDraft(), GenerationConfig(max_tokens=400)).output_ids
    whole = STEEP.cost(proposer.drafter.max_nodes + 1)  # its whole draft's cost
    assert looks[0][0] == math.ceil((whole - 1.0) / LOOK_SHARE) > EXPLORE_EVERY  # plain steps before the first look
    for (step, size), (next_step, _) in zip(looks, looks[1:]):  # it drafts on, or its look's cost spaces the next
        assert next_step == step + 1 or next_step - step >= (STEEP.cost(size + 1) - 1.0) / LOOK_SHARE
    last_rest = max((i for i, ((a, _), (b, _)) in enumerate(zip(looks, looks[1:])) if b > a + 1), default=-1)
    assert len(looks) - last_rest > 20  # and from some look on, it drafts every step
    assert result.stats.accepted_tokens > 20


def test_a_look_tries_the_most_probable_node_even_when_the_budget_would_draft_nothing():
    table = _deterministic_table(12)
    drafter = ChainDrafter(table, 4, wrong=lambda: True)
    proposer = Backoff(drafter, STEEP, clock=FakeClock())
    result = generate(MarkovEngine(table), np.array([1, 2, 3]), proposer, GenerationConfig(max_tokens=300))
    drafted = [n for n in (result.stats.profile_steps.get(s, 0) for s in (2, 3, 5)) if n]
    assert proposer.drafting_steps > 2 and sum(drafted) >= proposer.drafting_steps - 1  # looks of one node or so
    assert result.stats.draft_tokens >= proposer.drafting_steps
