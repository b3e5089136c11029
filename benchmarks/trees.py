"""Measure a trained drafter on MT-Bench at temperature 0: for each candidate tree, convert → build → generate with
speculation and without (the same engine, the same run, prompt by prompt alternating the order), and report
τ per category, acceptance rate, per-position acceptance, wall-clock speedup and token-identity.

    .venv/bin/python benchmarks/trees.py --base BASE (--medusa DIR | --eagle DIR) [--tree chain_2 ...]
        [--per-category 10] [--max-tokens 128] [--threads 2] [--work DIR] [--keep-engines] [--json FILE]
        [--write-tree DIR]

Each tree's engine (about 600 MB for SmolLM2) is deleted once measured, and the converted checkpoints at the end,
unless --keep-engines (a rerun then reuses them). Medusa checkpoints are converted with as many heads as the tree is
deep (every head costs one lm_head product per step); EAGLE checkpoints with num_eagle_layers = the tree depth (TensorRT-LLM requires it).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from trtspec.cli.app import user_errors
from trtspec.errors import ConfigError
from trtspec.speculative.stats import SpecStats

DEFAULT_TREES = ("chain_1", "chain_2", "chain_3", "[[0],[1],[0,0]]", "[[0],[1],[0,0],[0,0,0]]")
CHAINS = {"chain_1": [[0]]}


@dataclass
class TreeResult:
    tree: str
    choices: list
    depth: int
    categories: dict[str, SpecStats] = field(default_factory=dict)
    spec_s: float = 0.0
    plain_s: float = 0.0
    spec_decode_s: float = 0.0  # wall time after the first token
    plain_decode_s: float = 0.0
    tokens: int = 0
    identical: int = 0
    prompts: int = 0

    def to_dict(self) -> dict:
        total = SpecStats()
        for s in self.categories.values():
            total = total.merge(s)
        return {"tree": self.tree, "choices": self.choices, "depth": self.depth, "prompts": self.prompts,
                "tokens": self.tokens, "identical_outputs": f"{self.identical}/{self.prompts}",
                "acceptance_length": round(total.acceptance_length, 3),
                "acceptance_rate": round(total.acceptance_rate, 3),
                "per_position_acceptance": [round(x, 3) for x in total.per_position_acceptance],
                "tau_per_category": {c: round(s.acceptance_length, 3) for c, s in self.categories.items()},
                "spec_tokens_per_s": round(self.tokens / self.spec_s, 2),
                "plain_tokens_per_s": round(self.tokens / self.plain_s, 2),
                "speedup": round(self.plain_s / self.spec_s, 3),
                "decode_speedup": round(self.plain_decode_s / self.spec_decode_s, 3)}


def parse_tree(text: str) -> list:
    from trtspec.speculative.tree import parse_choices
    from trtspec.speculative.tree_presets import TREE_PRESETS, preset

    if text in CHAINS:
        return CHAINS[text]
    return preset(text) if text in TREE_PRESETS else [list(c) for c in parse_choices(text)]


def checkpoint_dir(args, depth: int) -> Path:
    return args.work / f"ckpt-{'medusa' if args.medusa else 'eagle'}-{depth}"


def build_engine(args, choices: list, work: Path) -> Path:
    """Convert with heads / EagleNets for the tree's depth, then build a batch-1 engine with the tree."""
    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.engine.onnx_builder import BuildOptions, build

    depth = max(len(c) for c in choices)
    method = "medusa" if args.medusa else "eagle"
    ckpt = checkpoint_dir(args, depth)
    if not (ckpt / "config.json").is_file():
        drafter = ({"medusa": args.medusa, "num_medusa_heads": depth} if args.medusa
                   else {"eagle": args.eagle, "num_eagle_layers": depth})
        convert(ConvertOptions(base=args.base, out=ckpt, force=True, **drafter), show_progress=False)
    engine = work / f"engine-{method}-b{args.batch}-{'_'.join('-'.join(map(str, c)) for c in choices)}"
    if not (engine / "manifest.json").is_file():
        build(BuildOptions(source=ckpt, out=engine, choices=json.dumps(choices), max_batch_size=args.batch,
                           max_input_len=args.max_input_len, max_seq_len=args.max_input_len + args.max_tokens + 80,
                           force=True))
    return engine


def measure(args, tree: str, prompts) -> TreeResult:
    """Build the tree's engine, measure it, and (unless --keep-engines) delete it."""
    choices = parse_tree(tree)
    engine = build_engine(args, choices, args.work)
    try:
        return _measure(args, tree, choices, engine, prompts)
    finally:
        if not args.keep_engines:
            shutil.rmtree(engine, ignore_errors=True)


def _measure(args, tree: str, choices: list, engine: Path, prompts) -> TreeResult:
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    generator = LocalGenerator(engine, threads=args.threads)
    result = TreeResult(tree, choices, max(len(c) for c in choices))
    spec, plain = GenerationConfig(max_tokens=args.max_tokens), GenerationConfig(max_tokens=args.max_tokens, no_spec=True)
    if args.batch > 1:
        return _measure_batched(generator, result, prompts, spec, plain)
    for options in (spec, plain):  # warm up the sessions
        generator.generate(list(prompts[0].messages), GenerationConfig(max_tokens=8, no_spec=options.no_spec))
    for i, p in enumerate(prompts):
        runs = {}
        for name in (("spec", "plain") if i % 2 == 0 else ("plain", "spec")):
            start = time.perf_counter()
            g = generator.generate(list(p.messages), spec if name == "spec" else plain)
            runs[name] = (g, time.perf_counter() - start)
        (gs, ts), (gp, tp) = runs["spec"], runs["plain"]
        result.spec_s, result.plain_s = result.spec_s + ts, result.plain_s + tp
        result.spec_decode_s += ts - gs.result.ttft_s
        result.plain_decode_s += tp - gp.result.ttft_s
        result.tokens += len(gs.output_ids)
        result.identical += gs.output_ids == gp.output_ids
        result.prompts += 1
        result.categories[p.category] = result.categories.get(p.category, SpecStats()).merge(gs.result.stats)
        print(f"  {tree} {i + 1}/{len(prompts)} {p.category}: τ {gs.result.stats.acceptance_length:.2f}, "
              f"{len(gs.output_ids) / ts:.1f} vs {len(gp.output_ids) / tp:.1f} tok/s", file=sys.stderr, flush=True)
    return result


_PLAIN: dict = {}


def _measure_batched(generator, result: TreeResult, prompts, spec, plain) -> TreeResult:
    """All prompts with in-flight batching, speculative then plain: τ and identity as at batch 1 (greedy), in a
    fraction of the time; the timings are batched throughput, not the batch-1 speedup."""
    runs = {}
    for name, options in (("spec", spec), ("plain", plain)):
        if name == "plain" and name in _PLAIN:  # plain decoding is the same for every tree: run it once
            runs[name] = _PLAIN[name]
            continue
        start = time.perf_counter()
        runs[name] = (generator.generate_many([list(p.messages) for p in prompts], options), time.perf_counter() - start)
        print(f"  {result.tree} {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    _PLAIN["plain"] = runs["plain"]
    (gs, result.spec_s), (gp, result.plain_s) = runs["spec"], runs["plain"]
    result.spec_decode_s, result.plain_decode_s = result.spec_s, result.plain_s
    for p, a, b in zip(prompts, gs, gp):
        result.tokens += len(a.output_ids)
        result.identical += a.output_ids == b.output_ids
        result.prompts += 1
        result.categories[p.category] = result.categories.get(p.category, SpecStats()).merge(a.result.stats)
    return result


def select_prompts(per_category: int | None):
    from trtspec.data.prompts import load_prompts

    prompts, seen = [], {}
    for p in load_prompts("mt-bench"):
        seen[p.category] = seen.get(p.category, 0) + 1
        if per_category is None or seen[p.category] <= per_category:
            prompts.append(p)
    return prompts


@dataclass(frozen=True, kw_only=True)
class SpecEvalOptions:
    base: Path  # the Hugging Face base folder
    medusa: Path | None = None  # Medusa heads folder (FasterDecoding layout), or
    eagle: Path | None = None  # an EAGLE-1 draft folder
    tree: tuple[str, ...] = ()  # tree presets or choices JSON (default DEFAULT_TREES)
    per_category: int | None = None  # the first N MT-Bench prompts of each category (None: all 10)
    max_tokens: int = 128
    max_input_len: int = 512
    threads: int | None = None
    batch: int = 1  # > 1: all prompts in flight at once (τ and identity only; the speedup is measured at batch 1)
    work: Path = Path("/tmp/trtspec-spec-eval")
    keep_engines: bool = False  # keep engines and checkpoints under work
    json: Path | None = None  # write the results here
    write_tree: Path | None = None  # write the fastest tree as tree.json into this folder

    def __post_init__(self):
        if (self.medusa is None) == (self.eagle is None):
            raise ConfigError("pass --medusa DIR or --eagle DIR (one of them)")
        for name in ("max_tokens", "max_input_len", "batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


def run_spec_eval(args: SpecEvalOptions) -> list[dict]:
    """Measure every tree (module docstring), printing each tree's line as it is measured; their summaries."""
    args.work.mkdir(parents=True, exist_ok=True)
    prompts = select_prompts(args.per_category)
    results, trees = [], args.tree or DEFAULT_TREES
    try:
        for tree in trees:  # each tree's line and the JSON as soon as it is measured
            results.append(_report_tree(args, tree, prompts, results))
    finally:
        if not args.keep_engines:
            for depth in {max(map(len, parse_tree(tree))) for tree in trees}:
                shutil.rmtree(checkpoint_dir(args, depth), ignore_errors=True)
    if args.write_tree:
        report, best = _report(args, results)
        write_tree(args.write_tree, report, best)
    return results


def _report_tree(args, tree: str, prompts, results: list[dict]) -> dict:
    """Measure one tree, print its line, rewrite the JSON report with it among `results`; return its summary."""
    r = measure(args, tree, prompts).to_dict()
    print(f"{r['tree']:<28} τ {r['acceptance_length']:.2f}  rate {r['acceptance_rate']:.2f}  "
          f"{r['spec_tokens_per_s']:.1f} vs {r['plain_tokens_per_s']:.1f} tok/s  speedup {r['speedup']:.2f}x "
          f"(decode {r['decode_speedup']:.2f}x)  identical {r['identical_outputs']}", flush=True)
    if args.json:
        report, _ = _report(args, [*results, r])
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return r


def _report(args, results: list[dict]) -> tuple[dict, dict]:
    """The JSON report over the trees measured so far, and the fastest of them."""
    best = max(results, key=lambda r: r["speedup"])
    return ({"method": "medusa" if args.medusa else "eagle", "drafter": str(args.medusa or args.eagle),
             "prompts": f"mt-bench, {args.per_category or 10} per category", "max_tokens": args.max_tokens,
             "temperature": 0, "threads": args.threads, "batch": args.batch, "results": results,
             "best": best["tree"]}, best)


def write_tree(folder: Path, report: dict, best: dict) -> None:
    """tree.json: the fastest choices and the converter setting they need, with what was measured."""
    key = "num_medusa_heads" if report["method"] == "medusa" else "num_eagle_layers"
    tree = {"choices": best["choices"], key: best["depth"], "measured": {
        "prompts": report["prompts"], "max_tokens": report["max_tokens"], "temperature": 0,
        **{k: best[k] for k in ("acceptance_length", "acceptance_rate", "speedup", "decode_speedup",
                                "identical_outputs", "tau_per_category")}}}
    (folder / "tree.json").write_text(json.dumps(tree, indent=2) + "\n")


@click.command()
@click.option("--base", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True, help="The Hugging Face base folder.")
@click.option("--medusa", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Medusa heads folder (FasterDecoding layout).")
@click.option("--eagle", type=click.Path(exists=True, file_okay=False, path_type=Path), help="EAGLE-1 draft folder.")
@click.option("--tree", multiple=True, help="A tree preset or choices JSON, repeatable (default: chain_1 chain_2 "
                                            "chain_3 [[0],[1],[0,0]] [[0],[1],[0,0],[0,0,0]]).")
@click.option("--per-category", type=click.IntRange(min=1), help="The first N MT-Bench prompts of each category "
                                                                 "(default: all 10).")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens per prompt.")
@click.option("--max-input-len", type=int, default=512, show_default=True, help="The engines' max_input_len.")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores).")
@click.option("--batch", type=int, default=1, show_default=True,
              help="> 1: all prompts in flight at once (τ and identity only; the speedup is measured at batch 1).")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=Path("/tmp/trtspec-spec-eval"), show_default=True,
              help="Checkpoints and engines.")
@click.option("--keep-engines", is_flag=True, help="Keep engines and checkpoints under --work (a rerun reuses them).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), help="Write the results here.")
@click.option("--write-tree", type=click.Path(file_okay=False, path_type=Path), help="Write the fastest tree as tree.json into this folder.")
@user_errors
def main(tree: tuple[str, ...], json_file: Path | None, **options) -> None:
    """A trained drafter's trees on MT-Bench at T = 0: per tree convert → build → generate with speculation and
    without (prompt by prompt, the order alternating): τ per category, acceptance (per position), speedup, identity.
    Each engine is deleted once measured unless --keep-engines."""
    run_spec_eval(SpecEvalOptions(tree=tree, json=json_file, **options))


if __name__ == "__main__":
    main()
