"""trtspec's BlockMatMul against ONNX Runtime's MatMulNBits at accuracy level 4 on the same blocks: one decoder
layer's four products of SmolLM2-135M (q/k/v, o, gate/up, down), each kernel in one session of its own, timed side
by side in one process for a plain step (1 row), a verify step (16) and prompts (400, 1000).

    .venv/bin/python benchmarks/block_gemm.py [--rows 1,16,400,1000] [--bits 8] [--repeats 15]

Prints per row count each kernel's median time for the layer, their ratio, and the largest difference between the
two outputs relative to the largest output (the order of float sums; a rare activation rounding tie).
"""

from __future__ import annotations

import os
import time

import click
import numpy as np

# (N, K) of SmolLM2-135M's products in one decoder layer: q/k/v fused, o, gate/up fused, down
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def layer_session(weights, threads: int, *, native_kernel: bool):
    """One session holding the layer's four products (one thread pool, as in an engine): inputs x0.., outputs y0.."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from trtspec import native
    from trtspec.model.onnx_ops import IR_VERSION, MS_DOMAIN, OPSET
    from trtspec.model.ort_session import session_options

    nodes, inputs, outputs, initializers = [], [], [], []
    for i, (q, n, k) in enumerate(weights):
        if native_kernel:
            nodes.append(helper.make_node(native.BLOCK_MATMUL, [f"x{i}", f"q{i}", f"s{i}"], [f"y{i}"],
                                          domain=native.DOMAIN))
        else:
            nodes.append(helper.make_node("MatMulNBits", [f"x{i}", f"q{i}", f"s{i}"], [f"y{i}"], domain=MS_DOMAIN,
                                          K=k, N=n, bits=q.bits, block_size=32, accuracy_level=4))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["M", k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["M", n]))
        initializers += [numpy_helper.from_array(q.packed, f"q{i}"),
                         numpy_helper.from_array(q.scales.reshape(-1).astype(np.float32), f"s{i}")]
    graph = helper.make_graph(nodes, "layer", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1),
                                                    helper.make_opsetid(native.DOMAIN, 1)], ir_version=IR_VERSION)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spin=False, native_ops=True),
                                providers=["CPUExecutionProvider"])


def median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)


@click.command()
@click.option("--rows", default="1,16,400,1000", show_default=True, help="Row counts (M), comma-separated.")
@click.option("--bits", default=8, show_default=True, type=click.Choice(["4", "8"]))
@click.option("--repeats", default=15, show_default=True, type=click.IntRange(3))
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1))
def main(rows: str, bits: str, repeats: int, threads: int) -> None:
    from trtspec import native
    from trtspec.model.quantize import quantize

    rng = np.random.default_rng(0)
    weights = [(quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), int(bits), 32), n, k)
               for n, k in LAYER]
    ours, theirs = (layer_session(weights, threads, native_kernel=flag) for flag in (True, False))
    kernels = "AVX-512 VNNI" if native.block_matmul_vectorized() else "portable loop (no AVX-512 VNNI here)"
    print(f"one SmolLM2-135M layer's products (N x K: {', '.join(f'{n}x{k}' for n, k in LAYER)}), int{bits} blocks "
          f"of 32, {threads} threads, median of {repeats} x 3 alternating blocks; BlockMatMul: {kernels}; load "
          f"average before {os.getloadavg()[0]:.2f}")
    print(f"{'rows':>5} {'MatMulNBits':>12} {'BlockMatMul':>12} {'ratio':>6} {'max |diff| / max |y|':>21}")
    for m in (int(r) for r in rows.split(",")):
        feeds = {f"x{i}": rng.standard_normal((m, k)).astype(np.float32) for i, (_, _, k) in enumerate(weights)}
        ours.run(None, feeds), theirs.run(None, feeds)  # warm-up (and BlockMatMul's repack)
        a, b = [], []
        for _ in range(3):
            a.append(median_ms(lambda: theirs.run(None, feeds), repeats))
            b.append(median_ms(lambda: ours.run(None, feeds), repeats))
        diff = max(float(np.abs(y - r).max() / np.abs(r).max())
                   for y, r in zip(ours.run(None, feeds), theirs.run(None, feeds)))
        print(f"{m:>5} {np.median(a):>9.2f} ms {np.median(b):>9.2f} ms {np.median(a) / np.median(b):>5.2f}x "
              f"{diff:>21.1e}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
