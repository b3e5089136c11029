"""benchmarks/prefill_numerics.py: the activation and weight rounding it scores."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.prefill_numerics import round_rows, round_weight, scores  # noqa: E402


def test_round_rows_scales_each_group_of_each_row_on_its_own():
    x = torch.randn(3, 5, 64)
    x[0, 0, 3] = 100.0  # an outlier channel in one row
    per_block, per_row = round_rows(x, 32), round_rows(x, None)
    assert per_block.shape == per_row.shape == x.shape
    # a group's error is at most half its own step (max |x| / 127 / 2)
    step = x.reshape(3, 5, 2, 32).abs().amax(-1, keepdim=True) / 127
    assert torch.all((per_block - x).reshape(3, 5, 2, 32).abs() <= step / 2 + 1e-6)
    # the outlier coarsens its whole row at one scale a row, only its own group at one scale a block
    assert (per_row[0, 0, 32:] - x[0, 0, 32:]).abs().max() > (per_block[0, 0, 32:] - x[0, 0, 32:]).abs().max()
    assert torch.equal(per_row[1:], round_rows(x[1:], None))  # rows do not see each other


def test_round_weight_blocks_as_the_engine_and_per_channel():
    w = torch.randn(8, 64)
    from trtspec.model.quantize import fake_quantize

    assert np.array_equal(round_weight(w, per_channel=False).numpy(), fake_quantize(w.numpy(), 8, 32))
    per_channel = round_weight(w, per_channel=True)
    assert torch.all((per_channel - w).abs() <= w.abs().amax(1, keepdim=True) / 254 + 1e-6)


def test_scores_are_one_and_zero_for_the_reference_itself():
    logits = [torch.randn(4, 10), torch.randn(2, 10)]
    s = scores(logits, logits)
    assert s["top1"] == 1.0 and abs(s["kl"]) < 1e-6
    flipped = [-x for x in logits]
    assert scores(flipped, logits)["top1"] < 1.0 and scores(flipped, logits)["kl"] > 0
