"""`trtspec advise --schedule`: the draft length worth drafting at each batch size, measured, as the LLM API's
`speculative_config.draft_len_schedule` (and `max_concurrency`) for `deploy --flavour llmapi`.

A training-free drafter is run with each draft budget (K, K/2, ... 1 tokens a step) beside plain decoding of the
same engine at each concurrency level, in one `trtspec bench` run per budget; at each level the budget with the best
speedup wins, or 0 (no speculation) when none beats plain decoding by advise's GO_MARGIN; a level never drafts
more than the level below it (a bigger batch leaves less idle compute, so a longer best there is noise). The
schedule follows TensorRT-LLM's rules (deploy_options.check_draft_len_schedule): batch size 1 drafts max_draft_len,
no entry drafts more. The figures are this machine's and this engine's: a GPU's step costs differ, so a schedule
measured here is a starting point to re-measure on the GPU host, not a GPU measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import ConfigError
from trtspec.speculative.method import Method

BUDGETED = (Method.NGRAM.value, Method.SUFFIX.value)  # drafters whose tokens a step the draft budget sets, as the LLM API's NGram drafts


@dataclass(frozen=True, kw_only=True)
class ScheduleOptions:
    engine: Path
    prompt_set: str = "mt-bench"
    temperature: float = 0.0
    levels: tuple[int, ...] = ()  # concurrency levels (default: 1, 2, 4, ... up to the engine's max_batch_size)
    method: str = Method.NGRAM.value
    limit: int = 4
    max_tokens: int = 128
    threads: int | None = 2
    spin: bool | None = None
    show_progress: bool = True

    def __post_init__(self):
        if self.method not in BUDGETED:
            raise ConfigError(f"--schedule measures draft lengths through the draft budget of {' or '.join(BUDGETED)} "
                              f"(the kind of drafter the LLM API's NGram is); {self.method!r} drafts its own tree")
        if any(level < 1 for level in self.levels):
            raise ConfigError(f"--levels must be positive, got {','.join(map(str, self.levels))}")


def draft_lengths(max_draft_len: int) -> tuple[int, ...]:
    """K, K/2, K/4, ... 1: the budgets measured."""
    out, k = [], max_draft_len
    while k >= 1:
        out.append(k)
        k //= 2
    return tuple(out)


def concurrency_levels(max_batch_size: int) -> tuple[int, ...]:
    out, c = [], 1
    while c <= max_batch_size:
        out.append(c)
        c *= 2
    return tuple(out)


def measure_schedule(options: ScheduleOptions, show=print) -> dict:
    """Measure (module docstring) and return the schedule with every figure behind it."""
    from dataclasses import replace

    from trtspec.bench.runner import BenchOptions, open_target, run_bench
    from trtspec.engine.manifest import read_manifest

    manifest = read_manifest(options.engine)
    k, batch = manifest.profile.max_draft_len, manifest.profile.max_batch_size
    if k < 1:
        raise ConfigError(f"engine {options.engine} has K = 0: no draft length to schedule; rebuild with "
                          "--max-draft-len K >= 1")
    levels = tuple(sorted(set(options.levels))) or concurrency_levels(batch)
    if levels[-1] > batch:
        raise ConfigError(f"--levels {levels[-1]} exceeds the engine's max_batch_size {batch}")
    if options.method not in manifest.runnable_methods():
        raise ConfigError(f"engine {options.engine} does not run {options.method}")
    base = BenchOptions(engine=options.engine, prompt_set=options.prompt_set, limit=options.limit,
                        concurrency=levels, temperature=options.temperature, max_tokens=options.max_tokens,
                        threads=options.threads, spin=options.spin, show_progress=options.show_progress,
                        methods=(options.method,))
    speedups: dict[int, dict[int, float]] = {c: {} for c in levels}
    identical: dict[int, str] = {}
    for length in draft_lengths(k):
        show(f"draft length {length}: {options.method} against plain decoding at concurrency "
             f"{','.join(map(str, levels))}")
        bench = replace(base, draft_budget=length)
        report = run_bench(bench, show=show, target=open_target(bench)).report
        for c in levels:
            figures = report["results"][str(c)][options.method]["overall"]
            speedups[c][length] = figures["speedup"] or 0.0
        identical[length] = report["results"][str(levels[0])][options.method]["overall"].get("identical", "")
    return schedule_from(speedups, options, k, identical)


def schedule_from(speedups: dict[int, dict[int, float]], options: ScheduleOptions, k: int,
                  identical: dict[int, str] | None = None) -> dict:
    """The schedule from speedups[level][draft length] (each against plain decoding of the same run)."""
    from trtspec.tune.advise import GO_MARGIN

    best = {}
    for c, by_length in sorted(speedups.items()):
        length = max(by_length, key=lambda n: (by_length[n], -n))
        best[c] = length if by_length[length] >= GO_MARGIN else 0
    levels = sorted(best)
    top = best[levels[0]] if levels[0] == 1 else 0
    out = {"engine": str(options.engine), "prompt_set": options.prompt_set, "temperature": options.temperature,
           "method": options.method, "engine_max_draft_len": k, "levels": levels,
           "speedups": {str(c): {str(n): round(x, 3) for n, x in sorted(v.items())} for c, v in speedups.items()},
           "best": {str(c): n for c, n in best.items()}, "identical": identical or {},
           "measured_on": "this machine's CPU engine (trtspec's own drafter); a GPU's step costs differ: "
                          "re-measure on the GPU host"}
    if top == 0:
        out.update(verdict="no-go", draft_len_schedule=None, max_concurrency=None,
                   deploy_flags=[], hint="speculation does not pay at batch size 1 here: deploy without a drafter")
        return out
    schedule, last = {}, None
    for c in levels:  # never longer than at a smaller batch: a longer best there is the measurement's noise
        length = min(best[c], top if last is None else last)
        if length != last:
            schedule[c] = length
            last = length
    off = next((c for c in levels if schedule.get(c) == 0), None)
    max_concurrency = max((c for c in levels if c < off), default=None) if off is not None else None
    flags = ["--ngram", "--max-draft-len", str(top), "--draft-len-schedule",
             ",".join(f"{c}:{n}" for c, n in schedule.items())]
    out.update(verdict="go", draft_len_schedule=schedule, max_concurrency=max_concurrency, deploy_flags=flags,
               hint=(f"--max-concurrency {max_concurrency} is the coarser form: speculation off above "
                     f"{max_concurrency} requests" if max_concurrency else "speculation paid at every measured level"))
    return out


def format_schedule(result: dict) -> list[str]:
    levels = result["levels"]
    lengths = sorted({int(n) for v in result["speedups"].values() for n in v}, reverse=True)
    lines = [f"{result['engine']} on {result['prompt_set']}, T = {result['temperature']:g}: {result['method']} at "
             f"draft lengths {','.join(map(str, lengths))} against plain decoding, per concurrency (speedup)",
             "  concurrency  " + "  ".join(f"len {n:>2}" for n in lengths) + "   best"]
    for c in levels:
        row = result["speedups"][str(c)]
        lines.append(f"  {c:>11}  " + "  ".join(f"{row[str(n)]:5.2f}x" for n in lengths)
                     + f"   {result['best'][str(c)]}")
    if result["verdict"] == "no-go":
        lines.append(f"NO-GO: {result['hint']}")
    else:
        schedule = ", ".join(f"{c}: {n}" for c, n in result["draft_len_schedule"].items())
        lines.append(f"draft_len_schedule {{{schedule}}}" + (f", max_concurrency {result['max_concurrency']}"
                                                              if result["max_concurrency"] else ""))
        lines.append(f"  trtspec deploy --flavour llmapi --hf BASE {' '.join(result['deploy_flags'])}")
        lines.append(f"  ({result['hint']})")
    lines.append(f"  measured on {result['measured_on']}")
    return lines
