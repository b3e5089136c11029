"""The memory-bandwidth floor of a decode step: the weight bytes one step of a system reads (an ONNX graph, a GGUF
model, an OpenVINO IR) and this machine's read bandwidth, so that a decoding rate can be set against the time it
takes just to read the weights once.

    .venv/bin/python benchmarks/floors.py DIR/summary.json [--threads N] [--repeats 7] [--json]

DIR/summary.json is what a compare run of `trtspec bench ENGINE... --out DIR` wrote (each system's model file and
plain decode rate); the bandwidth is measured when this runs, so run it on the machine and at the load of that run.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import click
import numpy as np

BANDWIDTH_REPEATS = 7


# (op, input position) of the inputs a step reads only a few rows of: embedding tables, rotary cos / sin caches
# (com.microsoft GroupQueryAttention inputs 7-8, RotaryEmbedding inputs 2-3; ONNX Runtime docs/ContribOperators.md)
GATHERED_INPUTS = {("Gather", 0), ("GatherBlockQuantized", 0), ("GroupQueryAttention", 7),
                   ("GroupQueryAttention", 8), ("RotaryEmbedding", 2), ("RotaryEmbedding", 3)}


def onnx_weight_bytes(model_path: Path) -> dict:
    """The bytes of weights one decode step of this ONNX graph reads: every initializer (external data counted once
    per file region) consumed by a node that reads it whole, not those only gathered from (an embedding table's
    one row a token, a rotary cache's rows at the step's positions). Returns {"read": bytes, "gathered": bytes left
    out}."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    consumers: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node.op_type, position))
    regions: dict[tuple, list] = {}  # bytes → [size, read whole by some node]; a tied lm_head and embedding share
    for init in graph.initializer:
        key, size = _initializer_extent(init)
        uses = consumers.get(init.name, [])
        whole = not uses or any(use not in GATHERED_INPUTS for use in uses)
        region = regions.setdefault(key, [size, False])
        region[1] = region[1] or whole
    return {"read": sum(size for size, whole in regions.values() if whole),
            "gathered": sum(size for size, whole in regions.values() if not whole)}


def _initializer_extent(init) -> tuple[tuple, int]:
    """(a key naming the bytes, their count): external data by (file, offset), in-graph data by the tensor name."""
    import onnx

    if init.data_location == onnx.TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in init.external_data}
        size = int(info["length"]) if "length" in info else _tensor_size(init)
        return ("external", info.get("location"), int(info.get("offset", 0))), size
    return ("raw", init.name), len(init.raw_data) if init.raw_data else _tensor_size(init)


def _tensor_size(init) -> int:
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
    return int(np.prod(init.dims, dtype=np.int64)) * np.dtype(dtype).itemsize


def gguf_weight_bytes(gguf: Path) -> dict:
    """The tensor bytes of a GGUF model a decode step reads: all, less `token_embd` when an `output` matrix (an
    untied lm_head) exists, since the embedding is only gathered from."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    gathered = tensors.get("token_embd.weight", 0) if "output.weight" in tensors else 0
    return {"read": sum(tensors.values()) - gathered, "gathered": gathered}


# OpenVINO IR ops that a compressed weight passes through on its way to the op that uses it (nncf's decompression:
# Convert, Subtract of the zero point, Multiply by the scale, Reshape of the groups)
OPENVINO_DECOMPRESSION = {"Convert", "Subtract", "Multiply", "Reshape", "Unsqueeze", "Squeeze", "Transpose"}


def openvino_weight_bytes(xml: Path) -> dict:
    """The bytes of weights one decode step of an OpenVINO IR reads: every constant's bytes in the .bin (each region
    counted once), less those only gathered from (an untied embedding table: constants whose every use, through
    their decompression ops, is a Gather's data input). Returns {"read": bytes, "gathered": bytes left out}."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(xml).getroot()
    kinds = {layer.get("id"): layer.get("type") for layer in root.iter("layer")}
    consumers: dict[str, list[tuple[str, str]]] = {}
    for edge in root.iter("edge"):
        consumers.setdefault(edge.get("from-layer"), []).append((edge.get("to-layer"), edge.get("to-port")))
    first_input = {layer.get("id"): layer.find("input")[0].get("id") for layer in root.iter("layer")
                   if layer.find("input") is not None and len(layer.find("input"))}

    @functools.cache
    def gathered_only(layer: str) -> bool:
        uses = consumers.get(layer, [])
        for to, port in uses:
            if kinds[to] in OPENVINO_DECOMPRESSION:
                if not gathered_only(to):
                    return False
            elif not (kinds[to] == "Gather" and port == first_input.get(to)):  # a Gather's data input
                return False
        return bool(uses)

    regions: dict[tuple[int, int], bool] = {}  # (offset, size) → read whole by some op
    for layer in root.iter("layer"):
        data = layer.find("data")
        if layer.get("type") != "Const" or data is None or data.get("size") is None:
            continue
        key = (int(data.get("offset")), int(data.get("size")))
        regions[key] = regions.get(key, False) or not gathered_only(layer.get("id"))
    return {"read": sum(size for (_, size), whole in regions.items() if whole),
            "gathered": sum(size for (_, size), whole in regions.items() if not whole)}


def bandwidth_floor(weight_bytes: int, gbps: float, decode_tps: float) -> dict:
    """Time per token at `decode_tps` ÷ the time to read `weight_bytes` once at `gbps`."""
    floor_ms = 1000 * weight_bytes / (gbps * 1e9)
    decode_ms = 1000 / decode_tps
    return {"weight_bytes": weight_bytes, "floor_ms": round(floor_ms, 6), "decode_ms": round(decode_ms, 6),
            "ratio": round(decode_ms / floor_ms, 3)}


def read_bandwidth(*, threads: int = 2, megabytes: int = 1024, repeats: int = BANDWIDTH_REPEATS) -> dict:
    """Best-of-`repeats` read bandwidth (GB/s) over a float32 buffer: numpy summing one slice per thread (the
    ufunc releases the GIL) and an ONNX Runtime ReduceSum with `threads` intra-op threads (ORT 1.32 reduces a
    whole tensor on one thread). The floor uses the faster of the two."""
    buf = np.ones(megabytes * 2**20 // 4, np.float32)  # written once: every page is resident
    numpy_s = _best_time(_numpy_sum(buf, threads), repeats)
    ort_s = _best_time(_ort_sum(buf, threads), repeats)
    rates = {"numpy": buf.nbytes / numpy_s / 1e9, "onnxruntime": buf.nbytes / ort_s / 1e9}
    best = max(rates, key=rates.get)
    return {"buffer_mb": megabytes, "threads": threads, "numpy_gbps": rates["numpy"],
            "onnxruntime_gbps": rates["onnxruntime"], "gbps": rates[best], "method": best}


def _best_time(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _numpy_sum(buf: np.ndarray, threads: int):
    from concurrent.futures import ThreadPoolExecutor

    pool, parts = ThreadPoolExecutor(threads), np.array_split(buf, threads)
    return lambda: sum(pool.map(np.sum, parts))


def _ort_sum(buf: np.ndarray, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "bandwidth", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(buf))  # no copy
    binding.bind_output("y", "cpu")
    return lambda: session.run_with_iobinding(binding)


# ---- a compare run's systems --------------------------------------------------------------------------------

def weight_bytes(kind: str, model: str | None) -> dict:
    """What one decode step of a system of `kind` (an engine or a peer, summary.json's `kind`) reads of its model."""
    if model is None or kind == "transformers":  # torch's own graph: not weighed
        return {"read": None, "gathered": None}
    if kind == "llama.cpp":
        return gguf_weight_bytes(Path(model))
    if kind == "openvino":
        return openvino_weight_bytes(Path(model))
    return onnx_weight_bytes(Path(model))


def floors(report: dict, bandwidth: dict) -> dict[str, dict]:
    """Per system of a compare report: its weight bytes and, where it was weighed, its floor against its plain decode
    rate over all sets."""
    out = {}
    for label, entry in report["systems"].items():
        weights = weight_bytes(entry["kind"], entry.get("model"))
        decode_tps = entry["plain"]["all"]["decode_tokens_per_s"]
        floor = bandwidth_floor(weights["read"], bandwidth["gbps"], decode_tps) if weights["read"] and decode_tps \
            else None
        out[label] = {"format": entry["format"], "decode_tokens_per_s": decode_tps, "weights": weights,
                      "floor": floor}
    return out


def render(systems: dict[str, dict], bandwidth: dict) -> list[str]:
    num = lambda value, digits=1: "-" if value is None else f"{value:.{digits}f}"  # noqa: E731
    w = max(16, *(len(label) + 2 for label in systems))
    lines = [f"{'system':<{w}}{'format':<28}{'decode':>8}{'MB/token':>10}{'floor ms':>9}{'÷ floor':>8}"]
    for label, s in systems.items():
        floor, read = s["floor"], s["weights"]["read"]
        lines.append(f"{label:<{w}}{s['format'][:27]:<28}{num(s['decode_tokens_per_s']):>8}"
                     f"{num(read and read / 1e6):>10}{num(floor and floor['floor_ms'], 2):>9}"
                     f"{num(floor and floor['ratio'], 2):>7}×")
    lines.append(f"floor = weight bytes a plain step reads ÷ {bandwidth['gbps']:.1f} GB/s read bandwidth "
                 f"({bandwidth['method']}, {bandwidth['threads']} threads, best of the repeats); decode: tokens/s "
                 "after the first token")
    return lines


@click.command()
@click.argument("summary", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--threads", type=click.IntRange(min=1), help="Threads reading the buffer (default: the run's).")
@click.option("--repeats", type=click.IntRange(min=1), default=BANDWIDTH_REPEATS, show_default=True,
              help="Timed reads of the buffer; the best counts.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def main(summary: Path, threads: int | None, repeats: int, as_json: bool) -> None:
    """Every system of a `trtspec bench` compare run (its summary.json): the weight bytes a plain decode step reads,
    the time to read them once at this machine's bandwidth, and the run's decode time per token ÷ that floor."""
    report = json.loads(summary.read_text())
    if "systems" not in report or "settings" not in report:
        sys.exit(f"error: {summary} is not the summary.json of a compare run of `trtspec bench`")
    bandwidth = read_bandwidth(threads=threads or report["settings"]["threads"], repeats=repeats)
    systems = floors(report, bandwidth)
    click.echo(json.dumps({"bandwidth": bandwidth, "systems": systems}, indent=2) if as_json
               else "\n".join(render(systems, bandwidth)))


if __name__ == "__main__":
    main()
