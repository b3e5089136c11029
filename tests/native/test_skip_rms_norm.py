"""SkipRMSNorm (com.trtspec), the residual add and RMS norm of a `--native-matmul` engine, in real ONNX Runtime
sessions: the norm in float64 within float32's rounding, ONNX Runtime's SkipSimplifiedLayerNormalization beside it,
a row's output the same bits in any call, and one-line errors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtspec.model.onnx_ops import IR_VERSION, MS_DOMAIN, OPSET
from trtspec.model.ort_session import session_options
from trtspec.native import DOMAIN, SKIP_RMS_NORM

EPS = 1e-5


def make_session(h: int, *, threads: int = 2, epsilon: float | None = EPS, rank: int = 2,
                 reference: bool = True) -> ort.InferenceSession:
    """SkipRMSNorm (outputs y, total), with `reference` beside SkipSimplifiedLayerNormalization (outputs ref,
    ref_total); epsilon None: a node without the attribute."""
    lead = ["B", "T"][: rank - 1]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [*lead, "H"]) for name in ("x", "skip")]
    inputs.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, ["G"]))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "total")]
    attributes = {} if epsilon is None else {"epsilon": epsilon}
    nodes = [helper.make_node(SKIP_RMS_NORM, ["x", "skip", "gamma"], ["y", "total"], domain=DOMAIN, **attributes)]
    if reference:
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"],
                                      ["ref", "", "", "ref_total"], domain=MS_DOMAIN, epsilon=epsilon))
        outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("ref", "ref_total")]
    graph = helper.make_graph(nodes, "skip_rms_norm", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1),
                                                    helper.make_opsetid(MS_DOMAIN, 1)], ir_version=IR_VERSION)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin=False, native_ops=True),
                                providers=["CPUExecutionProvider"])


def operands(rng, rows: int, h: int):
    x = (rng.standard_normal((rows, h)) * 3).astype(np.float32)
    skip = rng.standard_normal((rows, h)).astype(np.float32)
    gamma = (1 + 0.2 * rng.standard_normal(h)).astype(np.float32)
    return {"x": x, "skip": skip, "gamma": gamma}


@pytest.mark.parametrize("h", [576, 64, 40])  # 40: a row not a whole number of 16-float lanes
def test_it_is_the_rms_norm_of_the_sum_and_skip_simplified_layer_norms(h):
    rng = np.random.default_rng(h)
    feeds = operands(rng, 7, h)
    y, total, ref, ref_total = make_session(h).run(None, feeds)
    assert np.array_equal(total, feeds["x"] + feeds["skip"])
    t = total.astype(np.float64)
    expected = t / np.sqrt((t * t).mean(-1, keepdims=True) + EPS) * feeds["gamma"]
    assert np.abs(y - expected).max() <= 1e-6 * np.abs(expected).max()
    assert np.array_equal(ref_total, total)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_row_is_the_same_bits_in_any_call():
    rng = np.random.default_rng(1)
    h = 576
    feeds = operands(rng, 130, h)  # 130 x 576: above the inline bound, so in chunks across the threads
    y, total = make_session(h).run(["y", "total"], feeds)
    for threads in (1, 2):
        session = make_session(h, threads=threads)
        for rows in (1, 2, 3, 16, 17, 57, 130):
            part = {name: v[:rows] if name != "gamma" else v for name, v in feeds.items()}
            assert np.array_equal(session.run(["y"], part)[0], y[:rows]), (threads, rows)
        tail = {name: v[100:] if name != "gamma" else v for name, v in feeds.items()}
        assert np.array_equal(session.run(["y"], tail)[0], y[100:])


def test_leading_dimensions_and_an_empty_call():
    rng = np.random.default_rng(2)
    feeds = operands(rng, 6, 64)
    flat = make_session(64).run(["y"], feeds)[0]
    session = make_session(64, rank=3)
    shaped = {name: v.reshape(2, 3, 64) if name != "gamma" else v for name, v in feeds.items()}
    assert np.array_equal(session.run(["y"], shaped)[0].reshape(6, 64), flat)
    empty = {name: np.zeros((1, 0, 64), np.float32) if name != "gamma" else v for name, v in feeds.items()}
    y, total = session.run(["y", "total"], empty)
    assert y.shape == total.shape == (1, 0, 64)


@pytest.mark.parametrize("change,message", [
    (lambda f: dict(f, gamma=f["gamma"][:10]), "input gamma"),
    (lambda f: dict(f, skip=f["skip"][:2]), "input skip"),
])
def test_inputs_it_cannot_run_are_one_error_naming_the_op(change, message):
    feeds = operands(np.random.default_rng(3), 4, 64)
    with pytest.raises(Exception) as info:
        make_session(64, reference=False).run(["y"], change(feeds))
    text = str(info.value)
    assert "SkipRMSNorm: " in text and message in text, text


def test_a_node_without_epsilon_is_refused_naming_the_attribute():
    with pytest.raises(Exception) as info:
        make_session(64, epsilon=None, reference=False)
    assert "SkipRMSNorm: " in str(info.value) and "epsilon" in str(info.value), str(info.value)
