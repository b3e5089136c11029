"""Requests mode of `trtspec bench`: plain decoding and every method on one engine (in process or served) over a
prompt set, at each concurrency, in the loop compare mode shares: a warm-up per method, then at concurrency 1 every
method on a prompt before the next, the order `rotated` per prompt; at C, the set as one group per method.

Serving mode (ENGINE with --serve, or with --url of its server): each group also runs served, back to back with in
process, for the served ÷ in-process ratio (target ≥ 0.9 at concurrency 1), identical outputs and the engine's
batching per step.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtspec.bench.metrics import engine_batching, read_counters
from trtspec.bench.peers import WARMUP_TOKENS, rotated
from trtspec.bench.summary import RequestRecord, mark_identical, ratio, record, summarize, summarize_open_loop
from trtspec.bench.workload import (BenchPrompt, LocalTarget, ServedTarget, load_bench_prompts, method_configs,
                                    method_memory, spreads, use_memory)
from trtspec.errors import ConfigError
from trtspec.progress import progress_bar
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.method import PLAIN, Method
from trtspec.speculative.sampling import SamplingParams

SERVING_TARGET = 0.9  # served ÷ in-process tokens/s at concurrency 1 (the serving overhead's target)
LEARNING_METHODS = {Method.SUFFIX.value, Method.HYBRID.value}  # drafters that look up earlier outputs


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    engine: Path | None = None  # in process, or
    url: str | None = None  # HOST:PORT of a served ensemble's gRPC endpoint
    prompt_set: str = "mt-bench"  # a known set or a .jsonl file
    limit: int | None = 8
    methods: tuple[str, ...] = ()  # besides plain decoding; () = the engine's own (served: the deployment's)
    concurrency: tuple[int, ...] = (1,)  # closed-loop levels; () with request_rate: open loop only
    request_rate: tuple[float, ...] = ()  # open-loop levels: Poisson arrivals per second (served only)
    goodput: dict[str, float] = field(default_factory=dict)  # SLOs in ms a request must meet to count as good
    draft_budget: int | None = None  # in process: the training-free drafters' tokens per step (None: the engine's K)
    temperature: float = 0.0
    seed: int | None = 0  # T > 0: every request's sampling seed (methods alike)
    max_tokens: int = 128
    threads: int | None = 2
    spin: bool | None = None
    model: str = "ensemble"
    serve: bool = False  # serving mode: deploy ENGINE, serve it here and measure it beside in process
    no_spec: bool = False  # plain decoding alone (no method beside it)
    backoff: bool = True  # Medusa / EAGLE / lookahead drafts shrink or rest while they do not pay (False: whole trees)
    show_progress: bool = True

    def __post_init__(self):
        if self.engine is None and self.url is None:
            raise ConfigError("pass ENGINE_DIR or --url HOST:PORT (or both: ENGINE in process beside the server)")
        if not self.backoff and self.url is not None:
            raise ConfigError("--no-backoff applies to ENGINE in process (a server's deployment decides: "
                              "`trtspec deploy --no-backoff`)")
        if self.serve and (self.engine is None or self.url is not None):
            raise ConfigError("--serve deploys and serves ENGINE_DIR itself: pass ENGINE_DIR and no --url")
        if (not self.concurrency and not self.request_rate) or (self.concurrency and min(self.concurrency) < 1):
            raise ConfigError(f"--concurrency must be positive integers, got {self.concurrency}")
        if self.request_rate and (self.url is None or self.engine is not None or self.serve):
            raise ConfigError("--request-rate sends requests as they arrive to a served deployment: pass --url "
                              "HOST:PORT alone (in process, the load is --concurrency)")
        if any(not r > 0 for r in self.request_rate):
            raise ConfigError(f"--request-rate must be positive requests per second, got {self.request_rate}")
        if self.draft_budget is not None and self.engine is None:
            raise ConfigError("--draft-budget applies to ENGINE in process (a server's is set at deploy: "
                              "`trtspec deploy --draft-budget N`)")
        if self.goodput and not self.request_rate:
            raise ConfigError("--goodput counts the requests that meet its SLOs at each --request-rate: pass "
                              "--request-rate too")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.no_spec and self.methods:
            raise ConfigError("--no-spec measures plain decoding alone: leave --method out")
        if PLAIN in self.methods:
            raise ConfigError("--method none: plain decoding always runs beside the methods; name drafters only")


@dataclass
class BenchRun:
    report: dict
    records: list[RequestRecord] = field(default_factory=list)  # serving mode: in process and served ones


def serving_mode(options: BenchOptions) -> bool:
    """The engine measured in process and served, side by side."""
    return options.engine is not None and (options.url is not None or options.serve)


def open_target(options: BenchOptions):
    if options.url is not None:
        return ServedTarget(options.url, model=options.model)
    return LocalTarget(_local_generator(options))


def run_bench(options: BenchOptions, show=print, target=None) -> BenchRun:
    """Measure (module docstring); `target` may be one already opened (`open_target`)."""
    with ExitStack() as stack:
        served = metrics = None
        if serving_mode(options):
            target = target or LocalTarget(_local_generator(options))
            url = options.url
            if url is None:
                server = stack.enter_context(_started_server(options, target, show))
                url, metrics = server.grpc_url, server
            served = ServedTarget(url, model=options.model)
        return _run(options, target or open_target(options), served, metrics, show)


def _local_generator(options: BenchOptions):
    from trtspec.runtime.generator import LocalGenerator

    return LocalGenerator(options.engine, threads=options.threads, spin=options.spin, draft_budget=options.draft_budget)


@contextmanager
def _started_server(options: BenchOptions, local, show):
    """ENGINE deployed into a temporary repository (threads and spinning as in process), served on loopback."""
    import tempfile

    from trtspec.triton.deploy import deploy
    from trtspec.triton.deploy_options import DeployOptions
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    engine = local.generator.engine
    with tempfile.TemporaryDirectory(prefix="trtspec-bench-serve-") as tmp:
        repo = deploy(DeployOptions(engine_dir=options.engine, out=Path(tmp) / "repo", threads=engine.threads,
                                    spin=engine.spin, backoff=options.backoff, draft_budget=options.draft_budget))
        server = TritonServer(ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                            metrics_port=free_port(), exit_timeout_s=5), on_log=lambda line: None)
        with server:
            show(f"  serving {options.engine} at {server.grpc_url}")
            yield server


def _run(options: BenchOptions, target, served, metrics, show) -> BenchRun:
    load_before = os.getloadavg()
    local = isinstance(target, LocalTarget)
    generator = target.generator if local else None
    prompts = load_bench_prompts(options.prompt_set, limit=options.limit, max_tokens=options.max_tokens,
                                 generator=generator, show=show)
    if not prompts:
        raise ConfigError(f"--prompt-set {options.prompt_set}: no prompt to measure (--limit {options.limit})")
    methods = options.methods or ((target.own_method,) if local else ("spec",))
    if options.no_spec:
        methods = ()
    elif local and target.own_method == PLAIN and not options.methods:
        if served is None:
            raise ConfigError(f"engine {options.engine} has no drafter of its own; name one with --method ngram (an "
                              "engine built with --max-draft-len K >= 1 runs ngram and suffix)")
        methods = ()  # serving mode: plain decoding alone, in process and served
    base = GenerationConfig(max_tokens=options.max_tokens, backoff=options.backoff,
                            sampling=SamplingParams(temperature=options.temperature, seed=options.seed))
    runs = method_configs(base, methods)
    targets = {"in-process" if local else "served": target, **({"served": served} if served else {})}
    memory = method_memory(runs) if local else {}
    for label, opts in runs.items():  # warm-up: sessions, bindings, the drafters' first lookups
        use_memory(generator, memory, label)
        for t in targets.values():
            t.run(prompts[:1], replace(opts, max_tokens=WARMUP_TOKENS), 1)
    records = []
    walls = {(name, c, label): 0.0 for name in targets for c in options.concurrency for label in runs}
    batching = {}
    total = len(prompts) * len(runs) * len(options.concurrency) * len(targets)
    with progress_bar("bench", total=total, enabled=options.show_progress) as advance:
        for c_index, concurrency in enumerate(options.concurrency):
            # each level forgets what the drafters learnt at the last (suffix: its answers to these very prompts)
            memory = method_memory(runs) if local else {}
            groups = [[p] for p in prompts] if concurrency == 1 else [prompts]
            before = _counters(metrics)
            for g_index, group in enumerate(groups):
                for label in rotated(runs, c_index + g_index):
                    use_memory(generator, memory, label)
                    for name in rotated(targets, g_index):
                        timed, wall = targets[name].run(group, runs[label], concurrency)
                        walls[(name, concurrency, label)] += wall
                        records += [record(concurrency, label, p, t, target=name) for p, t in zip(group, timed)]
                        advance(len(group))
            if metrics is not None:
                batching[str(concurrency)] = engine_batching(before, _counters(metrics))
    open_records, open_walls = _open_loop(options, target, prompts, runs)
    records += open_records
    for name in targets if options.temperature == 0 else ():  # sampled outputs: `identical` stays None
        mark_identical([r for r in records if r.target == name])

    def results(name: str) -> dict:  # one target's figures per concurrency
        return {str(c): v for c, v in summarize([r for r in records if r.target == name],
                                                {k[1:]: v for k, v in walls.items() if k[0] == name}).items()}

    report = _report(options, target, prompts, methods, results(next(iter(targets))), load_before)
    if options.request_rate:
        report["open_loop"] = {"slos_ms": dict(options.goodput), "results": {
            f"{rate:g}": v for rate, v in summarize_open_loop(open_records, open_walls, options.goodput).items()}}
    if served is not None:
        report["served"] = {"target": served.describe(), "results": results("served")}
        report["serving"] = _serving(report, records, options.temperature, batching)
    return BenchRun(report, records)


def _open_loop(options: BenchOptions, target, prompts: list[BenchPrompt], runs: dict) -> tuple[list, dict]:
    """Every method at every --request-rate, the same arrivals for each at a rate, the methods' order rotating."""
    records, walls = [], {}
    for r_index, rate in enumerate(options.request_rate):
        for label in rotated(runs, r_index):
            timed, walls[(rate, label)] = target.run_open(prompts, runs[label], rate, seed=r_index)
            records += [record(0, label, p, t, target="served", request_rate=rate) for p, t in zip(prompts, timed)]
    return records, walls


def _counters(metrics) -> dict | None:
    return None if metrics is None else read_counters(metrics.metrics_url, publish_via=metrics.grpc_url)


def _serving(report: dict, records: list[RequestRecord], temperature: float, batching: dict) -> dict:
    """Per concurrency and method: served ÷ in-process tokens/s and TTFT p50, outputs identical to in-process."""
    local = {(r.concurrency, r.method, r.prompt_id): r.output_ids for r in records if r.target == "in-process"}
    out = {}
    for c, methods in report["served"]["results"].items():
        level = out.setdefault(c, {"methods": {}, "engine_batching": batching.get(c)})
        for method, figures in methods.items():
            mine, theirs = report["results"][c][method]["overall"], figures["overall"]
            same = [r.output_ids == local.get((r.concurrency, r.method, r.prompt_id))
                    for r in records if r.target == "served" and str(r.concurrency) == c and r.method == method]
            level["methods"][method] = {
                "in_process_tok_s": mine["output_tokens_per_s"], "served_tok_s": theirs["output_tokens_per_s"],
                "ratio": ratio(theirs["output_tokens_per_s"], mine["output_tokens_per_s"]),
                "in_process_ttft_ms_p50": (mine["ttft_ms"] or {}).get("p50"),
                "served_ttft_ms_p50": (theirs["ttft_ms"] or {}).get("p50"),
                "outputs_identical": f"{sum(same)}/{len(same)}" if temperature == 0 else None}
    return {**out, "target": SERVING_TARGET}


def _report(options: BenchOptions, target, prompts: list[BenchPrompt], methods, results: dict, load_before) -> dict:
    from trtspec.data.prompts import PROMPT_SETS

    source = PROMPT_SETS.get(options.prompt_set)
    local = isinstance(target, LocalTarget)
    report = {
        "target": target.describe(),
        "mode": ("in-process and served" if serving_mode(options) else "in-process") if local else "served",
        "prompt_set": options.prompt_set,
        "split": "measure" if source is not None and source.measure_size else None,
        "spread": spreads(options.prompt_set),  # the first --limit taken across the set's categories
        "prompts": len(prompts), "prompt_ids": [p.id for p in prompts],
        "categories": list(dict.fromkeys(p.category for p in prompts)),
        "methods": [PLAIN, *methods], "concurrency": list(options.concurrency),
        "request_rate": list(options.request_rate),
        "temperature": options.temperature, "seed": options.seed if options.temperature > 0 else None,
        "max_tokens": options.max_tokens,
        "threads": options.threads if local else None,
        "results": results,
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": [],
    }
    if (not local or serving_mode(options)) and (set(methods) & LEARNING_METHODS or "spec" in methods):
        report["notes"].append("served: the deployment's drafters learn across requests (suffix's recent outputs "
                               "hold every earlier answer, to these same prompts at earlier methods and levels): "
                               "their τ past the first pass is what a server answering repeated prompts gets")
    if local:
        report["spin"] = target.generator.engine.spin
        report["verify_curve"] = target.generator.engine.step_costs().to_dict()
    return report
