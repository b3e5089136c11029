"""Training-free (and trained) drafting on real prompt sets, measured side by side in one run.

For every prompt of every set, each method and plain decoding run on the same engine one after the other, the order
rotating from prompt to prompt; several engines and the peers' own prompt lookup in the same run. What is reported
and how to read it: docs/measuring.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.bench.peers import OPENVINO_LOOKUP_SETTINGS
from trtspec.errors import ConfigError
from trtspec.speculative.stats import SpecStats

DEFAULT_SETS = ("sharegpt-grounded", "code-edit", "mt-bench-2turn", "mt-bench")
WARMUP_TOKENS = 8


@dataclass
class Cell:
    """One method on one set: sums over its prompts."""

    stats: SpecStats = field(default_factory=SpecStats)
    tokens: int = 0
    spec_s: float = 0.0
    plain_s: float = 0.0
    spec_decode_s: float = 0.0
    plain_decode_s: float = 0.0
    identical: int = 0
    compared: int = 0  # outputs compared with plain decoding of their own engine
    prompts: int = 0

    def add(self, spec, plain, own_plain=None) -> None:
        """One prompt: `spec` timed against `plain` (the first engine's plain decoding) and compared token by token
        with `own_plain`, plain decoding of its own engine (None: not run, nothing compared)."""
        self.stats = self.stats.merge(spec.stats)
        self.tokens += len(spec.output_ids)
        self.spec_s += spec.total_s
        self.plain_s += plain.total_s
        self.spec_decode_s += spec.total_s - spec.ttft_s
        self.plain_decode_s += plain.total_s - plain.ttft_s
        if own_plain is not None:
            self.identical += spec.output_ids == own_plain.output_ids
            self.compared += 1
        self.prompts += 1

    def to_dict(self) -> dict:
        s = self.stats
        identical = f"{self.identical}/{self.compared}" if self.compared else "n/a"
        return {"prompts": self.prompts, "tokens": self.tokens, "identical": identical,
                "tau": round(s.acceptance_length, 3), "acceptance_rate": round(s.acceptance_rate, 3),
                "tokens_per_s": round(self.tokens / self.spec_s, 2), "plain_tokens_per_s": round(self.tokens / self.plain_s, 2),
                "speedup": round(self.plain_s / self.spec_s, 3),
                "decode_speedup": round(self.plain_decode_s / self.spec_decode_s, 3),
                "draft_ms_per_step": round(1000 * s.draft_s / s.steps, 3) if s.steps else 0.0,
                "draft_share": round(s.draft_s / self.spec_decode_s, 4) if self.spec_decode_s else 0.0,
                "steps_per_profile": {str(k): v for k, v in sorted(s.profile_steps.items())}}


def set_prompts(generator, name: str, limit: int, max_tokens: int) -> list[tuple[str, list[int]]]:
    """(id, token ids) of a set's measured prompts; mt-bench-2turn's second turns carry the engine's first answer."""
    from trtspec.bench.workload import load_bench_prompts

    prompts = load_bench_prompts(name, limit=limit, generator=generator, max_tokens=max_tokens,
                                 show=lambda line: None)
    return [(p.id, list(p.ids)) for p in prompts]


def run_benchmark(engines: list[Path], *, peers: tuple[str, ...] = (), hf: Path | None = None, peer_limit: int = 3,
                  prompt_lookup: int = 10, genai_lookup: tuple[int, int] = (3, 4),
                  openvino_lookup: tuple[int, int] = OPENVINO_LOOKUP_SETTINGS, work: Path | None = None,
                  show=print, **measure_options) -> dict:
    """`measure` and, on each set's first `peer_limit` measured prompts, the peers' own speculation (each checked
    installed before anything is measured)."""
    from trtspec.hub.fetch import cache_dir

    check_peers(peers)
    if min(openvino_lookup) < 1:
        raise ConfigError(f"--openvino-lookup {','.join(map(str, openvino_lookup))}: give N,K (max_ngram_size, "
                          "num_assistant_tokens), each at least 1")
    openvino_weights = engine_weights(engines[0])
    report, prompts = measure(engines, show=show, **measure_options)
    for name, ids in prompts.items():
        for peer in peers:
            report["peers"].setdefault(peer, {})[name] = peer_speculation(
                peer, ids[:peer_limit], hf=hf, max_tokens=measure_options.get("max_tokens", 128),
                threads=measure_options.get("threads", 2), work=work or cache_dir() / "bench" / "drafting",
                prompt_lookup=prompt_lookup, genai_lookup=genai_lookup, openvino_lookup=openvino_lookup,
                openvino_weights=openvino_weights)
    report["load_average"]["after"] = [round(x, 2) for x in os.getloadavg()]
    return report


def measure(engines: list[Path], *, sets=DEFAULT_SETS, methods=("ngram",), limit: int = 8, max_tokens: int = 128,
            threads: int | None = 2, spin: bool | None = None, datastore: Path | None = None,
            step_costs=None, backoff: bool = True, show=print) -> tuple[dict, dict[str, list[list[int]]]]:
    """Each method against plain decoding on the same engine, prompt by prompt, the order rotating: the report
    (per set and method, `Cell.to_dict()`'s figures) and the token ids of each set's measured prompts.
    `step_costs` (a StepCosts) replaces the engines' measured verify curve in the drafters' budgets. A method named
    `METHOD:full` runs METHOD's whole tree every step (no back-off; so does every method when `backoff` is False)."""
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.datastore import RecentOutputs

    names = [Path(e).name for e in engines]
    if len(set(names)) < len(names):
        raise ConfigError(f"engines {', '.join(map(str, engines))}: two share the same folder name, which labels "
                          "their rows; give each its own")
    load = {"before": os.getloadavg()}
    generators = [LocalGenerator(e, threads=threads, spin=spin, datastore=datastore) for e in engines]
    generator = generators[0]
    curves = {}
    for path, g in zip(engines, generators):
        if step_costs is not None:
            g.engine.use_step_costs(step_costs)
        costs = g.engine.step_costs()
        curves[str(path)] = costs.to_dict()
        show(f"verify curve ({path}): " + ", ".join(f"{p} slots {ms:.1f} ms ({c:.2f}x)" for p, ms, c in
                                                   zip(costs.profiles, costs.step_ms, costs.relative)))
    label = (lambda m, i: m) if len(generators) == 1 else (lambda m, i: f"{m}@{Path(engines[i]).name}")
    runs_of = {label(m, i): (g, m) for i, g in enumerate(generators) for m in methods}
    engine_of = {label(m, i): i for i, _ in enumerate(generators) for m in methods}
    labels = tuple(runs_of)
    report: dict = {"engine": ", ".join(map(str, engines)), "max_tokens": max_tokens,
                    "datastore": generator.datastore.describe() if generator.datastore is not None else None,
                    "threads": threads, "spin": generator.engine.spin, "verify_curve": curves, "sets": {},
                    "peers": {}}
    plain_options = GenerationConfig(max_tokens=max_tokens, no_spec=True)
    rotation, measured = 0, {}
    for name in sets:
        prompts = set_prompts(generator, name, limit, max_tokens)
        if not prompts:
            continue
        for g in generators:
            g.generate(prompts[0][1], GenerationConfig(max_tokens=WARMUP_TOKENS, no_spec=True))
        # methods that learn from recent outputs (suffix, hybrid) each keep their own, so that one never drafts from
        # another's answer to the same prompt, and forget them between sets (the same questions, for MT-Bench)
        recent = {m: RecentOutputs() for m in labels}
        cells = {m: Cell() for m in labels}
        for prompt_id, ids in prompts:
            runs = ["none", *labels]
            rotation += 1
            runs = runs[rotation % len(runs):] + runs[:rotation % len(runs)]
            results = {}
            for m in runs:
                if m == "none":
                    results[m] = generator.generate(ids, plain_options).result
                    continue
                g, method = runs_of[m]
                g.recent = recent[m]
                method, _, whole = method.partition(":")
                config = GenerationConfig(max_tokens=max_tokens, method=method, backoff=backoff and whole != "full")
                results[m] = g.generate(ids, config).result
            for m in labels:  # outputs compared with their own engine's plain decoding (another's differs anyway)
                i = engine_of[m]
                cells[m].add(results[m], results["none"], results["none"] if i == 0 else results.get(label("none", i)))
            show(f"  {name} {prompt_id}: " + ", ".join(
                f"{m} τ {results[m].stats.acceptance_length:.2f} {results['none'].total_s / results[m].total_s:.2f}x"
                for m in labels))
        report["sets"][name] = {m: c.to_dict() for m, c in cells.items()}
        report["sets"][name]["prompt_ids"] = [p for p, _ in prompts]
        measured[name] = [ids for _, ids in prompts]
    load["after"] = os.getloadavg()
    report["load_average"] = {k: [round(x, 2) for x in v] for k, v in load.items()}
    report["acceptance_model"] = generator.acceptance.to_dict()
    return report, measured


PEERS = ("transformers", "onnxruntime-genai", "openvino")


def check_peers(peers: tuple[str, ...]) -> None:
    """Each peer known and installed, else one line naming it and what installs it."""
    from trtspec.bench.peers import (GENAI_INSTALL, GENAI_MODULES, OPENVINO_INSTALL, OPENVINO_MODULES,
                                     TRANSFORMERS_INSTALL, TRANSFORMERS_MODULES, missing_modules)

    requirements = {"transformers": (TRANSFORMERS_MODULES, TRANSFORMERS_INSTALL),
                    "onnxruntime-genai": (GENAI_MODULES, GENAI_INSTALL),
                    "openvino": (OPENVINO_MODULES, OPENVINO_INSTALL)}
    for peer in peers:
        if peer not in requirements:
            raise ConfigError(f"--peers {peer}: unknown peer (known: {', '.join(PEERS)})")
        if missing := missing_modules(requirements[peer][0]):
            raise ConfigError(f"--peers {peer}: {', '.join(missing)} not installed ({requirements[peer][1]})")


def engine_weights(engine: Path) -> str:
    """An engine's weight format, its linear layers' dtype (fp32, int8, int4): the format OpenVINO is exported at."""
    from trtspec.engine.manifest import read_manifest

    return (read_manifest(engine).weights.to_dict().get("linear") or {}).get("dtype", "fp32")


def peer_speculation(peer: str, prompts: list[list[int]], *, hf: Path, max_tokens: int, threads: int | None,
                     work: Path, prompt_lookup: int = 10, genai_lookup: tuple[int, int] = (3, 4),
                     openvino_lookup: tuple[int, int] = OPENVINO_LOOKUP_SETTINGS,
                     openvino_weights: str = "fp32") -> dict:
    """A peer's greedy decoding with and without its own speculation on the same ids, alternating per prompt, in a
    child process: transformers' prompt lookup, onnxruntime-genai's n-gram lookup (its fp32 build of the same HF
    model, made once under `work`), OpenVINO GenAI's prompt lookup (its export at `openvino_weights`, made once under
    `work`)."""
    from trtspec.bench.peers import build_genai_model, build_openvino_model, run_child

    if peer not in PEERS:
        raise ConfigError(f"--peers {peer}: unknown peer (known: {', '.join(PEERS)})")
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"{peer}-peer.log"
    common = {"prompts": prompts, "max_tokens": max_tokens, "threads": threads}
    if peer == "transformers":
        settings = {"prompt_lookup_num_tokens": prompt_lookup}
        rows = run_child("trtspec.bench.peers:run_transformers_lookup",
                         {**common, "model": str(hf), "prompt_lookup": prompt_lookup}, log=log, threads=threads)
    elif peer == "onnxruntime-genai":
        ngram_size, draft = genai_lookup
        settings = {"ngram_size": ngram_size, "max_draft_tokens": draft}
        model = build_genai_model(hf, work / "genai-fp32", log=work / "genai-build.log")
        rows = run_child("trtspec.bench.peers:run_genai_lookup", {**common, "model": str(model), **settings}, log=log,
                         threads=threads)
    else:
        ngram_size, draft = openvino_lookup
        settings = {"max_ngram_size": ngram_size, "num_assistant_tokens": draft, "weights": openvino_weights}
        model = build_openvino_model(hf, work / f"openvino-{openvino_weights}",
                                     log=work / f"openvino-{openvino_weights}-export.log", weights=openvino_weights)
        rows = run_child("trtspec.bench.peers:run_openvino_lookup_against_plain",
                         {**common, "model": str(model), "max_ngram_size": ngram_size, "num_assistant_tokens": draft},
                         log=log, threads=threads)
    plain = sum(r["plain_s"] for r in rows)
    spec = sum(r["lookup_s"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    return {"prompts": len(rows), **settings,
            "tokens_per_s": round(tokens / spec, 2), "plain_tokens_per_s": round(tokens / plain, 2),
            "speedup": round(plain / spec, 3), "identical": f"{sum(r['identical'] for r in rows)}/{len(rows)}"}


def format_report(report: dict) -> str:
    width = max([8, *(len(m) + 1 for cells in report["sets"].values() for m in cells)])
    lines = [f"engine {report['engine']}, {report['max_tokens']} tokens, {report['threads']} threads, "
             f"spin {report['spin']}, load average {report['load_average']}",
             f"{'set':<20} {'method':<{width}} {'τ':>5} {'acc':>5} {'tok/s':>7} {'plain':>7} {'speedup':>8} "
             f"{'decode':>7} {'same':>6} {'draft':>6}  steps per profile"]
    for name, cells in report["sets"].items():
        for method, c in cells.items():
            if method == "prompt_ids":
                continue
            lines.append(f"{name:<20} {method:<{width}} {c['tau']:>5.2f} {c['acceptance_rate']:>5.2f} "
                         f"{c['tokens_per_s']:>7.1f} {c['plain_tokens_per_s']:>7.1f} {c['speedup']:>7.2f}x "
                         f"{c['decode_speedup']:>6.2f}x {c['identical']:>6} {c['draft_share']:>6.1%}  "
                         f"{c['steps_per_profile']}")
        for peer, sets in report["peers"].items():
            if name in sets:
                p = sets[name]
                same, compared = p["identical"].split("/")
                differ = "" if same == compared else ", outputs differ from its own greedy decoding"
                lines.append(f"{name:<20} {peer + ' own':<{width}} {'':>5} {'':>5} {p['tokens_per_s']:>7.1f} "
                             f"{p['plain_tokens_per_s']:>7.1f} {p['speedup']:>7.2f}x {'':>7} {p['identical']:>6}  "
                             f"({p['prompts']} prompts{differ})")
    return "\n".join(lines)
