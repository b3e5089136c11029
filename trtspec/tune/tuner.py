"""`trtspec tune`: pick the drafting setting for an engine on this machine, predicted first, then measured.

A step-time model and calibration prompts decoded once; τ per setting predicted by replaying each drafter over
those recordings; the best predicted settings measured on held-out prompts, predicted beside measured. The steps
and what each error term means: docs/tuning.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtspec.tune.eagle_tree import depth_accuracies, drafting_ms, expected_length as eagle_expected
from trtspec.tune.eagle_tree import node_probabilities, record_features, roots, teacher_force
from trtspec.tune.medusa_tree import expected_length as medusa_expected, greedy_tree
from trtspec.tune.replay import HEAD_RANKS, Replayed, record_greedy, replay_drafter, replay_tree
from trtspec.tune.step_time import StepModel, mean_past, measured_pasts, measure as measure_steps
from trtspec.errors import ConfigError
from trtspec.progress import progress_bar
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.method import PLAIN, Method

# the training-free methods tune replays over its calibration prompts (lookahead's window is not replayable)
TRAINING_FREE = (Method.NGRAM.value, Method.SUFFIX.value)
CURVE_ROUNDS = 5  # advise's verify curve at the requests' context: rounds per profile (the cached curve's are 15)
# tune's curve at each of its three contexts: a noisy plain step there would scale every step (the anchor)
STEP_MODEL_ROUNDS = 12


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    engine: Path
    prompt_set: str = "sharegpt-grounded"
    budgets: tuple[int, ...] = (4, 8, 16, 32)  # draft nodes per step (capped by the engine's K)
    # calibration prompts (replayed) and held-out prompts the best candidates are measured on: enough of each that
    # the evaluation covers every MT-Bench category and its tokens/s lands near the replay's prediction
    calibration: int = 16
    evaluation: int = 8
    candidates: int = 3  # the best predicted settings measured
    max_tokens: int = 128
    threads: int | None = 2
    spin: bool | None = None
    show_progress: bool = True

    def __post_init__(self):
        if not self.budgets or min(self.budgets) < 1:
            raise ConfigError(f"--budget must be positive integers, got {self.budgets}")
        for name in ("calibration", "evaluation", "candidates", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


@dataclass
class Setting:
    """One drafting setting: a method with a node budget, or a Medusa / EAGLE-1 tree."""

    name: str
    method: str
    budget: int  # draft nodes per step at most
    choices: list[list[int]] | None = None  # Medusa / EAGLE-1: the tree
    predicted: dict = field(default_factory=dict)
    measured: dict | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "method": self.method, "budget": self.budget, "choices": self.choices,
                "predicted": self.predicted, "measured": self.measured}


def split_prompts(options: TuneOptions, generator, show=print) -> tuple[list, list, dict]:
    """(calibration prompts, evaluation prompts, how they were split): a set's tune and measure splits where it has
    them; else the first `evaluation` prompts as `trtspec bench --limit N` takes them (a known set of several
    categories: spread across them, `spread_categories`) and the next `calibration` of that same order, so both
    are drawn across the categories and never share a prompt."""
    from trtspec.bench.workload import load_bench_prompts, spreads
    from trtspec.data.prompts import PROMPT_SETS

    source = PROMPT_SETS.get(options.prompt_set)
    common = {"generator": generator, "max_tokens": options.max_tokens, "show": show}
    if source is not None and source.measure_size:
        calibration = load_bench_prompts(options.prompt_set, limit=options.calibration, split="tune", **common)
        evaluation = load_bench_prompts(options.prompt_set, limit=options.evaluation, split="measure", **common)
        how = {"calibration": f"{options.prompt_set} tune split (after its first {source.measure_size}), first "
                              f"{options.calibration}",
               "evaluation": f"{options.prompt_set} measure split (its first {source.measure_size}), first "
                             f"{options.evaluation}"}
    else:
        both = load_bench_prompts(options.prompt_set, limit=options.evaluation + options.calibration, split=None,
                                  **common)
        evaluation, calibration = both[:options.evaluation], both[options.evaluation:]
        spread = spreads(options.prompt_set)
        order = f"{options.prompt_set} spread across its categories" if spread else f"{options.prompt_set}"
        how = {"evaluation": f"{order}, prompts 1-{options.evaluation} (what `trtspec bench --limit "
                             f"{options.evaluation}` measures)",
               "calibration": f"{order}, prompts {options.evaluation + 1}-"
                              f"{options.evaluation + options.calibration}"}
        if spread and len(evaluation) < len(source.categories):
            n = len(source.categories)
            how["note"] = (f"the evaluation holds {len(evaluation)} of {options.prompt_set}'s {n} categories, the "
                           f"calibration every one: --evaluation {n} --calibration {2 * n} measures one of each and "
                           "calibrates on two")
    if not calibration or not evaluation:
        raise ConfigError(f"--prompt-set {options.prompt_set}: {len(calibration)} calibration and {len(evaluation)} "
                          "evaluation prompts fit the engine; both need at least one (raise the limits)")
    how["calibration_ids"] = [p.id for p in calibration]
    how["evaluation_ids"] = [p.id for p in evaluation]
    how["calibration_categories"] = _category_counts(calibration)
    how["evaluation_categories"] = _category_counts(evaluation)
    return calibration, evaluation, how


def _category_counts(prompts) -> dict[str, int]:
    """Prompts per category, in the order the categories first appear."""
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    return counts


def run_tune(options: TuneOptions, show=print) -> dict:
    """Predict, measure, pick (module docstring); the report."""
    from trtspec.runtime.generator import LocalGenerator

    load_before = os.getloadavg()
    generator = LocalGenerator(options.engine, threads=options.threads, spin=options.spin)
    engine, manifest = generator.engine, generator.manifest
    costs = engine.step_costs()
    calibration, evaluation, split = split_prompts(options, generator, show)
    heads = engine.num_medusa_heads if manifest.method is Method.MEDUSA else 0
    eagle = manifest.method is Method.EAGLE and engine.has_eagle_draft
    k = engine.max_draft_len
    generator.generate(list(calibration[0].ids), GenerationConfig(max_tokens=8, no_spec=True))  # warm up
    lengths = [len(p.ids) for p in calibration]
    unanchored = measure_steps(engine, measured_pasts(lengths, options.max_tokens), rounds=STEP_MODEL_ROUNDS)
    budgets = sorted({b for b in options.budgets if b <= k})
    skipped = sorted(b for b in options.budgets if b > k)
    eagle_depth = _eagle_depth(budgets, manifest, k) if eagle else 0
    # K tokens past max_tokens: the last replayed step may accept past the end, as a run counts it
    forced_s: dict[str, float] = {}  # the EAGLE draft's teacher forcing, seconds per prompt set
    recordings = _record(generator, calibration, options.max_tokens + k, heads, eagle_depth, "calibration", options,
                         forced_s)
    model = unanchored.anchored([(len(r.output_ids) - 1, mean_past(len(r.prompt_ids), len(r.output_ids) - 1),
                                  r.plain_decode_s) for r in recordings])
    context = float(np.median([mean_past(n, options.max_tokens - 1) for n in lengths]))
    plain = Setting(PLAIN, PLAIN, 0)
    plain.predicted = _predict(_replays(generator, plain, recordings, options.max_tokens, costs), lengths, model)
    settings = [plain]
    costing = {"lengths": lengths, "model": model, "prompts": len(evaluation),
               "plain_ms": 1000 / plain.predicted["decode_tokens_per_s"] if plain.predicted["decode_tokens_per_s"]
               else 0.0}
    for method in TRAINING_FREE if k >= 1 else ():
        for budget in budgets:
            setting = Setting(f"{method}/{budget}", method, budget)
            setting.predicted = _predict(_replays(generator, setting, recordings, options.max_tokens, costs),
                                         **costing)
            settings.append(setting)
    accuracies, probabilities = None, None
    if heads:
        accuracies, trees = _medusa_trees(recordings, budgets, manifest)
        head_ms = 1000 * sum(r.head_s for r in recordings) / max(1, sum(len(r.output_ids) for r in recordings))
        for name, choices in trees:
            expected = {"expected_tau_independent_heads": round(medusa_expected(accuracies, choices), 3)}
            settings.append(_tree_setting(name, Method.MEDUSA.value, choices, recordings, costs, costing, options.max_tokens,
                                          head_ms, expected))
    own = manifest.method.value
    if eagle:
        probabilities, trees = _eagle_trees(recordings, budgets, manifest, options.max_tokens, eagle_depth)
        draft_ms = drafting_ms(engine, recordings, {name: _tree(choices) for name, choices in trees},
                               options.max_tokens)
        for name, choices in trees:
            expected = {"expected_tau_per_root": round(eagle_expected(probabilities, choices), 3)}
            settings.append(_tree_setting(name, Method.EAGLE.value, choices, recordings, costs, costing, options.max_tokens,
                                          draft_ms[name], expected))
    elif own not in (PLAIN, Method.MEDUSA):  # EAGLE-2's dynamic tree, ReDrafter's beams: run on the calibration prompts
        settings.append(_calibrated_setting(generator, own, calibration, options.max_tokens, costing))
    chosen = _candidates(settings, options.candidates)
    held_out = _record(generator, evaluation, options.max_tokens + k, heads, eagle_depth, "evaluation", options,
                       forced_s)
    _measure(generator, chosen, evaluation, options, model, show)
    for s in chosen:  # the replay on the evaluation prompts themselves: how much of the error is the prompts'
        replayable = s.method in (PLAIN, Method.MEDUSA, *TRAINING_FREE) or (s.method == Method.EAGLE and eagle)
        s.measured["replayed_tau"] = _tau(*_replay(generator, s, held_out, options.max_tokens, costs)) \
            if replayable else None
    winner = max(chosen, key=lambda s: s.measured["decode_tokens_per_s"])
    return {
        "engine": str(options.engine), "method": manifest.method.value, "max_draft_len": k,
        "prompt_set": options.prompt_set, "split": split, "max_tokens": options.max_tokens, "temperature": 0,
        "threads": options.threads, "spin": engine.spin,
        # the step model: the curve measured after several pasts, its lines, the acceptance, the anchor's scale;
        # and its steps at the calibration prompts' median context, for a glance
        "step_model": model.to_dict(at=context), "cached_verify_curve": costs.to_dict(),
        "budgets": budgets, "budgets_over_k": skipped,
        "head_accuracies": None if accuracies is None else [[round(x, 4) for x in row] for row in accuracies],
        "eagle_depth": eagle_depth or None,
        "eagle_teacher_forcing_s": {which: round(t, 2) for which, t in forced_s.items()} or None,
        # the draft's most probable nodes (rank paths) on the calibration prompts: what its trees are built from
        "eagle_node_probabilities": None if probabilities is None else
        [[list(path), round(p, 4)] for path, p in sorted(probabilities.items(), key=lambda x: (-x[1], x[0]))[:32]],
        "settings": [s.to_dict() for s in settings], "measured": [s.name for s in chosen],
        "winner": winner.to_dict(),
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }


def _record(generator, prompts, max_tokens: int, heads: int, eagle_depth: int, which: str, options,
            forced_s: dict) -> list:
    """The prompts' greedy recordings (`replay.record_greedy`); on an EAGLE-1 engine with the target's features and
    then the draft's ranks along them (`eagle_tree.teacher_force`, a progress bar over the roots; its seconds into
    `forced_s[which]`)."""
    ids = [list(p.ids) for p in prompts]
    with progress_bar(f"record {which}", total=len(prompts), enabled=options.show_progress) as advance:
        if not eagle_depth:
            return record_greedy(generator, ids, max_tokens, heads=heads, advance=advance)
        recordings = record_features(generator, ids, max_tokens, advance=advance)
    with progress_bar(f"EAGLE draft along {which}", total=sum(roots(r, options.max_tokens) for r in recordings),
                      enabled=options.show_progress) as advance:
        start = time.perf_counter()
        for r in recordings:
            teacher_force(generator.engine, r, eagle_depth, options.max_tokens, _eagle_ranks(generator.manifest),
                          advance=advance)
        forced_s[which] = time.perf_counter() - start
    return recordings


def _eagle_depth(budgets: list[int], manifest, k: int) -> int:
    """Depths the EAGLE draft is teacher-forced to: as deep as the largest budget's tree or the shipped tree can go,
    within K and the tree limit (a root stops early where the true token leaves the candidates kept)."""
    from trtspec.speculative.tree import MAX_DEPTH

    shipped = max((len(c) for c in manifest.tree or ()), default=1)
    return max(1, min(k, MAX_DEPTH, max([*budgets, shipped])))


def _eagle_ranks(manifest) -> int:
    """Ranks kept per depth: HEAD_RANKS, or the shipped tree's widest rank + 1."""
    return max([HEAD_RANKS, *(max(c) + 1 for c in manifest.tree or ())])


def _eagle_trees(recordings, budgets: list[int], manifest, max_tokens: int, depth: int) -> tuple[dict, list]:
    """The draft's measured node probabilities, the greedy tree of each budget over its per-depth accuracies (once
    each) and the shipped tree. An engine that verifies chains only exactly (quantized weights) gets chains instead:
    each budget's (as deep as the draft was forced) and the shipped tree's, which is what it drafts
    (make_proposer)."""
    ranks = _eagle_ranks(manifest)
    probabilities = node_probabilities(recordings, max_tokens, ranks)
    accuracies = depth_accuracies(recordings, max_tokens, depth, ranks)
    return probabilities, _budget_trees(Method.EAGLE.value, accuracies, budgets, depth, manifest)


def _budget_trees(method: str, accuracies, budgets: list[int], depth: int, manifest) -> list:
    """(name, choices) of the greedy tree of each node budget over per-depth accuracies (a budget the accuracies
    cannot fill gives an earlier budget's tree: kept once), then the shipped tree. An engine that verifies chains only
    exactly (quantized weights) gets the top-1 chain of each budget's depth instead, which is what it drafts
    (make_proposer)."""
    chains = manifest.chains_only
    trees, seen = [], []
    for b in budgets:
        choices = [[0] * d for d in range(1, min(b, depth) + 1)] if chains else greedy_tree(accuracies, b)[0]
        if choices and choices not in seen:
            trees.append((f"{method}-tree/{len(choices)}", choices))
            seen.append(choices)
    if manifest.tree:
        shipped = [list(c) for c in manifest.tree]
        if chains:
            shipped = [[0] * d for d in range(1, max(len(c) for c in shipped) + 1)]
        trees.append((f"{method} (shipped)", shipped))
    return trees


def _tree(choices):
    from trtspec.speculative.tree import build_tree

    return build_tree([list(c) for c in choices])


def _medusa_trees(recordings, budgets: list[int], manifest) -> tuple[list[list[float]], list]:
    """The heads' top-k accuracies and the trees of every budget (`_budget_trees`)."""
    from trtspec.tune.medusa_tree import head_accuracies

    accuracies = head_accuracies([r.head_ranks for r in recordings], HEAD_RANKS)
    return accuracies, _budget_trees(Method.MEDUSA.value, accuracies, budgets, len(accuracies), manifest)


def _candidates(settings: list[Setting], count: int) -> list[Setting]:
    """Plain decoding, the `count` best predicted settings, the best of each method other than the shipped drafter
    (a Medusa or EAGLE engine's best tree stands beside its shipped one whichever is predicted faster) and the shipped
    drafter (each setting's predicted speedup set on the way)."""
    base = settings[0].predicted["decode_tokens_per_s"]
    for s in settings:
        s.predicted["speedup"] = round(s.predicted["decode_tokens_per_s"] / base, 3) if base else None
    ranked = sorted(settings[1:], key=lambda s: -s.predicted["decode_tokens_per_s"])
    shipped = [s for s in settings if s.name.endswith("(shipped)")]
    best_of = {}
    for s in ranked:
        if s not in shipped:
            best_of.setdefault(s.method, s)
    chosen = [settings[0]]
    for s in [*ranked[:count], *best_of.values(), *shipped]:
        if s not in chosen:
            chosen.append(s)
    return chosen


def _replay(generator, setting: Setting, recordings, max_tokens: int, costs) -> tuple:
    """(statistics, tokens after the first) of a setting replayed over recordings in order, learning as a run."""
    total = Replayed()
    for one in _replays(generator, setting, recordings, max_tokens, costs):
        total = total.merge(one)
    return total.stats, total.tokens


def _replays(generator, setting: Setting, recordings, max_tokens: int, costs) -> list[Replayed]:
    """The replay of each recording, in order (the training-free drafters learning across them as a run does)."""
    from trtspec.speculative.methods import make_proposer
    from trtspec.speculative.ngram_proposer import NgramConfig
    from trtspec.speculative.stats import SpecStats

    if setting.method == PLAIN:
        return [Replayed(SpecStats(steps=n, profile_steps={1: n} if n else {}), n)
                for n in (min(max_tokens, len(r.output_ids)) - 1 for r in recordings)]
    if setting.method in (Method.MEDUSA, Method.EAGLE):  # a tree over the recorded ranks (the heads', the EAGLE draft's)
        return [Replayed(replay_tree([r], setting.choices, max_tokens, costs), min(max_tokens, len(r.output_ids)) - 1)
                for r in recordings]
    model, recent = _learning_state()
    out = []
    for r in recordings:
        proposer = make_proposer(setting.method, generator.engine, ngram=NgramConfig(max_draft_len=setting.budget),
                                 acceptance=model, recent=recent)
        out.append(replay_drafter(proposer, r, costs, generator.engine.vocab_size, max_tokens))
    return out


RANGE_RESAMPLES = 400  # bootstrap draws of the prediction's range


def speedup_range(per_prompt: list[tuple[int, float]], plain_ms: float, prompts: int, *,
                  resamples: int = RANGE_RESAMPLES, seed: int = 0) -> list[float] | None:
    """The 5th-95th percentile of the speedup over plain decoding that `prompts` prompts drawn like the calibration
    ones would show: per_prompt is each calibration prompt's (tokens after the first, predicted decode ms); drawn
    with replacement `resamples` times. The point prediction pools every calibration prompt; a measurement on a few
    held-out prompts scatters around it by about this much (how much the prompts differ, not the replay)."""
    if not per_prompt or not plain_ms or prompts < 1:
        return None
    tokens = np.array([t for t, _ in per_prompt], float)
    ms = np.array([m for _, m in per_prompt], float)
    draws = np.random.default_rng(seed).integers(0, len(per_prompt), (resamples, prompts))
    speedups = tokens[draws].sum(1) / np.maximum(ms[draws].sum(1), 1e-9) * plain_ms
    lo, hi = np.percentile(speedups, [5, 95])
    return [round(float(lo), 3), round(float(hi), 3)]


def _costed(replays: list[Replayed], lengths: list[int], model: StepModel,
            draft_ms: float | None = None) -> list[tuple[int, float, float]]:
    """Each replayed prompt's (tokens after the first, its steps' ms, its drafter's ms): the steps priced by the
    step model after the prompt's mean context, the drafter's own measured time (or `draft_ms` a step)."""
    return [(one.tokens, model.steps_ms(one.stats.profile_steps, mean_past(n, one.tokens)),
             1000 * one.stats.draft_s if draft_ms is None else one.stats.steps * draft_ms)
            for one, n in zip(replays, lengths)]


def _predict(replays: list[Replayed], lengths: list[int], model: StepModel, plain_ms: float = 0.0, prompts: int = 0,
             draft_ms: float | None = None) -> dict:
    """τ, decode tokens/s and the steps' and drafter's ms of replayed prompts (`_costed`), and the speedup range
    over `prompts` prompts drawn like them (`speedup_range`, against plain decoding's `plain_ms` a token)."""
    costed = _costed(replays, lengths, model, draft_ms)
    total = Replayed()
    for one in replays:
        total = total.merge(one)
    stats, tokens = total.stats, total.tokens
    verify_ms, own_ms = sum(v for _, v, _ in costed), sum(d for *_, d in costed)
    ms = verify_ms + own_ms
    out = {"tau": _tau(stats, tokens), "acceptance_rate": round(stats.acceptance_rate, 3),
           "decode_tokens_per_s": round(1000 * tokens / ms, 2) if ms else 0.0,
           "draft_ms_per_step": round(own_ms / stats.steps, 3) if stats.steps else 0.0,
           "other_ms_per_step": round(verify_ms / stats.steps, 3) if stats.steps else 0.0,
           "per_position_acceptance": [round(x, 3) for x in stats.per_position_acceptance],
           "steps_per_profile": {str(s): n for s, n in sorted(stats.profile_steps.items())}}
    if prompts:
        out["speedup_range"] = speedup_range([(t, v + d) for t, v, d in costed], plain_ms, prompts)
    return out


def _calibrated_setting(generator, method: str, prompts, max_tokens: int, costing: dict) -> Setting:
    """The engine's own dynamic tree (EAGLE-2) or beams (ReDrafter), not replayed offline: run for real on the
    calibration prompts,
    its steps and drafting time then costed by the step model as the replayed ones are."""
    from trtspec.speculative.loop import GenerationConfig, generate

    config = GenerationConfig(max_tokens=max_tokens, end_id=generator.manifest.model.end_id)
    runs = []
    for p in prompts:
        proposer = generator.proposer(GenerationConfig(method=method, backoff=False))  # the tree as the model costs it
        result = generate(generator.engine, list(p.ids), proposer, config)
        runs.append(Replayed(result.stats, len(result.output_ids) - 1))
    setting = Setting(f"{method} (shipped)", method, generator.engine.max_draft_len)
    setting.predicted = {**_predict(runs, **costing), "calibration": "run, not replayed"}
    return setting


def _tau(stats, tokens: int) -> float:
    return round(tokens / stats.steps, 3) if stats.steps else 1.0


def _tree_setting(name: str, method: str, choices, recordings, costs, costing: dict, max_tokens: int,
                  draft_ms: float, expected: dict) -> Setting:
    """A Medusa or EAGLE-1 tree replayed over the recorded ranks, its drafter's time per step (`draft_ms`: the
    heads' run, or the EAGLE proposer's drafting) added to every step."""
    setting = Setting(name, method, len(choices), choices)
    setting.predicted = {**_predict(_replays(None, setting, recordings, max_tokens, costs), **costing,
                                    draft_ms=draft_ms), **expected}
    return setting


def _measure(generator, settings: list[Setting], prompts, options: TuneOptions, model: StepModel, show) -> None:
    """Every setting on every evaluation prompt, T = 0, the order rotating per prompt; decode tokens/s and τ, and
    the step model priced on each run's own steps and contexts (what it would have predicted knowing them)."""
    from trtspec.speculative.loop import GenerationConfig, generate
    from trtspec.speculative.stats import SpecStats

    config = GenerationConfig(max_tokens=options.max_tokens, end_id=generator.manifest.model.end_id)
    learnt = {s.name: _learning_state() for s in settings}
    sums = {s.name: {"tokens": 0, "decode_s": 0.0, "stats": SpecStats(), "outputs": [], "modelled_ms": 0.0}
            for s in settings}
    for s in settings:  # warm-up
        generate(generator.engine, list(prompts[0].ids), _proposer(generator, s, learnt[s.name]),
                 GenerationConfig(max_tokens=8, end_id=config.end_id))
    learnt = {s.name: _learning_state() for s in settings}
    with progress_bar("measure candidates", total=len(prompts) * len(settings),
                      enabled=options.show_progress) as advance:
        for i, prompt in enumerate(prompts):
            order = settings[i % len(settings):] + settings[:i % len(settings)]
            for s in order:
                result = generate(generator.engine, list(prompt.ids), _proposer(generator, s, learnt[s.name]), config)
                acc = sums[s.name]
                acc["tokens"] += len(result.output_ids) - 1
                acc["decode_s"] += result.total_s - result.ttft_s
                acc["stats"] = acc["stats"].merge(result.stats)
                acc["outputs"].append(result.output_ids)
                acc["modelled_ms"] += model.steps_ms(result.stats.profile_steps,
                                                     mean_past(len(prompt.ids), len(result.output_ids) - 1))
                advance()
    plain = sums[PLAIN]
    for s in settings:
        acc = sums[s.name]
        tps = acc["tokens"] / acc["decode_s"] if acc["decode_s"] else 0.0
        s.measured = {"tau": round(acc["tokens"] / acc["stats"].steps, 3) if acc["stats"].steps else 1.0,
                      "acceptance_rate": round(acc["stats"].acceptance_rate, 3),
                      "decode_tokens_per_s": round(tps, 2),
                      # the drafter's own time per step in the run, beside the predicted draft_ms_per_step
                      "draft_ms_per_step": round(1000 * acc["stats"].draft_s / acc["stats"].steps, 3)
                      if acc["stats"].steps else 0.0,
                      # the rest of a step (the verify step, acceptance, the loop), beside the curve's prediction
                      "other_ms_per_step": round(1000 * (acc["decode_s"] - acc["stats"].draft_s) / acc["stats"].steps,
                                                 3) if acc["stats"].steps else 0.0,
                      # the step model on this run's own steps (profiles, contexts): its error beside the line above
                      "modelled_ms_per_step": round(acc["modelled_ms"] / acc["stats"].steps, 3)
                      if acc["stats"].steps else 0.0,
                      "identical": f"{sum(a == b for a, b in zip(acc['outputs'], plain['outputs']))}/{len(prompts)}"}
        base = plain["tokens"] / plain["decode_s"] if plain["decode_s"] else 0.0
        s.measured["speedup"] = round(tps / base, 3) if base else None
        p = s.predicted["decode_tokens_per_s"]
        s.measured["prediction_error"] = round(p / tps - 1, 3) if tps else None
        # the speedup's error: the ratio to plain decoding, free of the machine's level (the anchor's drift)
        s.measured["speedup_error"] = round(s.predicted["speedup"] / s.measured["speedup"] - 1, 3) \
            if s.measured["speedup"] and s.predicted.get("speedup") else None
        if (span := s.predicted.get("speedup_range")) and s.measured["speedup"]:
            s.measured["within_range"] = span[0] <= s.measured["speedup"] <= span[1]
        show(f"  {s.name}: predicted τ {s.predicted['tau']:.2f} {p:.1f} tok/s, measured τ {s.measured['tau']:.2f} "
             f"{tps:.1f} tok/s")


def _learning_state():
    """A setting's own acceptance model and recent outputs (what ngram / suffix learn across requests)."""
    from trtspec.speculative.datastore import RecentOutputs
    from trtspec.speculative.ngram_proposer import AcceptanceModel

    return AcceptanceModel(), RecentOutputs()


def _proposer(generator, setting: Setting, state):
    from trtspec.speculative.methods import make_proposer
    from trtspec.speculative.ngram_proposer import NgramConfig
    from trtspec.speculative.tree import build_tree

    engine = generator.engine
    if setting.method == PLAIN:
        return make_proposer(PLAIN, engine)
    # trees are measured whole every step, as the step model predicts them (no back-off)
    if setting.method in (Method.MEDUSA, Method.EAGLE) and setting.choices is not None:
        return make_proposer(setting.method, engine, tree=build_tree(setting.choices), backoff=False)
    if setting.method not in TRAINING_FREE:  # the engine's own trained drafter, as it ships
        return generator.proposer(GenerationConfig(method=setting.method, backoff=False))
    model, recent = state
    return make_proposer(setting.method, engine, ngram=NgramConfig(max_draft_len=setting.budget), acceptance=model,
                         recent=recent)


def format_tune(report: dict) -> list[str]:
    """The settings, predicted beside measured, and the winner."""
    split = report["split"]
    lines = [f"engine {report['engine']} (method {report['method']}, K {report['max_draft_len']}), "
             f"{report['max_tokens']} tokens, T = 0, load average {report['load_average']['before'][0]} / "
             f"{report['load_average']['after'][0]}",
             f"calibration: {split['calibration']}{_categories(split.get('calibration_categories'))}; "
             f"evaluation: {split['evaluation']}{_categories(split.get('evaluation_categories'))}",
             *([split["note"]] if split.get("note") else []),
             _format_model(report["step_model"])]
    if report["budgets_over_k"]:
        lines.append(f"budgets over K = {report['max_draft_len']} left out: {report['budgets_over_k']}")
    lines.append(f"{'setting':<20} {'pred τ':>6} {'pred tok/s':>10} {'pred x':>7} | {'meas τ':>6} {'meas tok/s':>10} "
                 f"{'meas x':>7} {'error':>6} {'x error':>7} {'same':>5} {'replayed τ on eval':>18} "
                 f"{'ms/step pred':>13} {'ms/step meas':>13} {'model on meas':>13}")
    for s in report["settings"]:
        p, m = s["predicted"], s["measured"]
        row = f"{s['name']:<20} {p['tau']:>6.2f} {p['decode_tokens_per_s']:>10.1f} {_x(p.get('speedup')):>7} |"
        if m is not None:
            err = "-" if m["prediction_error"] is None else f"{m['prediction_error']:+.0%}"
            x_err = "-" if m.get("speedup_error") is None else f"{m['speedup_error']:+.0%}"
            row += (f" {m['tau']:>6.2f} {m['decode_tokens_per_s']:>10.1f} {_x(m['speedup']):>7} {err:>6} {x_err:>7} "
                    f"{m['identical']:>5} {_num(m.get('replayed_tau')):>18} "
                    f"{_split_ms(p):>13} {_split_ms(m):>13} {_num(m.get('modelled_ms_per_step'), 1):>13}")
        lines.append(row)
    for s in report["settings"]:
        span, m = s["predicted"].get("speedup_range"), s["measured"]
        if span and m is not None and m.get("speedup"):
            lines.append(f"{s['name']}: predicted {_x(s['predicted'].get('speedup'))}, 90% of "
                         f"{len(report['split']['evaluation_ids'])} prompts drawn like the calibration ones "
                         f"{span[0]:.2f}-{span[1]:.2f}x; measured {_x(m['speedup'])} "
                         f"({'inside' if m.get('within_range') else 'outside'})")
    w = report["winner"]
    lines.append(f"winner: {w['name']}" + (f" (tree {w['choices']})" if w["choices"] else "")
                 + f", measured {_x(w['measured']['speedup'])} decode speedup on the evaluation prompts")
    return lines


def _format_model(model: dict) -> str:
    """The verify curve where it was measured, the acceptance, the anchor's scale."""
    pasts = " / ".join(str(p) for p in model["pasts"])
    per_profile = ", ".join(f"{p} slots " + " / ".join(f"{row[i]:.1f}" for row in model["measured_ms"])
                            + (f" + {model['acceptance_ms'][i]:.2f}" if model["acceptance_ms"][i] >= 0.005 else "")
                            for i, p in enumerate(model["profiles"]))
    return (f"verify step ms after {pasts} tokens (+ acceptance): {per_profile}; scaled x{model['scale']:.2f} to the "
            f"calibration run's plain steps")


def _categories(counts: dict | None) -> str:
    """" (writing 1, roleplay 2)": a split's categories; nothing for a set of one category."""
    if not counts or len(counts) < 2:
        return ""
    return " (" + ", ".join(f"{c} {n}" for c, n in counts.items()) + ")"


def _split_ms(figures: dict) -> str:
    """A step's milliseconds as the rest of the step + the drafter's."""
    if figures.get("other_ms_per_step") is None:
        return "-"
    return f"{figures['other_ms_per_step']:.1f}+{figures.get('draft_ms_per_step') or 0:.1f}"


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"
