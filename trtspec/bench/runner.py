"""One `trtspec bench` run: plain decoding and every method asked for, on the same engine (in process or served),
over a prompt set's measured prompts, at each concurrency, interleaved so that the machine's drift hits all alike.

At concurrency 1 the prompts go one at a time, every method on a prompt before the next prompt, the order rotating
from prompt to prompt; at concurrency C the whole set runs as one closed-loop group per method (`workload`), the
methods' order rotating between concurrencies. A short warm-up request per method comes first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtspec.bench.summary import PLAIN, RequestRecord, mark_identical, record, summarize
from trtspec.bench.workload import BenchPrompt, LocalTarget, ServedTarget, load_bench_prompts
from trtspec.errors import ConfigError
from trtspec.progress import progress_bar
from trtspec.runtime.loop import GenerationConfig
from trtspec.speculative.sampling import SamplingParams

WARMUP_TOKENS = 8
LEARNING_METHODS = {"suffix", "hybrid"}  # drafters that look up earlier outputs


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    engine: Path | None = None  # in process, or
    url: str | None = None  # HOST:PORT of a served ensemble's gRPC endpoint
    prompt_set: str = "mt-bench"  # a known set or a .jsonl file
    limit: int | None = 8
    methods: tuple[str, ...] = ()  # besides plain decoding; () = the engine's own (served: the deployment's)
    concurrency: tuple[int, ...] = (1,)
    temperature: float = 0.0
    seed: int | None = 0  # T > 0: every request's sampling seed (methods alike)
    max_tokens: int = 128
    threads: int | None = 2
    spin: bool | None = None
    model: str = "ensemble"
    peers: tuple[str, ...] = ()  # in process: peers' own speculation on the same ids (`drafting.PEERS`)
    hf: Path | None = None  # the engine's Hugging Face model folder, for the peers
    peer_limit: int = 3  # prompts the peers decode (slow)
    work: Path | None = None  # the peers' logs and builds (default: the cache's bench/peers)
    show_progress: bool = True

    def __post_init__(self):
        if (self.engine is None) == (self.url is None):
            raise ConfigError("pass ENGINE_DIR or --url HOST:PORT (one of them)")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"--concurrency must be positive integers, got {self.concurrency}")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.peers and (self.hf is None or self.engine is None):
            raise ConfigError("--peers needs ENGINE_DIR and --hf DIR (the engine's Hugging Face model folder)")
        if PLAIN in self.methods:
            raise ConfigError("--method none: plain decoding always runs beside the methods; name drafters only")


@dataclass
class BenchRun:
    report: dict
    records: list[RequestRecord] = field(default_factory=list)


def open_target(options: BenchOptions):
    if options.url is not None:
        return ServedTarget(options.url, model=options.model)
    from trtspec.runtime.generator import LocalGenerator

    return LocalTarget(LocalGenerator(options.engine, threads=options.threads, spin=options.spin))


def run_bench(options: BenchOptions, show=print, target=None) -> BenchRun:
    """Measure (module docstring); `target` may be one already opened (`open_target`)."""
    load_before = os.getloadavg()
    target = target or open_target(options)
    local = isinstance(target, LocalTarget)
    prompts = load_bench_prompts(options.prompt_set, limit=options.limit, max_tokens=options.max_tokens,
                                 generator=target.generator if local else None, show=show)
    if not prompts:
        raise ConfigError(f"--prompt-set {options.prompt_set}: no prompt to measure (--limit {options.limit})")
    methods = options.methods or ((target.own_method,) if local else ("spec",))
    if local and target.own_method == PLAIN and not options.methods:
        raise ConfigError(f"engine {options.engine} has no drafter of its own; name one with --method ngram (an "
                          "engine built with --max-draft-len K >= 1 runs ngram and suffix)")
    base = GenerationConfig(max_tokens=options.max_tokens,
                            sampling=SamplingParams(temperature=options.temperature, seed=options.seed))
    runs = {PLAIN: replace(base, no_spec=True),
            **{m: replace(base, method=None if m == "spec" else m) for m in methods}}
    recents = _own_recent_outputs(target, runs)
    for label, opts in runs.items():  # warm-up: sessions, bindings, the drafters' first lookups
        _use_recent(target, recents, label)
        target.run(prompts[:1], replace(opts, max_tokens=WARMUP_TOKENS), 1)
    records, walls = [], {(c, label): 0.0 for c in options.concurrency for label in runs}
    total = len(prompts) * len(runs) * len(options.concurrency)
    with progress_bar("bench", total=total, enabled=options.show_progress) as advance:
        for c_index, concurrency in enumerate(options.concurrency):
            # each level a fresh pass over the same prompts: what the drafters learnt at the last level (suffix: its
            # answers to these very prompts) is forgotten
            recents = _own_recent_outputs(target, runs)
            groups = [[p] for p in prompts] if concurrency == 1 else [prompts]
            for g_index, group in enumerate(groups):
                order = _rotated(list(runs), c_index + g_index)
                for label in order:
                    _use_recent(target, recents, label)
                    timed, wall = target.run(group, runs[label], concurrency)
                    walls[(concurrency, label)] += wall
                    records += [record(concurrency, label, p, t) for p, t in zip(group, timed)]
                    advance(len(group))
    mark_identical(records)
    if options.temperature > 0:
        for r in records:
            r.identical = None
    report = _report(options, target, prompts, methods, records, walls, load_before)
    report["peers"] = {peer: _peer(options, peer, prompts) for peer in options.peers}
    return BenchRun(report, records)


def _peer(options: BenchOptions, peer: str, prompts: list[BenchPrompt]) -> dict:
    """A peer's own speculation against its own plain decoding on the first --peer-limit prompts' ids."""
    from trtspec.bench.drafting import peer_speculation
    from trtspec.hub.fetch import cache_dir

    return peer_speculation(peer, [list(p.ids) for p in prompts[:options.peer_limit]], hf=options.hf,
                            max_tokens=options.max_tokens, threads=options.threads,
                            work=options.work or cache_dir() / "bench" / "peers")


def _rotated(items: list, n: int) -> list:
    n %= len(items)
    return items[n:] + items[:n]


def _own_recent_outputs(target, runs: dict) -> dict:
    """In process, every method its own recent outputs (method suffix learns from them: never another method's
    answer to the same prompt) and its own acceptance model (ngram / suffix learn how much to draft)."""
    if not isinstance(target, LocalTarget):
        return {}
    from trtspec.speculative.datastore import RecentOutputs
    from trtspec.speculative.ngram_proposer import AcceptanceModel

    return {label: (RecentOutputs(), AcceptanceModel()) for label in runs}


def _use_recent(target, recents: dict, label: str) -> None:
    if recents:
        target.generator.recent, target.generator.acceptance = recents[label]


def _report(options: BenchOptions, target, prompts: list[BenchPrompt], methods, records, walls,
            load_before) -> dict:
    from trtspec.data.prompts import PROMPT_SETS

    source = PROMPT_SETS.get(options.prompt_set)
    report = {
        "target": target.describe(), "mode": "in-process" if isinstance(target, LocalTarget) else "served",
        "prompt_set": options.prompt_set,
        "split": "measure" if source is not None and source.measure_size else None,
        "prompts": len(prompts), "prompt_ids": [p.id for p in prompts],
        "categories": list(dict.fromkeys(p.category for p in prompts)),
        "methods": [PLAIN, *methods], "concurrency": list(options.concurrency),
        "temperature": options.temperature, "seed": options.seed if options.temperature > 0 else None,
        "max_tokens": options.max_tokens,
        "threads": options.threads if isinstance(target, LocalTarget) else None,
        "results": {str(c): v for c, v in summarize(records, walls).items()},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }
    report["notes"] = []
    if not isinstance(target, LocalTarget) and (set(methods) & LEARNING_METHODS or "spec" in methods):
        report["notes"].append("served: the deployment's drafters learn across requests (suffix's recent outputs "
                               "hold every earlier answer, to these same prompts at earlier methods and levels): "
                               "their τ past the first pass is what a server answering repeated prompts gets")
    if isinstance(target, LocalTarget):
        report["spin"] = target.generator.engine.spin
        report["verify_curve"] = target.generator.engine.step_costs().to_dict()
    return report
