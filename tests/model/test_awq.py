"""AWQ-style pre-scaling of a float checkpoint: the float model's function is unchanged, the int4 calibration error
never grows, the GQA-tied scales of `dense` fold into v, and what it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.model.awq import AwqOptions, prescale_checkpoint, search_scale
from trtspec.model.quantize import fake_quantize
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128, num_layers=2)
OPTIONS = AwqOptions(alphas=6, tokens=256)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    root = tmp_path_factory.mktemp("awq")
    ckpt = tiny_trtllm_checkpoints(root, MODEL, drafters=("none",))["none"]
    rng = np.random.default_rng(0)
    ids = [list(rng.integers(0, MODEL.vocab_size, 40)) for _ in range(4)]
    chosen = prescale_checkpoint(ckpt, root / "awq", root / "base", ids, OPTIONS, threads=1)
    return {"root": root, "ckpt": ckpt, "awq": root / "awq", "chosen": chosen}


def _logits(ckpt, out, ids, weights="fp32"):
    build(BuildOptions(source=ckpt, out=out, max_input_len=32, max_seq_len=64, no_spec=True, weights=weights))
    engine = OrtEngine(out, threads=1)
    seq = engine.open()
    logits = engine.prefill(seq, np.asarray(ids, np.int64)).logits
    engine.close(seq)
    return logits


def test_float_function_is_unchanged(scaled):
    ids = [3, 17, 42, 9, 100, 7, 5, 64]
    before = _logits(scaled["ckpt"], scaled["root"] / "e-before", ids)
    after = _logits(scaled["awq"], scaled["root"] / "e-after", ids)
    assert np.abs(after - before).max() <= 1e-4 * np.abs(before).max()


def test_every_group_chosen_and_never_worse_on_calibration(scaled):
    chosen = scaled["chosen"]
    assert [(g.layer, g.group) for g in chosen] == [(i, g) for i in range(2) for g in ("qkv", "fc+gate", "dense",
                                                                                       "proj")]
    assert all(0.0 <= g.alpha <= 1.0 and g.error_ratio <= 1.0 for g in chosen)
    record = json.loads((scaled["awq"] / "awq.json").read_text())
    assert len(record["groups"]) == len(chosen) and record["calibration_sequences"] == 4


def test_scales_were_folded(scaled):
    from safetensors.numpy import load_file

    before = load_file(str(scaled["ckpt"] / "rank0.safetensors"))
    after = load_file(str(scaled["awq"] / "rank0.safetensors"))
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert any(k.endswith("input_layernorm.weight") for k in changed) or all(
        g.alpha == 0 for g in scaled["chosen"] if g.group == "qkv")
    assert set(after) == set(before)
    # an int4 build of the scaled checkpoint still builds and runs
    logits = _logits(scaled["awq"], scaled["root"] / "e-int4", [1, 2, 3], weights="int4")
    assert np.isfinite(logits).all()


def test_search_prefers_scales_on_an_outlier_channel():
    """One input channel 50x larger than the rest: AWQ scales it up before rounding and cuts the output error."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    x[:, 5] *= 50
    w = rng.standard_normal((32, 64)).astype(np.float32)
    alpha, s, ratio = search_scale(x, [w], AwqOptions(alphas=11))
    assert alpha > 0 and ratio < 0.8
    assert s[5] == s.max()
    rtn = np.square(x @ (w - fake_quantize(w, 4, 32)).T).sum()
    awq = np.square(x @ (w - fake_quantize(w * s, 4, 32) / s).T).sum()
    assert awq == pytest.approx(ratio * rtn, rel=1e-3)


def test_tied_scales_share_a_kv_channel():
    rng = np.random.default_rng(2)
    x = np.abs(rng.standard_normal((64, 8))).astype(np.float32)
    tie = lambda mean: np.repeat(mean.reshape(2, 2, 2).mean(1)[:, None, :], 2, axis=1).reshape(-1)  # noqa: E731
    _, s, _ = search_scale(x, [rng.standard_normal((4, 8)).astype(np.float32)],
                           AwqOptions(alphas=3, block_size=32), tie=tie)
    s = s.reshape(2, 2, 2)
    assert np.array_equal(s[:, 0], s[:, 1])


def test_refuses_sharded_and_quantized_checkpoints(scaled, tmp_path):
    import shutil

    for field, value, message in (("mapping", {"tp_size": 2, "pp_size": 1, "world_size": 2}, "unsharded"),
                                  ("quantization", {"quant_algo": "W4A16_AWQ"}, "already quantized")):
        bad = tmp_path / field
        shutil.copytree(scaled["ckpt"], bad)
        config = json.loads((bad / "config.json").read_text())
        config[field] = value
        (bad / "config.json").write_text(json.dumps(config))
        with pytest.raises(ConfigError, match=message):
            prescale_checkpoint(bad, tmp_path / "out", scaled["root"] / "base", [[1, 2]])
