"""tune's step-time model: lines through the verify curve after several pasts, levelled across profiles, the
acceptance added, anchored to a run's plain steps; and the curve measured past max_input_len on a tiny engine.
No speed is asserted: the figures are made up, or only their shape is checked."""

from __future__ import annotations

import pytest

from trtspec.tune.step_time import StepModel, acceptance_ms, fit, mean_past, measure, measured_pasts
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.testing import tiny_engine

PROFILES = (1, 3, 9)


def test_fit_draws_a_line_per_profile_through_the_pasts():
    # plain flat at 10 ms, 3 slots 12 ms + 1 ms per 100 tokens, 9 slots 15 ms + 4 ms per 100 tokens
    pasts = [100, 500, 900]
    model = fit(PROFILES, pasts, [[10, 12 + p / 100, 15 + 4 * p / 100] for p in pasts])
    assert model.step_ms(1, 2000) == pytest.approx(10)
    assert model.step_ms(3, 300) == pytest.approx(15) and model.step_ms(9, 300) == pytest.approx(27)
    assert model.step_ms(9, 1500) == pytest.approx(75)  # past the longest measured: the line goes on
    assert model.per_past_ms == pytest.approx((0, 0.01, 0.04))
    # a slope noise makes negative is flat at the mean
    noisy = fit(PROFILES, pasts, [[10, 12, 20], [9, 13, 21], [8, 14, 22]])
    assert noisy.per_past_ms[0] == 0 and noisy.step_ms(1, 0) == pytest.approx(9)
    # one past: every profile flat
    assert fit(PROFILES, [256], [[10, 12, 15]]).step_ms(9, 5000) == pytest.approx(15)


def test_a_profile_never_costs_more_than_a_larger_one_and_acceptance_adds():
    # 3 slots steeper than 9: past 1000 it would cost more, so it costs what 9 slots do
    model = StepModel(PROFILES, (10, 11, 14), (0, 0.01, 0.005), acceptance_ms=(0, 0.2, 0.5))
    assert model.verify_ms(3, 200) == pytest.approx(13) and model.verify_ms(3, 1000) == pytest.approx(19)
    assert model.step_ms(3, 200) == pytest.approx(13.2) and model.step_ms(9, 0) == pytest.approx(14.5)
    assert model.steps_ms({1: 10, 9: 2}, 0) == pytest.approx(10 * 10 + 2 * 14.5)


def test_anchoring_scales_the_lines_to_the_run_s_plain_steps():
    model = StepModel(PROFILES, (10, 12, 15), (0.01, 0.02, 0.04), acceptance_ms=(0, 0.3, 0.6))
    # two prompts: 100 plain steps after a mean 100 tokens (11 ms modelled), 50 after 400 (14 ms): 1800 ms modelled;
    # the run took 2.7 s, so every line is 1.5x, the acceptance unscaled
    anchored = model.anchored([(100, 100.0, 1.65), (50, 400.0, 1.05)])
    assert anchored.scale == pytest.approx(1.5)
    assert anchored.step_ms(1, 100) == pytest.approx(16.5) and anchored.step_ms(9, 0) == pytest.approx(22.5 + 0.6)
    assert anchored.anchored([(100, 100.0, 1.65), (50, 400.0, 1.05)]).scale == pytest.approx(1.5)  # idempotent
    assert model.anchored([]).scale == 1.0
    figures = anchored.to_dict(at=100)
    assert figures["per_1k_past_ms"] == [10, 20, 40] and figures["step_ms"][0] == pytest.approx(16.5)


def test_mean_past_and_where_the_curve_is_measured():
    assert mean_past(300, 128) == 364
    assert measured_pasts([400, 100, 250, 700], 128) == [100, 389, 828]
    assert measured_pasts([50], 10) == [50, 55, 60]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return OrtEngine(tiny_engine(tmp_path_factory.mktemp("steps"), drafter="none", max_input_len=32, max_seq_len=128,
                                 max_draft_len=4), threads=1)


def test_acceptance_costs_nothing_for_a_plain_step(engine):
    ms = acceptance_ms(engine, (1, *engine.slot_profiles), past=8, rounds=2)
    assert ms[0] == 0 and len(ms) == 1 + len(engine.slot_profiles) and all(m >= 0 for m in ms)


def test_the_curve_is_measured_after_pasts_longer_than_a_prompt(engine):
    """A past over max_input_len is prefilled in chunks; one over max_seq_len stops where a step still fits."""
    model = measure(engine, [8, 90, 1000], rounds=1)
    top = 128 - max(engine.slot_profiles)
    assert model.pasts == (8, 90, top) and model.profiles == (1, *engine.slot_profiles)
    assert len(model.measured_ms) == 3 and all(ms > 0 for row in model.measured_ms for ms in row)
    assert all(k >= 0 for k in model.per_past_ms)
