"""Sampling parameters and logits → probabilities: greedy, temperature, top-k, top-p, seeded draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax as scipy_softmax

from trtspec.errors import ConfigError
from trtspec.speculative.sampling import SamplingParams, logits_to_probs, make_rng, sample


def nonzero(probs: np.ndarray) -> list[int]:
    return np.flatnonzero(probs).tolist()


# ---- SamplingParams ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "bad_field"), [
    ({}, None),
    ({"temperature": 0.7, "top_k": 50, "top_p": 0.9, "seed": 3}, None),
    ({"top_p": 1.0, "top_k": 0}, None),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"seed": "7"}, "seed"),
])
def test_sampling_params_validation(kwargs, bad_field):
    if bad_field is None:
        SamplingParams(**kwargs)
        return
    with pytest.raises(ConfigError) as raised:
        SamplingParams(**kwargs)
    message = str(raised.value)
    assert message.startswith(f"{bad_field} {kwargs[bad_field]!r} is invalid: it must be ")  # the field, not the class


def test_sampling_params_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        SamplingParams(0.5)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(("temperature", "greedy"), [(0.0, True), (0, True), (1e-6, False), (1.0, False)])
def test_greedy_means_temperature_zero(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


# ---- logits_to_probs -------------------------------------------------------------------------------------

def test_greedy_is_one_hot_at_argmax_with_ties_to_lowest_id():
    logits = np.array([[1.0, 3.0, 3.0, 0.0],     # tie between 1 and 2 → 1
                       [-5.0, -5.0, -5.0, -5.0],  # all tied → 0
                       [0.0, 0.0, 0.0, 9.0]])
    probs = logits_to_probs(logits, SamplingParams())
    np.testing.assert_array_equal(probs, np.eye(4)[[1, 0, 3]])
    assert probs.dtype == np.float64


def test_greedy_ignores_top_k_and_top_p():
    probs = logits_to_probs(np.array([0.0, 2.0, 1.0]), SamplingParams(top_k=2, top_p=0.1))
    np.testing.assert_array_equal(probs, [0.0, 1.0, 0.0])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_matches_softmax_of_scaled_logits(temperature):
    logits = np.random.default_rng(0).normal(size=(3, 11)) * 4  # [rows, V]
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature))
    np.testing.assert_allclose(probs, scipy_softmax(logits / temperature, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-12)


def test_large_logits_and_tiny_temperature_do_not_overflow():
    probs = logits_to_probs(np.array([1e4, 0.0, 1e4 - 1.0]), SamplingParams(temperature=1e-3))
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs, [1.0, 0.0, 0.0], atol=1e-300)


def test_top_k_keeps_exactly_k_with_ties_to_lowest_id():
    logits = np.array([0.0, 4.0, 5.0, 4.0, 1.0])  # tokens 1 and 3 tie for second place
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert nonzero(probs) == [1, 2]
    np.testing.assert_allclose(probs[[1, 2]], scipy_softmax([4.0, 5.0]), rtol=1e-12)


@pytest.mark.parametrize("top_k", [5, 6, 100])
def test_top_k_at_least_vocab_is_off(top_k):
    logits = np.arange(5.0)
    np.testing.assert_allclose(logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=top_k)),
                               scipy_softmax(logits), rtol=1e-12)


# Probabilities 0.125, 0.5, 0.125, 0.25 (ids not in probability order): the nucleus is the smallest most-likely
# set whose mass reaches top_p.
NUCLEUS_LOGITS = np.log(np.array([0.125, 0.5, 0.125, 0.25]))


@pytest.mark.parametrize(("top_p", "kept"), [
    (0.1, [1]),            # always at least the top token
    (0.5, [1]),            # 0.5 reaches 0.5 exactly
    (0.51, [1, 3]),
    (0.75, [1, 3]),        # 0.5 + 0.25 reaches 0.75 exactly (float rounding tolerated)
    (0.76, [0, 1, 3]),     # tie at 0.125: the lowest id joins first
    (0.875, [0, 1, 3]),
    (0.9, [0, 1, 2, 3]),
    (1.0, [0, 1, 2, 3]),
])
def test_top_p_keeps_the_minimal_nucleus(top_p, kept):
    probs = logits_to_probs(NUCLEUS_LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert nonzero(probs) == kept
    full = np.exp(NUCLEUS_LOGITS)
    np.testing.assert_allclose(probs[kept], full[kept] / full[kept].sum(), rtol=1e-12)


def test_top_k_applies_before_top_p():
    # After top-k 2 the renormalised mass is [4/7, 3/7], so top-p 0.5 keeps only token 0. Top-p first would
    # keep tokens 0 and 1 (0.4 < 0.5).
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    np.testing.assert_array_equal(probs, [1.0, 0.0, 0.0, 0.0])


def test_filters_work_on_batches_row_by_row():
    logits = np.array([[[0.0, 1.0, 2.0]], [[2.0, 1.0, 0.0]]])  # [2, 1, V]
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    np.testing.assert_array_equal(probs, [[[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]]])


# ---- sample / make_rng -----------------------------------------------------------------------------------

def test_seeded_rng_gives_the_same_draws():
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    first = [sample(probs, make_rng(1234)) for _ in range(3)]
    rng_a, rng_b = make_rng(1234), make_rng(1234)
    assert [sample(probs, rng_a) for _ in range(200)] == [sample(probs, rng_b) for _ in range(200)]
    assert len(set(first)) == 1  # a fresh generator with the same seed starts the same way


def test_unseeded_rng_is_a_generator():
    assert isinstance(make_rng(None), np.random.Generator)


def test_sample_never_draws_zero_mass_and_follows_the_distribution():
    probs = np.array([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    rng = make_rng(7)
    counts = np.bincount([sample(probs, rng) for _ in range(20_000)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert np.abs(counts / counts.sum() - probs).sum() / 2 < 0.02


def test_sample_accepts_unnormalised_mass_and_rejects_none():
    assert sample(np.array([0.0, 0.0, 3.0]), make_rng(0)) == 2
    with pytest.raises(ValueError, match="total mass"):
        sample(np.zeros(3), make_rng(0))
