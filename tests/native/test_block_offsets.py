"""AddBlockOffsets (com.trtspec), the compiled custom op that finishes an int4 product with block minima, in real ONNX
Runtime sessions over one-node graphs: its numbers against a float64 reference, and a row's output the same bits
however many rows the call has and however many threads run it (what keeps a verify step's slot equal to a plain
step's), and one-line errors for inputs it cannot run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtspec.model.onnx_ops import IR_VERSION, OPSET
from trtspec.model.ort_session import session_options
from trtspec.native import ADD_BLOCK_OFFSETS, DOMAIN


def make_session(n: int | str, k: int | str, offsets: np.ndarray | None = None, *, threads: int = 2, rank: int = 3,
                 offsets_type: int = TensorProto.FLOAT16) -> ort.InferenceSession:
    """One AddBlockOffsets node; `offsets` an initializer (as the engines' graphs have it), else a graph input."""
    lead = ["B", "T"][: rank - 1]
    inputs = [helper.make_tensor_value_info("product", TensorProto.FLOAT, [*lead, n]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])]
    initializers = []
    if offsets is None:
        inputs.append(helper.make_tensor_value_info("offsets", offsets_type, ["blocks", n]))
    else:
        initializers.append(numpy_helper.from_array(offsets, "offsets"))
    node = helper.make_node(ADD_BLOCK_OFFSETS, ["product", "x", "offsets"], ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], "add_block_offsets", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=IR_VERSION)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin=False, native_ops=True),
                                providers=["CPUExecutionProvider"])


def reference(product: np.ndarray, x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    blocks = offsets.shape[0]
    sums = x.astype(np.float64).reshape(*x.shape[:-1], blocks, -1).sum(-1)
    return product.astype(np.float64) + sums @ offsets.astype(np.float64)


def operands(rng, rows: int, n: int, k: int, block_size: int):
    product = rng.standard_normal((rows, n), dtype=np.float32)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    x[:, 3] *= 40  # an outlier, as activations have
    offsets = (rng.standard_normal((k // block_size, n)) * 0.01).astype(np.float16)
    return product, x, offsets


@pytest.mark.parametrize("n,k,block_size", [(40, 96, 32), (576, 576, 32), (300, 256, 64), (128, 384, 128),
                                            (3072, 576, 32)])
def test_it_adds_the_block_sums_times_the_offsets(n, k, block_size):
    rng = np.random.default_rng(n + k)
    product, x, offsets = operands(rng, 6, n, k, block_size)
    session = make_session(n, k, offsets, rank=2)
    (y,) = session.run(None, {"product": product, "x": x})
    assert y.dtype == np.float32 and y.shape == (6, n)
    expected = reference(product, x, offsets)
    assert np.abs(y - expected).max() <= 1e-5 * np.abs(expected).max()


def test_leading_dimensions_of_any_rank():
    rng = np.random.default_rng(7)
    product, x, offsets = operands(rng, 6, 48, 128, 32)
    session = make_session(48, 128, offsets, rank=3)
    (y,) = session.run(None, {"product": product.reshape(2, 3, 48), "x": x.reshape(2, 3, 128)})
    (flat,) = make_session(48, 128, offsets, rank=2).run(None, {"product": product, "x": x})
    assert np.array_equal(y.reshape(6, 48), flat)


@pytest.mark.parametrize("n", [40, 576, 49152 // 4])
def test_a_row_is_the_same_bits_in_any_call(n):
    """Row r of a 17-row call equals the same row computed alone, in 2 or 5 rows, on 1 or 2 threads (the columns
    split across threads, the rows tiled in pairs with a last single row)."""
    k = 576
    rng = np.random.default_rng(n)
    product, x, offsets = operands(rng, 17, n, k, 32)
    sessions = {t: make_session(n, k, offsets, threads=t, rank=2) for t in (1, 2)}
    (full,) = sessions[2].run(None, {"product": product, "x": x})
    for threads, session in sessions.items():
        for rows in ([0], [5], [16], [3, 4], [0, 7, 9, 11, 16], list(range(17))):
            (y,) = session.run(None, {"product": product[rows], "x": x[rows]})
            assert np.array_equal(y, full[rows]), (threads, rows)


def test_offsets_as_a_graph_input_and_an_empty_call():
    rng = np.random.default_rng(3)
    product, x, offsets = operands(rng, 2, 64, 64, 32)
    session = make_session(64, 64, None, rank=2)
    (y,) = session.run(None, {"product": product, "x": x, "offsets": offsets})
    assert np.abs(y - reference(product, x, offsets)).max() < 1e-5 * np.abs(y).max()
    (empty,) = session.run(None, {"product": product[:0], "x": x[:0], "offsets": offsets})
    assert empty.shape == (0, 64)


@pytest.mark.parametrize("feeds,message", [
    (lambda p, x, o: {"product": p, "x": x[:1], "offsets": o}, "same leading dimensions"),
    (lambda p, x, o: {"product": p, "x": x, "offsets": o[:, :10]}, "expected [blocks, 64]"),
    (lambda p, x, o: {"product": p, "x": x[:, :48], "offsets": o}, "not 2 blocks of a multiple of 16"),
    (lambda p, x, o: {"product": p, "x": x[:, :0], "offsets": o}, "x's 0 inputs are not 2 blocks"),
])
def test_inputs_it_cannot_run_are_one_error_naming_the_op(feeds, message):
    rng = np.random.default_rng(4)
    product, x, offsets = operands(rng, 2, 64, 64, 32)
    session = make_session("N", "K", None, rank=2)  # symbolic: the op, not ONNX Runtime, sees the shapes
    with pytest.raises(Exception) as info:
        session.run(None, feeds(product, x, offsets))
    text = str(info.value)
    assert "AddBlockOffsets: " in text and message in text, text


def test_float32_offsets_are_refused_when_the_session_loads():
    with pytest.raises(Exception, match="(?i)type"):
        make_session(64, 64, None, rank=2, offsets_type=TensorProto.FLOAT)
