"""BlockMatMul (com.trtspec), the compiled custom op a `--native-matmul` engine's products run, in real ONNX
Runtime sessions: MatMulNBits' numbers at accuracy level 4 (against a float64 reference of that rounding, and
against MatMulNBits itself beside it over the same initializers), a row's output the same bits in any call, and
one-line errors for inputs it cannot run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtspec.model.onnx_ops import IR_VERSION, MS_DOMAIN, OPSET
from trtspec.model.ort_session import session_options
from trtspec.model.quantize import dequantize, quantize
from trtspec.native import BLOCK_MATMUL, DOMAIN


def make_session(codes: np.ndarray | None, scales: np.ndarray | None, *, n: int, k: int, bits: int = 8,
                 threads: int = 2, rank: int = 2, gated: int | None = None) -> ort.InferenceSession:
    """BlockMatMul (output y; its `gated` attribute where given) beside MatMulNBits at accuracy level 4 (output ref)
    over the same initializers; codes and scales graph inputs where None (then the session has only BlockMatMul)."""
    lead = ["B", "T"][: rank - 1]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, "K"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, "M"])]
    attributes = {} if gated is None else {"gated": gated}
    nodes = [helper.make_node(BLOCK_MATMUL, ["x", "codes", "scales"], ["y"], domain=DOMAIN, **attributes)]
    initializers = []
    if codes is None:
        inputs += [helper.make_tensor_value_info("codes", TensorProto.UINT8, ["N", "blocks", "blob"]),
                   helper.make_tensor_value_info("scales", TensorProto.FLOAT, ["S"])]
    else:
        initializers = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales.reshape(-1), "scales")]
        nodes.append(helper.make_node("MatMulNBits", ["x", "codes", "scales"], ["ref"], domain=MS_DOMAIN, K=k, N=n,
                                      bits=bits, block_size=32, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info("ref", TensorProto.FLOAT, [*lead, "N"]))
    graph = helper.make_graph(nodes, "block_matmul", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1),
                                                    helper.make_opsetid(MS_DOMAIN, 1)], ir_version=IR_VERSION)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin=False, native_ops=True),
                                providers=["CPUExecutionProvider"])


def level4_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x rounded to int8 per row in blocks of 32 (scale max|x| / 127, x · (1 / scale) rounded to nearest even), in
    float64 against the dequantized W."""
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    scale = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inverse = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    rounded = np.rint(blocks * inverse) * scale.astype(np.float64)
    return rounded.reshape(x.shape) @ w.T.astype(np.float64)


def operands(rng, rows: int, n: int, k: int, bits: int):
    q = quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), bits, 32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[:, 3] *= 40  # an outlier channel, as activations have
    return q, x


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,k", [(576, 576), (40, 96), (3072, 576), (576, 1536), (20, 64)])
def test_it_computes_matmulnbits_level_4(bits, n, k):
    rng = np.random.default_rng(n + k + bits)
    q, x = operands(rng, 19, n, k, bits)
    session = make_session(q.packed, q.scales, n=n, k=k, bits=bits)
    y, ref = session.run(None, {"x": x})
    assert y.dtype == np.float32 and y.shape == (19, n)
    expected = level4_reference(x, dequantize(q))
    scale = np.abs(expected).max()
    assert np.abs(y - expected).max() <= 1e-5 * scale
    # MatMulNBits computes the same rounding (its sums in another order, a rare rounding tie taken the other way)
    assert np.abs(y - ref).max() <= 2e-3 * scale
    assert np.median(np.abs(y - ref)) <= 1e-6 * scale


@pytest.mark.parametrize("bits", [8, 4])
def test_a_row_is_the_same_bits_in_any_call(bits):
    rng = np.random.default_rng(7)
    n, k = 100, 192  # columns not a multiple of 32: a partial last pair
    q, x = operands(rng, 21, n, k, bits)
    many = make_session(q.packed, q.scales, n=n, k=k, bits=bits).run(["y"], {"x": x})[0]
    for threads in (1, 2):
        session = make_session(q.packed, q.scales, n=n, k=k, bits=bits, threads=threads)
        for rows in (1, 2, 3, 4, 5, 8, 9, 15, 16, 17):
            part = session.run(["y"], {"x": x[:rows]})[0]
            assert np.array_equal(part, many[:rows]), (threads, rows)
        assert np.array_equal(session.run(["y"], {"x": x[20:]})[0], many[20:])


@pytest.mark.parametrize("bits", [8, 4])
def test_sessions_over_the_same_matrix_share_its_regrouped_copy_and_others_keep_their_own(bits):
    """Kernels share the regrouped weights of a matrix with the same bytes (an engine's two graphs): sessions over the
    same codes and scales agree bit for bit, and a matrix of the same shape with other codes, or other scales alone,
    computes its own product, whichever session ran first."""
    rng = np.random.default_rng(11)
    n, k = 48, 96
    q, x = operands(rng, 5, n, k, bits)
    other, _ = operands(rng, 5, n, k, bits)
    matrices = {"same": q, "twin": q, "codes": other}
    sessions = {name: make_session(m.packed, m.scales, n=n, k=k, bits=bits) for name, m in matrices.items()}
    sessions["scales"] = make_session(q.packed, q.scales * 2, n=n, k=k, bits=bits)
    for name in ["same", "codes", "scales", "twin", "same"]:
        y, ref = sessions[name].run(None, {"x": x})
        assert np.abs(y - ref).max() <= 2e-3 * np.abs(ref).max(), name
        if name == "twin":
            assert np.array_equal(y, sessions["same"].run(["y"], {"x": x})[0])
    y_scales = sessions["scales"].run(["y"], {"x": x})[0]
    assert np.allclose(y_scales, 2 * sessions["same"].run(["y"], {"x": x})[0], rtol=1e-5, atol=0)


def silu_times_up(product: np.ndarray) -> np.ndarray:
    """silu(first half) · second half, in float64"""
    gate, up = np.split(product.astype(np.float64), 2, axis=-1)
    return gate / (1 + np.exp(-gate)) * up


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,k", [(3072, 576), (64, 96), (96, 64)])
def test_gated_it_is_silu_of_the_gate_times_the_up_of_the_same_product(bits, n, k):
    rng = np.random.default_rng(n + k + bits)
    q, x = operands(rng, 19, n, k, bits)
    product = make_session(q.packed, q.scales, n=n, k=k, bits=bits).run(["y"], {"x": x})[0]
    assert np.array_equal(product, make_session(q.packed, q.scales, n=n, k=k, bits=bits, gated=0).run(
        ["y"], {"x": x})[0])
    y = make_session(q.packed, q.scales, n=n, k=k, bits=bits, gated=1).run(["y"], {"x": x})[0]
    assert y.dtype == np.float32 and y.shape == (19, n // 2)
    expected = silu_times_up(product)
    # the sigmoid's exp within 2 ulp: a few float32 roundings of each element
    assert np.all(np.abs(y - expected) <= 8 * np.finfo(np.float32).eps * np.abs(expected) + 1e-30)


@pytest.mark.parametrize("bits", [8, 4])
def test_gated_a_row_is_the_same_bits_in_any_call(bits):
    rng = np.random.default_rng(8)
    n, k = 160, 192  # 5 groups of 16 columns a half: gate and up groups paired across an odd count
    q, x = operands(rng, 21, n, k, bits)
    x[4] *= 1e4  # silu's tails: e^-|g| below float's range, and far above
    many = make_session(q.packed, q.scales, n=n, k=k, bits=bits, gated=1).run(["y"], {"x": x})[0]
    assert np.isfinite(many).all()
    for threads in (1, 2):
        session = make_session(q.packed, q.scales, n=n, k=k, bits=bits, threads=threads, gated=1)
        for rows in (1, 2, 3, 5, 9, 16, 17):
            assert np.array_equal(session.run(["y"], {"x": x[:rows]})[0], many[:rows]), (threads, rows)


@pytest.mark.parametrize("n,gated,message", [(48, 1, "gated = 1 needs N a multiple of 32"),
                                             (64, 2, "attribute gated is 2, not 0 or 1")])
def test_gated_inputs_it_cannot_run_are_one_error_naming_the_op(n, gated, message):
    rng = np.random.default_rng(5)
    q, x = operands(rng, 2, n, 64, 8)
    with pytest.raises(Exception) as info:
        make_session(None, None, n=n, k=64, gated=gated).run(None, {"x": x, "codes": q.packed,
                                                                    "scales": q.scales.reshape(-1)})
    text = str(info.value)
    assert "BlockMatMul: " in text and message in text, text


def test_leading_dimensions_and_an_empty_call():
    rng = np.random.default_rng(3)
    q, x = operands(rng, 6, 64, 64, 8)
    session = make_session(q.packed, q.scales, n=64, k=64, rank=3)
    y, ref = session.run(None, {"x": x.reshape(2, 3, 64)})
    assert y.shape == (2, 3, 64)
    assert np.array_equal(y.reshape(6, 64), make_session(q.packed, q.scales, n=64, k=64).run(["y"], {"x": x})[0])
    (empty,) = session.run(["y"], {"x": np.zeros((1, 0, 64), np.float32)})
    assert empty.shape == (1, 0, 64)


@pytest.mark.parametrize("feeds,message", [
    (lambda x, c, s: {"x": x[:, :32], "codes": c, "scales": s}, "x has 32 inputs, codes 2 blocks of 32"),
    (lambda x, c, s: {"x": x, "codes": c[:, :, :8], "scales": s}, "need 16 bytes (4-bit) or 32"),
    (lambda x, c, s: {"x": x, "codes": c, "scales": s[:5]}, "expected 128 (N x blocks)"),
])
def test_inputs_it_cannot_run_are_one_error_naming_the_op(feeds, message):
    rng = np.random.default_rng(4)
    q, x = operands(rng, 2, 64, 64, 8)
    session = make_session(None, None, n=64, k=64)
    with pytest.raises(Exception) as info:
        session.run(None, feeds(x, q.packed, q.scales.reshape(-1)))
    text = str(info.value)
    assert "BlockMatMul: " in text and message in text, text


def test_the_benchmark_prints_both_kernels_for_each_row_count():
    """benchmarks/block_gemm.py (BlockMatMul beside MatMulNBits over one layer's products): its table; no times
    asserted, only that both ran and agreed."""
    from click.testing import CliRunner

    from benchmarks.block_gemm import main

    result = CliRunner().invoke(main, ["--rows", "1,9", "--repeats", "3", "--bits", "4"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.split()[:1] in (["1"], ["9"])]
    assert [r[0] for r in rows] == ["1", "9"]
    assert all(float(r[-1]) < 1e-3 for r in rows)  # max |diff| / max |y| of the two kernels' outputs
