"""Acceptance rules on hand-made logits (perfect match, early mismatch, empty draft, padding, ties) and
statistical proofs that the rejection-sampling rules are lossless, with negative controls showing the
statistical check has the power to catch a broken rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from trtspec.speculative.acceptance import (Accepted, accept_greedy, accept_rejection_chain, accept_rejection_tree,
                                     accept_typical)
from trtspec.speculative.sampling import make_rng, sample

V = 8

# A small tree, slots in node order:      0 (root)
#                                        /        \
#                                       1          2
#                                       |          |
#                                       3          4
#                                                  |
#                                                  5
TREE_PATHS = np.array([[0, 1, 3, -1],
                       [0, 2, 4, 5]])  # DFS left to right, -1 padded
TREE_CHILDREN = ((1, 2), (3,), (4,), (), (5,), ())


def logits_predicting(*tokens: int) -> np.ndarray:
    """Target logits [len(tokens), V] whose argmax after slot i is tokens[i]."""
    logits = np.zeros((len(tokens), V))
    logits[np.arange(len(tokens)), tokens] = 10.0
    return logits


def drafts(*tokens: int) -> np.ndarray:
    """Draft tokens [n+1] for slots 1..n; slot 0 (the root) holds a placeholder."""
    return np.array([-1, *tokens])


# ---- greedy ----------------------------------------------------------------------------------------------

# (name, draft tokens of slots 1..5, target argmax after slots 0..5, expected Accepted)
GREEDY_CASES = [
    ("perfect match along the first path", drafts(5, 6, 2, 7, 3), logits_predicting(5, 2, 0, 4, 0, 0),
     Accepted((1, 3), (5, 2, 4), 3)),
    ("early mismatch at the root", drafts(5, 6, 2, 7, 3), logits_predicting(1, 2, 7, 4, 0, 0),
     Accepted((), (1,), 0)),
    ("mismatch below an accepted node", drafts(5, 6, 2, 7, 3), logits_predicting(5, 3, 7, 4, 0, 0),
     Accepted((1,), (5, 3), 1)),
    ("a later DFS path is longer", drafts(5, 6, 2, 7, 3), logits_predicting(6, 2, 7, 4, 3, 1),
     Accepted((2, 4, 5), (6, 7, 3, 1), 5)),
]


@pytest.mark.parametrize(("name", "draft_tokens", "target_logits", "expected"), GREEDY_CASES,
                         ids=[case[0] for case in GREEDY_CASES])
def test_accept_greedy_on_a_tree(name, draft_tokens, target_logits, expected):
    assert accept_greedy(draft_tokens, target_logits, TREE_PATHS) == expected


def test_greedy_later_dfs_path_longer_than_a_matching_first_path():
    # Siblings 1 and 2 carry the same token: path [0, 1, 3] matches one deep, [0, 2, 4, 5] three deep.
    result = accept_greedy(drafts(6, 6, 2, 7, 3), logits_predicting(6, 0, 7, 4, 3, 1), TREE_PATHS)
    assert result == Accepted((2, 4, 5), (6, 7, 3, 1), 5)


def test_greedy_perfect_chain_emits_all_drafts_and_the_bonus():
    paths = np.array([[0, 1, 2, 3]])
    result = accept_greedy(drafts(4, 5, 6), logits_predicting(4, 5, 6, 7), paths)
    assert result == Accepted((1, 2, 3), (4, 5, 6, 7), 3)
    assert result.num_accepted == 3


@pytest.mark.parametrize("paths", [np.array([[0]]), np.zeros((0, 1), dtype=int)])
def test_greedy_empty_draft_emits_only_the_bonus(paths):
    assert accept_greedy(drafts(), logits_predicting(3), paths) == Accepted((), (3,), 0)


def test_greedy_bonus_is_the_argmax_at_the_last_accepted_slot():
    # Accepted up to slot 2; the bonus comes from the target after slot 2 (token 6), not after the root or
    # slot 1, and not from the draft at slot 3.
    result = accept_greedy(drafts(1, 2, 0), logits_predicting(1, 2, 6, 5), np.array([[0, 1, 2, 3]]))
    assert result == Accepted((1, 2), (1, 2, 6), 2)


def test_greedy_tie_between_paths_goes_to_the_first_dfs_path():
    # Siblings 1 and 2 carry the same token and both paths match two deep: the first path wins.
    result = accept_greedy(drafts(5, 5, 6, 6, 0), logits_predicting(5, 6, 6, 1, 2, 0), TREE_PATHS)
    assert result == Accepted((1, 3), (5, 6, 1), 3)


@pytest.mark.parametrize("token", [0, V - 1])
def test_greedy_padding_never_matches_even_at_argmax_0_or_last(token):
    # Tree 0 → 1 → 2 → 3 and 0 → 4; the second path is padded with -1. Slot 4 carries `token`, which the
    # target predicts after the root AND after slot 4, so index -1 (wrapping to slot 4) would "match" twice.
    paths = np.array([[0, 1, 2, 3], [0, 4, -1, -1]])
    other = (token + 1) % V
    result = accept_greedy(drafts(other, other, other, token), logits_predicting(token, 3, 3, 3, token), paths)
    assert result == Accepted((4,), (token, token), 4)


def test_greedy_rejects_malformed_paths():
    with pytest.raises(ValueError, match="paths"):
        accept_greedy(drafts(1), logits_predicting(1, 2), np.array([[0, 2]]))  # slot 2 does not exist
    with pytest.raises(ValueError, match="paths"):
        accept_greedy(drafts(1), logits_predicting(1, 2), np.array([[1, 0]]))


# ---- typical (Medusa, lossy) -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "draft_tokens", "target_logits", "expected"), GREEDY_CASES,
                         ids=[case[0] for case in GREEDY_CASES])
@pytest.mark.parametrize("temperature", [0.0, 0.05])
def test_typical_with_a_peaked_target_is_greedy(name, draft_tokens, target_logits, expected, temperature):
    assert accept_typical(draft_tokens, target_logits, TREE_PATHS, temperature=temperature,
                          rng=make_rng(0)) == expected


def typical_threshold(probs: np.ndarray, epsilon: float = 0.09, delta: float = 0.3) -> float:
    entropy = -(probs * np.log(probs + 1e-5)).sum()
    return min(epsilon, delta * np.exp(-entropy))


ROOT_PROBS = np.array([0.5, 0.3, 0.15, 0.05, 0.0, 0.0, 0.0, 0.0]) + 1e-12  # threshold: epsilon = 0.09


@pytest.mark.parametrize(("token", "accepted"), [(0, True), (1, True), (2, True), (3, False), (7, False)])
def test_typical_accepts_exactly_the_tokens_above_the_posterior_threshold(token, accepted):
    assert typical_threshold(ROOT_PROBS) == pytest.approx(0.09)
    logits = np.log(np.stack([ROOT_PROBS, ROOT_PROBS]))  # [2, V]
    result = accept_typical(drafts(token), logits, np.array([[0, 1]]), temperature=1.0, rng=make_rng(0))
    assert result.slots == ((1,) if accepted else ())
    assert result.tokens[-1] == 0  # the bonus is the argmax even at temperature 1 (Medusa fast=True)


def test_typical_high_entropy_lowers_the_threshold_below_epsilon():
    # Uniform over 64 tokens: p = 1/64 < epsilon, but delta * exp(-H) = 0.3 / 64 is lower, so it is accepted.
    logits = np.zeros((2, 64))
    assert typical_threshold(np.full(64, 1 / 64)) < 1 / 64 < 0.09
    result = accept_typical(np.array([-1, 17]), logits, np.array([[0, 1]]), temperature=1.0, rng=make_rng(0))
    assert result.slots == (1,)


def test_typical_prefers_the_most_likely_of_the_longest_paths():
    # Both root children are typical (0.3 and 0.5 > 0.09): the later path wins on log-likelihood.
    root = np.log(np.array([0.1, 0.3, 0.5, 0.1, 0, 0, 0, 0]) + 1e-12)
    logits = np.stack([root, logits_predicting(4)[0], logits_predicting(5)[0]])  # [3, V]
    result = accept_typical(drafts(1, 2), logits, np.array([[0, 1], [0, 2]]), temperature=1.0, rng=make_rng(0))
    assert result == Accepted((2,), (2, 5), 2)


# ---- rejection sampling: edge cases ----------------------------------------------------------------------

def one_hot(*tokens: int) -> np.ndarray:
    return np.eye(V)[list(tokens)]


def test_rejection_tree_with_one_hot_targets_is_greedy():
    for name, draft_tokens, target_logits, expected in GREEDY_CASES:
        target_probs = one_hot(*np.argmax(target_logits, axis=-1))
        assert accept_rejection_tree(draft_tokens, target_probs, TREE_CHILDREN, make_rng(0)) == expected, name


def test_rejection_tree_never_accepts_a_token_the_target_rules_out():
    probs = np.full((6, V), 1 / V)
    probs[0] = [0.0, 0.0, 0.5, 0.5, 0, 0, 0, 0]  # the root children carry tokens 0 and 1
    rng = make_rng(0)
    for _ in range(500):
        result = accept_rejection_tree(drafts(0, 1, 2, 3, 4), probs, TREE_CHILDREN, rng)
        assert result.slots == () and result.tokens[0] in (2, 3)


def test_rejection_tree_always_accepts_a_certain_token():
    probs = np.full((6, V), 1 / V)
    probs[0], probs[2], probs[4] = one_hot(6, 7, 3)  # path 0 → 2 → 4 → 5 certain down to slot 5
    rng = make_rng(0)
    for _ in range(200):
        result = accept_rejection_tree(drafts(5, 6, 2, 7, 3), probs, TREE_CHILDREN, rng)
        assert result.slots == (2, 4, 5) and result.last_slot == 5


def test_rejection_tree_bonus_never_repeats_a_rejected_sibling():
    probs = np.full((6, V), 1 / V)
    probs[0] = [0.4, 0.4, 0.2, 0, 0, 0, 0, 0]  # children tokens 0 and 1; 2 only as the bonus
    rng = make_rng(0)
    firsts = [accept_rejection_tree(drafts(0, 1, 2, 3, 4), probs, TREE_CHILDREN, rng) for _ in range(2000)]
    assert {r.tokens[0] for r in firsts if not r.slots} == {2}


def test_rejection_tree_empty_draft_samples_the_root_distribution():
    result = accept_rejection_tree(drafts(), one_hot(3), ((),), make_rng(0))
    assert result == Accepted((), (3,), 0)


def test_rejection_tree_requires_distinct_sibling_tokens():
    with pytest.raises(ValueError, match="slot 0"):
        accept_rejection_tree(drafts(4, 4, 1, 2, 3), np.full((6, V), 1 / V), TREE_CHILDREN, make_rng(0))


def test_rejection_chain_edge_cases():
    q = np.full((2, V), 1 / V)  # [k, V]
    rng = make_rng(0)
    for _ in range(200):
        # p(draft 1) = 1: always accepted; p(draft 2) = 0: never accepted, and the correction avoids it.
        result = accept_rejection_chain(np.array([3, 5]), q, np.stack([one_hot(3)[0], one_hot(4)[0],
                                                                       np.full(V, 1 / V)]), rng)
        assert result == Accepted((1,), (3, 4), 1)
    # q == p: every draft is accepted, and the bonus comes from the target after the last slot.
    p = np.full((3, V), 1 / V)
    p[2] = one_hot(7)[0]
    assert accept_rejection_chain(np.array([1, 2]), p[:2], p, rng) == Accepted((1, 2), (1, 2, 7), 2)
    assert accept_rejection_chain(np.zeros(0, dtype=int), np.zeros((0, V)), one_hot(6), rng) == \
        Accepted((), (6,), 0)
    with pytest.raises(ValueError, match="draft_probs"):
        accept_rejection_chain(np.array([1, 2]), q[:1], p, rng)


class RoundsUpToOne:
    """A generator stub whose uniforms round up to 1.0, the float edge a real generator never returns."""

    def random(self) -> float:
        return 1.0


def test_an_all_zero_residual_falls_back_to_the_target():
    # The certain draft is "rejected", which leaves no residual mass: the bonus comes from the original target.
    certain = one_hot(2, 5)  # [2, V]
    assert accept_rejection_tree(drafts(2), certain, ((1,), ()), RoundsUpToOne()) == Accepted((), (2,), 0)
    assert accept_rejection_chain(np.array([2]), certain[:1], certain, RoundsUpToOne()) == Accepted((), (2,), 0)


def test_rejection_rules_are_deterministic_under_a_seed():
    probs = np.random.default_rng(5).dirichlet(np.ones(V), size=6)  # [n+1, V]
    run = [[accept_rejection_tree(drafts(0, 1, 2, 3, 4), probs, TREE_CHILDREN, rng) for _ in range(50)]
           for rng in (make_rng(11), make_rng(11))]
    assert run[0] == run[1]


# ---- rejection sampling: statistical losslessness ---------------------------------------------------------
#
# Over N seeded steps, the first emitted token must follow target[0], and the second (given the first was
# the draft at slot c) must follow target[c]. Each check is a chi-square goodness-of-fit test (p > 1e-4)
# plus total variation < 0.02. The negative controls run the same check on deliberately broken rules and
# must fail it with p < 1e-12, which shows the test has the power to see a biased rule.

SV = 6  # vocabulary of the statistical tests
N = 60_000
# Root children 1, 2, 3; slot 1 has children 4 and 5, slot 2 has child 6.
STAT_CHILDREN = ((1, 2, 3), (4, 5), (6,), (), (), (), ())
STAT_DRAFTS = np.array([-1, 0, 1, 2, 3, 0, 4])  # slot 0 unused; siblings distinct
_gen = np.random.default_rng(20240607)
STAT_TARGET = _gen.dirichlet(np.full(SV, 3.0), size=7)  # [n+1, SV], fixed random target per slot
# The root leans toward the root children's tokens 0, 1, 2, so each conditional test sees > 12 000 draws.
STAT_TARGET[0] = [0.27, 0.31, 0.24, 0.07, 0.05, 0.06]
CHAIN_TARGET = _gen.dirichlet(np.full(SV, 3.0), size=3)  # [k+1, SV], k = 2
CHAIN_DRAFT = _gen.dirichlet(np.full(SV, 1.0), size=2)   # [k, SV], q_i, deliberately far from the target


def fit(tokens: list[int], expected_probs: np.ndarray) -> tuple[float, float]:
    """Return (chi-square p-value, total variation) of the observed tokens against expected_probs."""
    counts = np.bincount(tokens, minlength=len(expected_probs))
    pvalue = chisquare(counts, expected_probs * counts.sum()).pvalue
    return float(pvalue), float(np.abs(counts / counts.sum() - expected_probs).sum() / 2)


def tree_runs(rule) -> list[tuple[int, ...]]:
    rng = make_rng(1)
    return [rule(STAT_DRAFTS, STAT_TARGET, STAT_CHILDREN, rng).tokens for _ in range(N)]


def chain_runs(rule, n: int = N) -> list[tuple[int, ...]]:
    rng = make_rng(2)
    draft_tokens = np.stack([rng.choice(SV, size=n, p=q) for q in CHAIN_DRAFT], axis=1)  # [n, k], drafts ~ q_i
    return [rule(row, CHAIN_DRAFT, CHAIN_TARGET, rng).tokens for row in draft_tokens]


def assert_lossless(pvalue: float, tv: float) -> None:
    assert pvalue > 1e-4 and tv < 0.02, (pvalue, tv)


@pytest.fixture(scope="module")
def tree_tokens() -> list[tuple[int, ...]]:
    return tree_runs(accept_rejection_tree)


def test_rejection_tree_first_token_follows_the_target(tree_tokens):
    assert_lossless(*fit([t[0] for t in tree_tokens], STAT_TARGET[0]))


@pytest.mark.parametrize("child", STAT_CHILDREN[0])
def test_rejection_tree_second_token_follows_the_target_at_the_accepted_child(tree_tokens, child):
    seconds = [t[1] for t in tree_tokens if t[0] == STAT_DRAFTS[child]]
    # The first token equals a root child's draft only when that child was accepted (the residual excludes it).
    assert all(len(t) >= 2 for t in tree_tokens if t[0] == STAT_DRAFTS[child])
    assert len(seconds) > 12_000
    assert_lossless(*fit(seconds, STAT_TARGET[child]))


def test_rejection_chain_first_token_follows_the_target():
    tokens = chain_runs(accept_rejection_chain)
    assert_lossless(*fit([t[0] for t in tokens], CHAIN_TARGET[0]))
    seconds = [t[1] for t in tokens if len(t) >= 2]
    assert len(seconds) > 20_000
    assert_lossless(*fit(seconds, CHAIN_TARGET[1]))


def broken_tree(draft_tokens, target_probs, children, rng) -> Accepted:
    """EAGLE-2 rule WITHOUT renormalising: accept each sibling with its original p(t)."""
    node, slots = 0, []
    while True:
        p = target_probs[node].copy()
        for child in children[node]:
            if rng.random() < target_probs[node][draft_tokens[child]]:  # bug: not p(t) / sum(p)
                break
            p[draft_tokens[child]] = 0.0
        else:
            tokens = tuple(int(draft_tokens[s]) for s in slots) + (sample(p, rng),)
            return Accepted(tuple(slots), tokens, slots[-1] if slots else 0)
        slots.append(child)
        node = child


def broken_chain(draft_tokens, draft_probs, target_probs, rng) -> Accepted:
    """Speculative sampling that corrects from p instead of the residual max(0, p - q)."""
    for i, token in enumerate(draft_tokens):
        if rng.random() * draft_probs[i][token] >= target_probs[i][token]:
            bonus = sample(target_probs[i], rng)  # bug: should be normalise(max(0, p - q))
            return Accepted(tuple(range(1, i + 1)), (*map(int, draft_tokens[:i]), bonus), i)
    return Accepted(tuple(range(1, len(draft_tokens) + 1)), (*map(int, draft_tokens),
                                                              sample(target_probs[-1], rng)), len(draft_tokens))


@pytest.mark.parametrize(("runs", "rule", "target"), [(tree_runs, broken_tree, STAT_TARGET[0]),
                                                       (chain_runs, broken_chain, CHAIN_TARGET[0])],
                         ids=["tree-without-renormalising", "chain-correcting-from-p"])
def test_negative_control_the_statistical_check_catches_a_broken_rule(runs, rule, target):
    pvalue, tv = fit([t[0] for t in runs(rule)], target)
    assert pvalue < 1e-12, (pvalue, tv)
