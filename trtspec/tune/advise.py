"""`trtspec advise`: should this engine speculate on this traffic, and how? A go / no-go from a short measured run.

It runs `trtspec bench` at concurrency 1 and at the traffic's concurrency and temperature, reads the engine's verify
curve, and gives the verdict with its measured reasons (acceptance, output length, temperature, concurrency,
drafting overhead, TTFT): GO when the best method's tokens/s beats plain decoding's by GO_MARGIN and its τ reaches
GO_TAU. Each reason: docs/tuning.md, "How advise decides".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.bench.runner import BenchOptions, open_target, run_bench
from trtspec.errors import ConfigError
from trtspec.speculative.method import PLAIN, Method

GO_MARGIN = 1.05  # speedups within 5% of plain decoding are noise on a shared machine, and cost a drafter to run
GO_TAU = 1.1  # tokens per step: below it the drafts hardly ever land
SHORT_REPLY = 32  # tokens: below this a reply is mostly its first token's latency


@dataclass(frozen=True, kw_only=True)
class AdviseOptions:
    engine: Path
    prompt_set: str = "mt-bench"
    temperature: float = 0.0
    concurrency: int = 1
    methods: tuple[str, ...] = ()  # candidates (default: the engine's own, and ngram / suffix where K >= 1)
    limit: int = 4
    max_tokens: int = 128
    threads: int | None = 2
    spin: bool | None = None
    show_progress: bool = True

    def __post_init__(self):
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")


def candidate_methods(manifest) -> tuple[str, ...]:
    """The engine's own drafter (if any), then the training-free methods it runs."""
    own = manifest.method.value
    runnable = manifest.runnable_methods()
    return tuple(m for m in (own, Method.NGRAM.value, Method.SUFFIX.value) if m != PLAIN and m in runnable)


def run_advise(options: AdviseOptions, show=print) -> dict:
    """Measure (module docstring) and decide."""
    bench_options = BenchOptions(engine=options.engine, prompt_set=options.prompt_set, limit=options.limit,
                                 concurrency=tuple(sorted({1, options.concurrency})),
                                 temperature=options.temperature, max_tokens=options.max_tokens,
                                 threads=options.threads, spin=options.spin, show_progress=options.show_progress)
    target = open_target(bench_options)
    methods = options.methods or candidate_methods(target.generator.manifest)
    if not methods:
        raise ConfigError(f"engine {options.engine} has no drafter and K = 0: nothing to speculate with; rebuild with "
                          "--max-draft-len K >= 1 for ngram / suffix")
    run = run_bench(replace(bench_options, methods=methods), show=show, target=target)
    return decide(run.report, options.concurrency, _context_curve(target.generator, run.records, options))


def _context_curve(generator, records, options: AdviseOptions):
    """The verify curve (one sequence and the batch) after as many tokens as the measured requests' median context
    (prompt + half the reply): a longer past flattens it, so the cached 256-token curve would overstate it."""
    import numpy as np

    from trtspec.tune.tuner import CURVE_ROUNDS
    from trtspec.runtime.verify_curve import measure

    past = int(np.median([r.input_tokens + r.output_tokens // 2 for r in records]))
    return measure(generator.engine, rounds=CURVE_ROUNDS, past=past)


def decide(report: dict, concurrency: int, costs) -> dict:
    """The verdict and its reasons from a bench report and the engine's verify curve."""
    at_c = report["results"][str(concurrency)]
    plain = at_c["none"]["overall"]
    drafters = {m: f["overall"] for m, f in at_c.items() if m != "none"}
    best_name = max(drafters, key=lambda m: drafters[m]["output_tokens_per_s"])
    best = drafters[best_name]
    go = (best["speedup"] or 0) >= GO_MARGIN and best["tau"] >= GO_TAU
    slots = _usual_profile(best)
    reply = best["output_tokens"] / best["requests"]
    reasons = [
        _reason("acceptance", f"{best_name}: τ {best['tau']:.2f} tokens per step, acceptance rate "
                              f"{best['acceptance_rate']:.0%}", best["tau"] >= 1.5),
        _reason("output length", f"{reply:.0f} tokens per reply on average"
                + (f" (under {SHORT_REPLY}: the first token dominates)" if reply < SHORT_REPLY else ""),
                reply >= SHORT_REPLY),
        _reason("temperature", f"T = {report['temperature']:g}" + (
            ": greedy acceptance, outputs identical to plain decoding "
            f"({best['identical']})" if report["temperature"] == 0 else
            ": rejection sampling (lossless); fewer drafts survive than at T = 0"), report["temperature"] == 0),
        _concurrency_reason(costs, concurrency, slots),
        _reason("drafting overhead", f"{best['draft_share']:.1%} of the decode spent drafting",
                best["draft_share"] < 0.1),
        _ttft_reason(best, plain),
        _reason("measured", f"{best_name} {best['output_tokens_per_s']:.1f} tok/s vs plain "
                            f"{plain['output_tokens_per_s']:.1f} tok/s at concurrency {concurrency}: "
                            f"{best['speedup']:.2f}x (go at >= {GO_MARGIN:.2f}x with τ >= {GO_TAU})", go),
    ]
    others = {m: round(f["speedup"] or 0, 3) for m, f in drafters.items()}
    return {
        "engine": report["target"], "prompt_set": report["prompt_set"], "prompts": report["prompts"],
        "temperature": report["temperature"], "concurrency": concurrency,
        "verdict": "go" if go else "no-go",
        "recommendation": ({"method": best_name, "slot_profile": slots, "max_draft_len": _largest_draft(best),
                            "hint": "`trtspec tune` picks the node budget / tree per profile"} if go
                           else {"method": "none", "hint": "turn speculation off for this traffic "
                                                            "(`generate --no-spec`, deploy --method none)"}),
        "speedups": others, "reasons": reasons,
        "speedup_at_1": {m: f["overall"]["speedup"] for m, f in report["results"]["1"].items() if m != "none"},
        "bench": report,
    }


def _reason(name: str, text: str, favours: bool) -> dict:
    return {"name": name, "text": text, "favours_speculation": bool(favours)}


def _usual_profile(figures: dict) -> int:
    """The slot profile the method's drafting steps ran over most often (1 when it never drafted)."""
    steps = {int(k): v for k, v in figures["steps_per_profile"].items() if int(k) > 1}
    return max(steps, key=steps.get) if steps else 1


def _largest_draft(figures: dict) -> int:
    """K enough for what the method drafted: its largest slot profile used, less the root."""
    return max((int(k) for k in figures["steps_per_profile"]), default=1) - 1


def _concurrency_reason(costs, concurrency: int, slots: int) -> dict:
    """Where the traffic sits on the batch verify curve: a step of `slots` over C sequences ÷ a plain step over C."""
    one = costs.cost(slots)
    ratio = costs.batch_cost(concurrency, slots) / costs.batch_cost(concurrency, 1)
    measured = f"measured batch curve up to {costs.batch}" if costs.batch > 1 else "no batch curve: rows x 1"
    at = f"for 1 sequence and {ratio:.2f}x for {concurrency}" if concurrency > 1 else "for 1 sequence"
    text = f"a {slots}-slot step costs {one:.2f}x a plain step {at} ({measured})"
    return _reason("concurrency", text, ratio < 1.5)


def _ttft_reason(best: dict, plain: dict) -> dict:
    mine, base = (best["ttft_ms"] or {}).get("p50"), (plain["ttft_ms"] or {}).get("p50")
    if not mine or not base:
        return _reason("ttft", "not measured", True)
    return _reason("ttft", f"TTFT p50 {mine:.1f} ms vs {base:.1f} ms plain ({mine / base:.2f}x)", mine / base < 1.2)


def format_advice(advice: dict) -> list[str]:
    rec = advice["recommendation"]
    head = (f"GO: speculate with {rec['method']}, K >= {rec['max_draft_len']} (it drafted up to "
            f"{rec['max_draft_len']} tokens a step, mostly in {rec['slot_profile']}-slot steps)" if
            advice["verdict"] == "go" else "NO-GO: turn speculation off for this traffic")
    lines = [f"{advice['engine']} on {advice['prompt_set']} ({advice['prompts']} prompts), T = "
             f"{advice['temperature']:g}, concurrency {advice['concurrency']}", head]
    for r in advice["reasons"]:
        lines.append(f"  {'+' if r['favours_speculation'] else '-'} {r['name']}: {r['text']}")
    at_one = "" if advice["concurrency"] == 1 else "; at 1: " + ", ".join(
        f"{m} {x:.2f}x" for m, x in advice["speedup_at_1"].items() if x)  # at 1 the same figures: said once
    lines.append("  speedup per method at concurrency " + f"{advice['concurrency']}: "
                 + ", ".join(f"{m} {x:.2f}x" for m, x in advice["speedups"].items()) + at_one)
    lines.append(f"  next: {rec['hint']}")
    return lines
