"""Benchmark the CPU engine on the real model (SmolLM2-135M, fp32), all numbers from one run on this machine:
plain decoding against onnxruntime-genai and transformers, the verify cost curve (a step of K + 1 slots ÷ a
1-slot step), and decoding time per token ÷ the memory-bandwidth floor.

    .venv/bin/python benchmarks/cpu_engine.py [--work DIR] [--prompts 10] [--max-tokens 128] [--threads 2]
        [--rounds 2] [--spin both|on|off] [--skip-peers] [--json] [--png FILE]

trtspec's workers spin between ops by default, as onnxruntime-genai's do (ONNX Runtime's default). `--spin both`
(the default) decodes with trtspec twice, as it ships and with `--no-spin` (the setting for shared machines), so
what sleeping workers cost is measured in the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root on the path, for benchmarks.floors
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import floors  # noqa: E402
from benchmarks.floors import BANDWIDTH_REPEATS, read_bandwidth  # noqa: E402, F401 (a child runner)
from trtspec.bench.peers import (GENAI_INSTALL, GENAI_MODULES, TRANSFORMERS_INSTALL, TRANSFORMERS_MODULES,  # noqa: E402
                                 alternate, build_genai_model, missing_modules, run_child, sample)
from trtspec.cli.app import user_errors  # noqa: E402
from trtspec.errors import ConfigError  # noqa: E402
from trtspec.progress import progress_bar  # noqa: E402
from trtspec.speculative.method import PLAIN  # noqa: E402

MODEL = "smollm2-135m"
CURVE_KS = (0, 1, 3, 7, 15, 31, 63)  # K + 1 = 1, 2, 4, ..., 64 slots per step
NO_SPIN = "trtspec --no-spin"  # the row decoded with sleeping workers (shared machines)
SYSTEMS = {  # name in the table → (runner, what to install when missing)
    "trtspec": ("benchmarks.cpu_engine:run_trtspec", ()),
    NO_SPIN: ("benchmarks.cpu_engine:run_trtspec", ()),
    "onnxruntime-genai": ("trtspec.bench.peers:run_genai", GENAI_MODULES),
    "transformers": ("trtspec.bench.peers:run_transformers", TRANSFORMERS_MODULES),
}
INSTALL_HINTS = {"onnxruntime-genai": GENAI_INSTALL, "transformers": TRANSFORMERS_INSTALL}
TARGETS = {"onnxruntime-genai": 1.0, "transformers": 3.0, "floor": 1.2}


# ---- engines ------------------------------------------------------------------------------------------------

def build_engines(base: Path, work: Path, *, ks=CURVE_KS, max_input_len: int = 512, max_seq_len: int = 1024,
                  rebuild: bool = False, show_progress: bool = True) -> dict[int, Path]:
    """Build one engine per K: K = 0 from the plain checkpoint, K > 0 from a Medusa checkpoint with one untrained
    head, a one-node tree and --max-draft-len K (so the generation graph has K + 1 slots). Reuse current ones."""
    from trtspec import ConvertOptions, convert
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.train.init_heads import write_initial_medusa_heads

    ckpts = {"plain": work / "ckpt-plain", "medusa": work / "ckpt-medusa"}
    if rebuild or not (ckpts["medusa"] / "config.json").is_file():
        heads = write_initial_medusa_heads(base, work / "medusa-heads", num_heads=1, force=True)
        for name, medusa in (("plain", None), ("medusa", heads)):
            convert(ConvertOptions(base=base, out=ckpts[name], medusa=medusa, force=True), show_progress=False)
    engines = {}
    with progress_bar("build engines", total=len(ks), enabled=show_progress) as advance:
        for k in ks:
            out, spec = work / f"engine-k{k}", ({"choices": "[[0]]", "max_draft_len": k} if k else {})
            if rebuild or not _is_current(out, k, max_input_len, max_seq_len):
                build(BuildOptions(source=ckpts["medusa" if k else "plain"], out=out, max_input_len=max_input_len,
                                   max_seq_len=max_seq_len, force=True, **spec))
            engines[k] = out
            advance()
    return engines


def _is_current(engine_dir: Path, k: int, max_input_len: int, max_seq_len: int) -> bool:
    """Whether `engine_dir` holds an engine of this profile that this trtspec runs: read_manifest refuses an
    older graph format (or a missing or broken engine), which is then rebuilt."""
    from trtspec.engine.manifest import read_manifest
    from trtspec.errors import TrtspecError

    try:
        p = read_manifest(engine_dir).profile
    except (TrtspecError, OSError):
        return False
    return (p.max_draft_len, p.max_input_len, p.max_seq_len) == (k, max_input_len, max_seq_len)


def prompt_token_ids(model_dir: Path, count: int) -> list[list[int]]:
    """The first `count` MT-Bench writing prompts (first turn) through the model's chat template."""
    from trtspec.data.prompts import load_prompts
    from trtspec.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    return [tokenizer.encode_chat(list(p.messages)) for p in load_prompts("mt-bench", category="writing",
                                                                           limit=count)]


# ---- physics ------------------------------------------------------------------------------------------------

def verify_curve(engines: dict, *, past: int = 256, repeats: int = 20, warmup: int = 3,
                 threads: int = 2) -> list[dict]:
    """Median time of one `verify` of K + 1 chain slots on a sequence prefilled to `past`, per engine, and its
    ratio to the K = 0 (1-slot) step. `engines` maps K → engine dir; K = 0 must be among them."""
    from trtspec.runtime.ort_engine import OrtEngine

    rng = np.random.default_rng(0)
    points = []
    for k, engine_dir in sorted((int(k), v) for k, v in engines.items()):
        engine = OrtEngine(engine_dir, threads=threads)
        seq = engine.open()
        engine.prefill(seq, rng.integers(0, engine.vocab_size, past))
        n = k + 1  # root + a chain of K draft tokens at depths 0..K, each seeing its ancestors
        args = (rng.integers(0, engine.vocab_size, n), np.arange(n), np.tril(np.ones((n, n), bool)))
        times = []
        for _ in range(warmup + repeats):
            start = time.perf_counter()
            engine.verify(seq, *args)  # uncommitted: the cache stays at `past` for every repeat
            times.append(time.perf_counter() - start)
        engine.close(seq)
        del engine
        points.append({"k": k, "slots": n, "ms": 1000 * statistics.median(times[warmup:])})
    base = {p["k"]: p["ms"] for p in points}[0]
    return [{**p, "ratio": p["ms"] / base} for p in points]


# ---- decoding side by side ----------------------------------------------------------------------------------

def decode_runs(jobs: dict[str, tuple[str, dict]], *, rounds: int, prompts: int, threads: int, log: Path,
                show_progress: bool = True) -> dict[str, list[dict]]:
    """Run each system's runner once per round in a child process, reversing the order every other round."""
    samples = {name: [] for name in jobs}
    with progress_bar("decode", total=len(jobs) * rounds * prompts, enabled=show_progress) as advance:
        for r in range(rounds):
            for name in list(jobs)[::-1 if r % 2 else 1]:
                function, kwargs = jobs[name]
                rows = run_child(function, kwargs, log=log, threads=threads, on_row=lambda row: advance())
                samples[name] += [{**row["runs"][PLAIN], "prompt": row["prompt"], "round": r} for row in rows]
    return samples


def summarize(samples: list[dict]) -> dict:
    """Medians over prompts × rounds: decode rate (generated − 1) / (total − ttft), end-to-end rate, TTFT."""
    decode = [(len(s["output_ids"]) - 1) / (s["total_s"] - s["ttft_s"]) for s in samples
              if len(s["output_ids"]) > 1]
    return {"samples": len(samples), "decode_tps": statistics.median(decode),
            "e2e_tps": statistics.median(len(s["output_ids"]) / s["total_s"] for s in samples),
            "ttft_ms": 1000 * statistics.median(s["ttft_s"] for s in samples),
            "tokens": statistics.median(len(s["output_ids"]) for s in samples)}


def identical_outputs(samples: dict[str, list[dict]]) -> dict:
    """Per prompt, whether every system (and every round) produced the same greedy token ids; for the others,
    which systems agree with each other and the first token index where the outputs part."""
    outputs: dict[int, dict[tuple, set]] = {}
    for name, rows in samples.items():
        for row in rows:
            outputs.setdefault(row["prompt"], {}).setdefault(tuple(row["output_ids"]), set()).add(name)
    differ = []
    for prompt, seen in sorted(outputs.items()):
        if len(seen) > 1:
            ids = list(seen)
            first = min(next((i for i, (a, b) in enumerate(zip(x, ids[0])) if a != b), min(len(x), len(ids[0])))
                        for x in ids[1:])
            groups = sorted(sorted(names) for names in seen.values())
            differ.append({"prompt": prompt, "first_diff": first, "groups": groups})
    return {"identical": len(outputs) - len(differ), "prompts": len(outputs), "differ": differ}


# ---- report -------------------------------------------------------------------------------------------------

def render_table(report: dict) -> str:
    """The results as plain text: decoding rows and ratios, the verify curve, the bandwidth floor."""
    s, lines = report["settings"], []
    lines.append(f"SmolLM2-135M fp32, {s['threads']} threads, {s['prompts']} MT-Bench writing prompts × "
                 f"{s['rounds']} rounds, greedy, max {s['max_tokens']} new tokens (medians)")
    if load := s.get("load_average"):
        lines.append(f"load average (1, 5, 15 min) before {_loads(load['before'])}, after {_loads(load['after'])} "
                     f"on {s['cpus']} CPUs: other work skews every figure, the ratios least")
    lines.append(f"{'system':<20}{'decode tok/s':>14}{'e2e tok/s':>11}{'TTFT ms':>9}{'samples':>9}")
    for name, row in report["decode"].items():
        lines.append(f"{name:<20}{row['decode_tps']:>14.1f}{row['e2e_tps']:>11.1f}{row['ttft_ms']:>9.0f}"
                     f"{row['samples']:>9}")
    for name, hint in report["skipped"].items():
        lines.append(f"{name:<20}  skipped: not installed ({hint})")
    ours = "trtspec" if "trtspec" in report["decode"] else NO_SPIN
    for name, ratio in report["ratios"].items():
        lines.append(f"{ours} ÷ {name}: {ratio:.2f}× decode (target ≥ {TARGETS[name]:.1f}×)")
    for name, ratio in report.get("ratios_no_spin", {}).items():
        lines.append(f"{NO_SPIN} ÷ {name}: {ratio:.2f}× decode (sleeping workers, for shared machines)")
    if (same := report.get("identical")) is not None:
        lines.append(f"greedy outputs token-identical across {', '.join(report['decode'])}: "
                     f"{same['identical']}/{same['prompts']} prompts")
        for d in same["differ"]:
            lines.append(f"  prompt {d['prompt']}: {' ≠ '.join(', '.join(g) for g in d['groups'])} "
                         f"from generated token {d['first_diff']}")
    lines.append("")
    lines.append(f"verify cost curve (P = {s['past']}, median of {s['repeats']}): slots  ms  ÷ 1-slot step")
    lines += [f"  {p['slots']:>3} {p['ms']:8.2f} {p['ratio']:6.2f}×" for p in report["curve"]]
    f = report["floor"]
    lines.append("")
    lines.append(f"bandwidth floor: {f['weight_bytes'] / 1e6:.0f} MB of weights (weights.bin) per token ÷ "
                 f"{f['gbps']:.1f} GB/s ({f['method']}, {s['threads']} threads, {f['buffer_mb']} MB, best of "
                 f"{s['bandwidth_repeats']}) = {f['floor_ms']:.1f} ms/token")
    lines.append(f"{ours} plain decoding {f['decode_ms']:.1f} ms/token = {f['ratio']:.2f}× the floor "
                 f"(target ≤ {TARGETS['floor']:.1f}×); numpy {f['numpy_gbps']:.1f} GB/s, onnxruntime ReduceSum "
                 f"{f['onnxruntime_gbps']:.1f} GB/s")
    if sleeping := f.get("no_spin"):
        lines.append(f"{NO_SPIN} {sleeping['decode_ms']:.1f} ms/token = {sleeping['ratio']:.2f}× the floor")
    return "\n".join(lines)


def _loads(values) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def plot_curve(curve: list[dict], png: Path, *, past: int) -> None:
    """Write the verify cost curve (step time ÷ 1-slot step against slots) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    slots = [p["slots"] for p in curve]
    ax.plot(slots, [p["ratio"] for p in curve], "o-", label="trtspec generation step")
    ax.plot(slots, slots, ":", color="grey", label="cost ∝ slots")
    ax.set(xscale="log", yscale="log", xlabel="slots per step (K + 1)", ylabel="step time ÷ 1-slot step",
           title=f"SmolLM2-135M fp32, verify cost at P = {past}")
    ax.set_xticks(slots, [str(s) for s in slots])
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


# ---- command line -------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CpuBenchOptions:
    work: Path  # checkpoints, engines and the onnxruntime-genai model (kept for reruns)
    prompts: int = 10  # MT-Bench writing prompts decoded
    max_tokens: int = 128
    threads: int = 2  # intra-op threads of every system
    rounds: int = 2  # rounds over all systems, the order reversed each round
    past: int = 256  # the verify curve's prefilled length
    repeats: int = 20  # timed steps per point of the verify curve
    spin: str = "both"  # trtspec's workers: on (as shipped, as onnxruntime-genai), off (--no-spin), both
    skip_peers: bool = False
    rebuild: bool = False
    png: Path | None = None  # the verify cost curve plot

    def __post_init__(self):
        for name in ("prompts", "max_tokens", "threads", "rounds", "past", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.spin not in SPIN_CHOICES:
            raise ConfigError(f"--spin must be one of {', '.join(SPIN_CHOICES)}, got {self.spin!r}")


SPIN_CHOICES = ("both", "on", "off")


def run_benchmark(args: CpuBenchOptions) -> dict:
    """Build what is missing, then measure decoding, the verify curve and the bandwidth, each in a child."""
    from trtspec.hub.fetch import fetch_model

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    load = {"before": os.getloadavg()}  # other work on the machine skews every figure; say how much there was
    log = work / "children.log"
    log.write_text("")
    base = fetch_model(MODEL)
    engines = build_engines(base, work, rebuild=args.rebuild)
    prompts = prompt_token_ids(base, args.prompts)
    jobs, skipped = _decode_jobs(args, base, engines[0], prompts, log)
    samples = decode_runs(jobs, rounds=args.rounds, prompts=len(prompts), threads=args.threads, log=log)
    decode = {name: summarize(rows) for name, rows in samples.items()}
    curve = run_child("benchmarks.cpu_engine:verify_curve", {
        "engines": {k: str(v) for k, v in engines.items()}, "past": args.past, "repeats": args.repeats,
        "threads": args.threads}, log=log, threads=args.threads)
    (bandwidth,) = run_child("benchmarks.cpu_engine:read_bandwidth", {
        "threads": args.threads, "repeats": BANDWIDTH_REPEATS}, log=log, threads=args.threads)
    load["after"] = os.getloadavg()
    if args.png:
        plot_curve(curve, args.png, past=args.past)
    settings = {**{k: v for k, v in asdict(args).items() if k != "rebuild"}, "work": str(work),
                "png": str(args.png) if args.png else None, "bandwidth_repeats": BANDWIDTH_REPEATS,
                "load_average": load, "cpus": os.cpu_count()}
    ours = "trtspec" if "trtspec" in decode else NO_SPIN  # the row the targets are judged on: as shipped
    peers = {name: row for name, row in decode.items() if name not in ("trtspec", NO_SPIN)}
    report = {"settings": settings, "decode": decode, "skipped": skipped,
              "ratios": {name: decode[ours]["decode_tps"] / row["decode_tps"] for name, row in peers.items()},
              "identical": identical_outputs(samples) if len(samples) > 1 else None, "curve": curve,
              "floor": bandwidth_floor(engines[0] / "weights.bin", bandwidth, decode[ours]["decode_tps"]),
              "outputs": {name: [r["output_ids"] for r in rows if r["round"] == 0] for name, rows in samples.items()}}
    if ours != NO_SPIN and NO_SPIN in decode:
        report["ratios_no_spin"] = {name: decode[NO_SPIN]["decode_tps"] / row["decode_tps"]
                                    for name, row in peers.items()}
        sleeping = bandwidth_floor(engines[0] / "weights.bin", bandwidth, decode[NO_SPIN]["decode_tps"])
        report["floor"]["no_spin"] = {k: sleeping[k] for k in ("decode_ms", "ratio")}
    return report


def bandwidth_floor(weights: Path, bandwidth: dict, decode_tps: float) -> dict:
    """Decoding time per token ÷ the time to read every weight once at the measured bandwidth."""
    weight_bytes = Path(weights).stat().st_size  # the tied lm_head / embedding is stored (and read) once
    return {**bandwidth, **floors.bandwidth_floor(weight_bytes, bandwidth["gbps"], decode_tps)}


def run_trtspec(engine: str, prompts: list[list[int]], *, max_tokens: int, threads: int,
                spin: bool | None = None):
    """Plain greedy decoding (speculation off) with trtspec's LocalGenerator, as `trtspec.bench.peers.alternate`'s
    rows; ttft and total as it measures them. `spin` sets TRTSPEC_ORT_SPIN for this process (None: as the
    environment has it)."""
    from trtspec.model.ort_session import SPIN_ENV
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    if spin is not None:
        os.environ[SPIN_ENV] = "1" if spin else "0"
    generator = LocalGenerator(engine, threads=threads)

    def generate(ids: list[int], new_tokens: int) -> dict:
        result = generator.generate(ids, GenerationConfig(max_tokens=new_tokens, no_spec=True)).result
        return sample(result.output_ids, 0.0, result.ttft_s, result.total_s)

    yield from alternate(prompts, max_tokens, {PLAIN: generate})


def _decode_jobs(args, base: Path, engine: Path, prompts: list[list[int]], log: Path):
    """The runner and source of each installed system; the missing peers with how to install them."""
    sources = {"trtspec": lambda: engine, NO_SPIN: lambda: engine,
               "onnxruntime-genai": lambda: build_genai_model(base, args.work / "genai-fp32",
                                                              log=args.work / "genai-build.log"),
               "transformers": lambda: base}
    jobs, skipped = {}, {}
    spin = {"trtspec": True, NO_SPIN: False}
    for name, (function, modules) in SYSTEMS.items():
        if (name == "trtspec" and args.spin == "off") or (name == NO_SPIN and args.spin == "on"):
            continue
        if name not in spin and args.skip_peers:
            continue
        if missing := missing_modules(modules):
            skipped[name] = f"{', '.join(missing)} missing: {INSTALL_HINTS[name]}"
            print(f"skipping {name}: {skipped[name]}", file=sys.stderr)
            continue
        kwargs = {"prompts": prompts, "max_tokens": args.max_tokens, "threads": args.threads}
        if name in spin:
            jobs[name] = (function, {"engine": str(sources[name]()), **kwargs, "spin": spin[name]})
        else:
            jobs[name] = (function, {"model": str(sources[name]()), **kwargs})
    return jobs, skipped


@click.command()
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), help="Checkpoints, engines and the onnxruntime-genai model, kept for reruns "
                                       "(default: the cache's bench/cpu-engine).")
@click.option("--prompts", type=int, default=10, show_default=True, help="MT-Bench writing prompts to decode.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="New tokens per prompt.")
@click.option("--threads", type=int, default=2, show_default=True, help="Intra-op threads of every system.")
@click.option("--rounds", type=int, default=2, show_default=True,
              help="Rounds over all systems, the order reversed each round.")
@click.option("--past", type=int, default=256, show_default=True, help="Prefilled length of the verify curve.")
@click.option("--repeats", type=int, default=20, show_default=True, help="Timed steps per point of the verify curve.")
@click.option("--spin", type=click.Choice(["both", "on", "off"]), default="both", show_default=True,
              help="trtspec's intra-op workers: on = as shipped (spinning, as onnxruntime-genai), off = "
                   "--no-spin (sleeping between ops, for shared machines), both = one row each.")
@click.option("--skip-peers", is_flag=True, help="Decode with trtspec only.")
@click.option("--rebuild", is_flag=True, help="Rebuild checkpoints and engines.")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Write the verify cost curve plot here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def main(work: Path | None, as_json: bool, **options) -> None:
    """SmolLM2 plain decoding against onnxruntime-genai and transformers, the verify cost curve (a step of K + 1
    slots ÷ a 1-slot step) and decoding time per token ÷ the memory-bandwidth floor, all from one run."""
    from trtspec.hub.fetch import cache_dir

    report = run_benchmark(CpuBenchOptions(work=work or cache_dir() / "bench" / "cpu-engine", **options))
    click.echo(json.dumps(report, indent=2, default=str) if as_json else render_table(report))


if __name__ == "__main__":
    main()
