"""PromptAttention (com.trtspec), the compiled custom op a context graph's attention runs, in real ONNX Runtime
sessions over one-node graphs: its output against a float64 reference of causal rotary attention over each row's
past and its new tokens (one and several token blocks, pasts of any length in one batch, 1 and 2 threads), its cache
writes in place and copied, and one-line errors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtspec.model.onnx_ops import IR_VERSION, OPSET
from trtspec.model.ort_session import session_options
from trtspec.native import DOMAIN, PROMPT_ATTENTION

HEADS, KV_HEADS, HD, CAPACITY, POSITIONS = 6, 2, 32, 96, 128
WIDTH = (HEADS + 2 * KV_HEADS) * HD


def make_session(threads: int = 2, heads: int = HEADS) -> ort.InferenceSession:
    names = ["qkv", "past_key", "past_value", "past_lengths", "cos_cache", "sin_cache"]
    types = [TensorProto.FLOAT] * 3 + [TensorProto.INT32] + [TensorProto.FLOAT] * 2
    shapes = [["B", "T", "W"], ["B", KV_HEADS, "C", HD], ["B", KV_HEADS, "C", HD], ["B"], ["P", HD // 2],
              ["P", HD // 2]]
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in zip(names, types, shapes)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("attn", "present_key",
                                                                                     "present_value")]
    node = helper.make_node(PROMPT_ATTENTION, names, ["attn", "present_key", "present_value"], domain=DOMAIN,
                            num_heads=heads, kv_num_heads=KV_HEADS)
    model = helper.make_model(helper.make_graph([node], "prompt_attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=IR_VERSION)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin=False, native_ops=True),
                                providers=["CPUExecutionProvider"])


def feeds(rng, pasts: list[int], tokens: int, capacity: int = CAPACITY) -> dict[str, np.ndarray]:
    half = HD // 2
    angles = np.arange(POSITIONS)[:, None] / (10000.0 ** (np.arange(half) / half))[None, :]
    batch = len(pasts)
    return {"qkv": rng.standard_normal((batch, tokens, WIDTH)).astype(np.float32) * 0.5,
            "past_key": rng.standard_normal((batch, KV_HEADS, capacity, HD)).astype(np.float32),
            "past_value": rng.standard_normal((batch, KV_HEADS, capacity, HD)).astype(np.float32),
            "past_lengths": np.array(pasts, np.int32),
            "cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32)}


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference(f: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64: the new tokens' rotated keys and values written at past + t, then each token's attention over keys
    0 .. past + t."""
    qkv = f["qkv"].astype(np.float64)
    batch, tokens, _ = qkv.shape
    key, value = f["past_key"].astype(np.float64), f["past_value"].astype(np.float64)
    cos, sin = f["cos_cache"].astype(np.float64), f["sin_cache"].astype(np.float64)
    out = np.zeros((batch, tokens, HEADS * HD))
    group = HEADS // KV_HEADS
    for b, past in enumerate(f["past_lengths"]):
        at = past + np.arange(tokens)
        q = rope(qkv[b, :, :HEADS * HD].reshape(tokens, HEADS, HD), cos[at][:, None], sin[at][:, None])
        k = rope(qkv[b, :, HEADS * HD:(HEADS + KV_HEADS) * HD].reshape(tokens, KV_HEADS, HD), cos[at][:, None],
                 sin[at][:, None])
        v = qkv[b, :, (HEADS + KV_HEADS) * HD:].reshape(tokens, KV_HEADS, HD)
        key[b, :, at], value[b, :, at] = k, v  # (b and at apart: numpy puts their axis first)
        for t in range(tokens):
            for h in range(HEADS):
                keys, values = key[b, h // group, :past + t + 1], value[b, h // group, :past + t + 1]
                scores = keys @ q[t, h]
                weights = np.exp(scores - scores.max())
                out[b, t, h * HD:(h + 1) * HD] = weights @ values / weights.sum()
    return out, key, value


@pytest.mark.parametrize("pasts,tokens", [([0], 1), ([0], 37), ([5], 16), ([0, 23, 7], 33), ([60], 36)])
@pytest.mark.parametrize("threads", [1, 2])
def test_it_computes_causal_rotary_attention_over_the_past_and_the_prompt(pasts, tokens, threads):
    f = feeds(np.random.default_rng(len(pasts) * 100 + tokens), pasts, tokens)
    attn, present_key, present_value = make_session(threads).run(None, f)
    expected, key, value = reference(f)
    assert np.abs(attn - expected).max() <= 1e-5 * np.abs(expected).max()
    for b, past in enumerate(pasts):  # the cache rows up to the new tokens; the rest is untouched
        assert np.allclose(present_key[b, :, :past + tokens], key[b, :, :past + tokens], atol=1e-5, rtol=0)
        assert np.array_equal(present_value[b, :, :past + tokens], value[b, :, :past + tokens].astype(np.float32))
        assert np.array_equal(present_key[b, :, past + tokens:], f["past_key"][b, :, past + tokens:])


def test_the_present_grows_past_the_capacity_when_the_tokens_need_it():
    f = feeds(np.random.default_rng(3), [10], 20, capacity=16)
    attn, present_key, _ = make_session().run(None, f)
    expected, key, _ = reference({**f, "past_key": np.pad(f["past_key"], ((0, 0), (0, 0), (0, 14), (0, 0))),
                                  "past_value": np.pad(f["past_value"], ((0, 0), (0, 0), (0, 14), (0, 0)))})
    assert present_key.shape == (1, KV_HEADS, 30, HD)
    assert np.abs(attn - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("change,message", [
    (lambda f: f.update(past_lengths=np.array([200], np.int32)), "past length 200 is outside the cache's 96 rows"),
    (lambda f: f.update(past_lengths=np.array([95], np.int32)), "position 130 is outside the rotary cache's 128"),
    (lambda f: f.update(qkv=f["qkv"][..., :-1]), "input qkv has shape [1, 36, 319], expected [B, T, 320]"),
])
def test_inputs_it_cannot_run_are_one_error_naming_the_op(change, message):
    f = feeds(np.random.default_rng(4), [0], 36, capacity=CAPACITY)
    change(f)
    with pytest.raises(Exception, match="PromptAttention") as error:
        make_session().run(None, f)
    assert message in str(error.value)
