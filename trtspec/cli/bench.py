"""bench: benchmarks measured side by side in one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.cli.app import DIR, EXISTING_DIR, SPIN_HELP, _sampling_flag, cli, user_errors


class DefaultCommandGroup(click.Group):
    """A group whose first argument, when it names no subcommand, goes to its default command:
    `trtspec bench ENGINE ...` is `trtspec bench run ENGINE ...`, while `trtspec bench soak ...` stays itself."""

    def __init__(self, *args, default_command: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.default_command = default_command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in self.get_help_option_names(ctx):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


@cli.group(cls=DefaultCommandGroup, default_command="run")
def bench() -> None:
    """Benchmarks that measure side by side in one run and print ratios.

    `trtspec bench ENGINE_DIR ...` (or `--url HOST:PORT ...`) is `trtspec bench run`: plain decoding and each
    method on the same engine, TTFT / TPOT / ITL / throughput / τ / speedup per category and concurrency."""


def _csv(kind):
    """A click callback: a comma-separated list of `kind` values (None stays None)."""

    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return tuple(kind(x.strip()) for x in value.split(",") if x.strip())
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {value!r}") from None

    return parse


@bench.command("run")
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--url", help="HOST:PORT of a served ensemble's gRPC endpoint (`trtspec serve`) instead of ENGINE; with "
                           "ENGINE too (the engine that server runs): both, side by side (serving mode).")
@click.option("--serve", is_flag=True,
              help="Serving mode: deploy ENGINE, serve it on loopback for this run and measure every request in "
                   "process and through Triton (gRPC streaming), back to back: the served ÷ in-process ratio "
                   "(target ≥ 0.9 at concurrency 1), identical outputs, the engine's batching per step.")
@click.option("--prompt-set", default="mt-bench", show_default=True,
              help="mt-bench, mt-bench-2turn (in process), humaneval, sharegpt, champ, sharegpt-grounded, code-edit "
                   "(their measure split) or a .jsonl file.")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True,
              help="The set's first N prompts (its measure split's; a set stored by category, e.g. mt-bench: spread "
                   "across its categories).")
@click.option("--method", "methods", callback=_csv(str), metavar="A,B",
              help="Drafters measured beside plain decoding (default: the engine's own; served: the deployment's).")
@click.option("--concurrency", callback=_csv(int), default="1", show_default=True, metavar="1,4,16",
              help="Closed-loop users per level (in process: the in-flight batch, at most max_batch_size).")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="0 = greedy (outputs checked identical to plain decoding).",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed of every request (T > 0).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens to generate per prompt.")
@click.option("--threads", type=int, default=2, show_default=True, help="In process: ONNX Runtime intra-op threads.")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--model", default="ensemble", show_default=True, help="--url: the model to call.")
@click.option("--peers", callback=_csv(str), metavar="A,B",
              help="In process: transformers and/or onnxruntime-genai, their own speculation against their own plain "
                   "decoding on the same ids, in the same run (needs --hf).")
@click.option("--hf", type=EXISTING_DIR, help="--peers: the engine's Hugging Face model folder.")
@click.option("--peer-limit", type=click.IntRange(min=1), default=3, show_default=True,
              help="--peers: prompts the peers decode.")
@click.option("--out", type=DIR, help="Write summary.json, requests.csv and PNG plots here.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of the table.")
@click.option("--no-spec", is_flag=True, help="Plain decoding alone (e.g. the serving overhead without drafting).")
@click.option("--backoff/--no-backoff", default=True, show_default=True,
              help="Medusa, EAGLE and lookahead drafts shrink, or rest, while they do not pay; --no-backoff: the "
                   "whole tree every step.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def bench_run(engine: Path | None, url: str | None, methods, concurrency, peers, out: Path | None, as_json: bool,
              no_progress: bool, **flags) -> None:
    """Plain decoding and each --method on one engine, in process (ENGINE) or served (--url), interleaved:
    TTFT, TPOT, ITL, tokens/s (per user), request throughput, τ, acceptance (per position), speedup and
    p50/p90/p99 per category and concurrency, and how many outputs equal plain decoding's at T = 0."""
    from trtspec.bench.bench_outputs import format_table, write_outputs
    from trtspec.bench.runner import BenchOptions, run_bench

    options = BenchOptions(engine=engine, url=url, methods=methods or (), concurrency=concurrency,
                           peers=peers or (), show_progress=not no_progress, **flags)
    run = run_bench(options, show=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(run.report, indent=1) if as_json else "\n".join(format_table(run.report)))
    if out is not None:
        written = write_outputs(run, out)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)


@bench.command("perf-input")
@click.option("--prompt-set", default="mt-bench", show_default=True,
              help="A known set (its measure split; first turns) or a .jsonl file.")
@click.option("--limit", type=click.IntRange(min=1), default=16, show_default=True,
              help="The set's first N prompts (spread across its categories, as `bench --limit` takes them).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per request.")
@click.option("--method", help="trtspec's CPU flavour: the drafter every request asks for (draft_method).")
@click.option("--no-spec", is_flag=True, help="trtspec's CPU flavour: speculation off (use_speculation false).")
@click.option("--url", default="localhost:8001", show_default=True, help="The gRPC endpoint the printed command uses.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Write perf_analyzer's --input-data JSON here.")
@user_errors
def bench_perf_input(prompt_set: str, limit: int, max_tokens: int, method: str | None, no_spec: bool, url: str,
                     out: Path) -> None:
    """Write a prompt set as perf_analyzer's --input-data file and print the perf_analyzer command that measures the
    served ensemble with it (gRPC streaming, concurrency 1 to 4; `scripts/setup-load-tools.sh` installs the tool)."""
    import shlex

    from trtspec.bench.perf_analyzer import command, input_data
    from trtspec.bench.workload import load_bench_prompts
    from trtspec.outdir import atomic_output_file

    prompts = [p.text for p in load_bench_prompts(prompt_set, limit=limit, max_tokens=max_tokens)]
    with atomic_output_file(out) as tmp:
        tmp.write_text(json.dumps(input_data(prompts, max_tokens, method=method, speculation=not no_spec)) + "\n")
    click.echo(shlex.join(command(url, out, requests=len(prompts))))


@bench.command("cpu-engine")
@click.option("--work", type=DIR, help="Checkpoints, engines and the onnxruntime-genai model, kept for reruns "
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
def bench_cpu_engine(work: Path | None, as_json: bool, **options) -> None:
    """SmolLM2 plain decoding against onnxruntime-genai and transformers, the verify cost curve (a step of K + 1
    slots ÷ a 1-slot step) and decoding time per token ÷ the memory-bandwidth floor, all from one run."""
    from trtspec.bench.cpu_engine import CpuBenchOptions, render_table, run_benchmark
    from trtspec.hub.fetch import cache_dir

    report = run_benchmark(CpuBenchOptions(work=work or cache_dir() / "bench" / "cpu-engine", **options))
    click.echo(json.dumps(report, indent=2, default=str) if as_json else render_table(report))


def _pair(ctx, param, value):
    """N,K → (N, K)."""
    try:
        n, k = (int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected two integers N,K, got {value!r}") from None
    return n, k


@bench.command("drafting")
@click.argument("engines", nargs=-1, required=True, type=EXISTING_DIR)
@click.option("--sets", callback=_csv(str), default="sharegpt-grounded,code-edit,mt-bench-2turn,mt-bench",
              show_default=True, help="Prompt sets (their measure splits where they have one).")
@click.option("--methods", callback=_csv(str), default="ngram", show_default=True,
              help="Drafters; METHOD:full runs METHOD's whole tree every step (no back-off), e.g. "
                   "lookahead,lookahead:full.")
@click.option("--datastore", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Method suffix: the corpus it looks up (`trtspec datastore build`); it also learns from its own "
                   "earlier outputs.")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True, help="Prompts per set.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="New tokens per prompt.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="ONNX Runtime intra-op threads.")
@click.option("--spin/--no-spin", default=None,
              help="Workers spin between ops (default: the engine's: spin, unless its drafter runs in a second "
                   "session; pass --no-spin with several engines in one process).")
@click.option("--peers", callback=_csv(str), default="", help="Peers' own speculation beside ours: transformers, "
                                                             "onnxruntime-genai, openvino (OpenVINO GenAI at the first "
                                                             "engine's weight format; PEERS=openvino bash "
                                                             "scripts/setup-peers.sh installs it) (needs --hf).")
@click.option("--hf", type=EXISTING_DIR, help="The Hugging Face folder of the engine's model (for --peers).")
@click.option("--peer-limit", type=click.IntRange(min=1), default=3, show_default=True,
              help="Prompts per set for the peers (slow).")
@click.option("--prompt-lookup", type=click.IntRange(min=1), default=10, show_default=True,
              help="transformers' prompt_lookup_num_tokens.")
@click.option("--genai-lookup", callback=_pair, default="3,4", show_default=True, metavar="N,K",
              help="onnxruntime-genai n-gram speculation: ngram_size, max_draft_tokens.")
@click.option("--openvino-lookup", callback=_pair, default="3,5", show_default=True, metavar="N,K",
              help="OpenVINO GenAI prompt lookup: max_ngram_size, num_assistant_tokens.")
@click.option("--work", type=DIR, help="Logs and builds of the peers (default: the cache's bench/drafting).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report as JSON here.")
@user_errors
def bench_drafting(engines: tuple[Path, ...], peers, hf: Path | None, json_file: Path | None, **options) -> None:
    """Drafters against plain decoding on real prompt sets (grounded, MT-Bench 2-turn), alternating prompt by
    prompt, several engines of one model side by side, with the peers' own speculation.

    Method suffix looks up --datastore and its own earlier outputs in the same set; mt-bench-2turn measures the second
    turn after the engine's own plain first answer. `trtspec bench ENGINE --method ...` measures latency
    percentiles and concurrency on one set; this command the drafters across sets and engines."""
    from trtspec.bench.drafting import PEERS, format_report, run_benchmark

    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise click.BadParameter(f"unknown peer {unknown[0]} (known: {', '.join(PEERS)})", param_hint="--peers")
    if peers and hf is None:
        raise click.UsageError("--peers needs --hf DIR (the model's Hugging Face folder)")
    report = run_benchmark(list(engines), peers=peers, hf=hf, show=lambda line: click.echo(line, err=True),
                           **options)
    click.echo(format_report(report))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2) + "\n")


@bench.command("serving")
@click.argument("engine", type=EXISTING_DIR)
@click.option("--prompt-set", "--prompts", "prompt_set", default="mt-bench", show_default=True,
              help="A known prompt set or a .jsonl file.")
@click.option("--limit", type=click.IntRange(min=1), default=16, show_default=True, help="Prompts.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per prompt.")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Concurrent gRPC streams beside in-process in-flight batching of the same prompts (and 1).")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="ONNX Runtime intra-op threads (in process and in the server).")
@click.option("--method", "methods", callback=_csv(str), metavar="A,B",
              help="Drafters beside plain decoding (default: the engine's own, if it has one).")
@click.option("--no-spec", is_flag=True, help="Plain decoding alone.")
@click.option("--unary", is_flag=True,
              help="Instead: --limit concurrent unary requests (a --no-decoupled deployment) against as many streams.")
@click.option("--out", type=DIR, help="Write summary.json, requests.csv and PNG plots here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def bench_serving(engine: Path, prompt_set: str, limit: int, max_tokens: int, concurrency: int, threads: int,
                  methods, no_spec: bool, unary: bool, out: Path | None, as_json: bool, no_progress: bool) -> None:
    """Serving overhead on one engine: `trtspec bench ENGINE --serve --concurrency 1,N` (Triton gRPC streaming
    against in-process generate, back to back, at concurrency 1 — target ratio >= 0.9 — and N, with how many
    sequences the engine batched per step). --unary compares unary requests with streams instead."""
    from trtspec.bench import serving

    show = lambda line: click.echo(line, err=True)  # noqa: E731
    if unary:
        report = serving.unary_vs_streaming(engine, prompt_set=prompt_set, limit=limit, max_tokens=max_tokens,
                                            threads=threads, show=show)
        click.echo(json.dumps(report, indent=2) if as_json else serving.format_unary(report))
        return
    from trtspec.bench.bench_outputs import format_table, write_outputs
    from trtspec.bench.runner import BenchOptions, run_bench

    options = BenchOptions(engine=engine, serve=True, prompt_set=prompt_set, limit=limit, max_tokens=max_tokens,
                           concurrency=tuple(dict.fromkeys((1, concurrency))), threads=threads,
                           methods=methods or (), no_spec=no_spec, show_progress=not no_progress)
    run = run_bench(options, show=show)
    click.echo(json.dumps(run.report, indent=1) if as_json else "\n".join(format_table(run.report)))
    if out is not None:
        written = write_outputs(run, out)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)


@bench.command("trees")
@click.option("--base", type=EXISTING_DIR, required=True, help="The Hugging Face base folder.")
@click.option("--medusa", type=EXISTING_DIR, help="Medusa heads folder (FasterDecoding layout).")
@click.option("--eagle", type=EXISTING_DIR, help="EAGLE-1 draft folder.")
@click.option("--tree", multiple=True, help="A tree preset or choices JSON, repeatable (default: chain_1 chain_2 "
                                            "chain_3 [[0],[1],[0,0]] [[0],[1],[0,0],[0,0,0]]).")
@click.option("--per-category", type=click.IntRange(min=1), help="The first N MT-Bench prompts of each category "
                                                                 "(default: all 10).")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens per prompt.")
@click.option("--max-input-len", type=int, default=512, show_default=True, help="The engines' max_input_len.")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores).")
@click.option("--batch", type=int, default=1, show_default=True,
              help="> 1: all prompts in flight at once (τ and identity only; the speedup is measured at batch 1).")
@click.option("--work", type=DIR, default=Path("/tmp/trtspec-spec-eval"), show_default=True,
              help="Checkpoints and engines.")
@click.option("--keep-engines", is_flag=True, help="Keep engines and checkpoints under --work (a rerun reuses them).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), help="Write the results here.")
@click.option("--write-tree", type=DIR, help="Write the fastest tree as tree.json into this folder.")
@user_errors
def bench_trees(tree: tuple[str, ...], json_file: Path | None, **options) -> None:
    """A trained drafter's trees on MT-Bench at T = 0: per tree convert → build → generate with speculation and
    without (prompt by prompt, the order alternating): τ per category, acceptance (per position), speedup, identity.
    Each engine is deleted once measured unless --keep-engines."""
    from trtspec.bench.spec_eval import SpecEvalOptions, run_spec_eval

    run_spec_eval(SpecEvalOptions(tree=tree, json=json_file, **options))


@bench.command("soak")
@click.argument("url", required=False)
@click.option("--repo", type=EXISTING_DIR,
              help="Serve this model repository here (`trtspec serve` on free loopback ports) instead of URL; "
                   "needed for --sigterm.")
@click.option("--users", type=click.IntRange(min=1), default=16, show_default=True,
              help="Concurrent users, each its own gRPC connection and stream.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="How long the load runs (then its last requests finish).")
@click.option("--max-requests", type=click.IntRange(min=1), help="Stop the load after this many requests too.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens per request (greedy).")
@click.option("--prompt-set", default="mt-bench", show_default=True,
              help="Real prompts: mt-bench, humaneval, sharegpt, champ, sharegpt-grounded, code-edit or a .jsonl.")
@click.option("--prompts", type=click.IntRange(min=1), default=16, show_default=True,
              help="Distinct prompts (the set's first N), cycled; each is served alone first for its reference.")
@click.option("--abandon", type=click.IntRange(min=0), default=0, show_default=True,
              help="Streams whose client process dies mid-stream (connection dropped), at the end of the load.")
@click.option("--cancel", type=click.IntRange(min=0), default=0, show_default=True,
              help="Streams the client cancels mid-stream (stop_stream(cancel_requests=True)), with --abandon's.")
@click.option("--fault-max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens a faulted stream asks for (it would run on for them were it not stopped).")
@click.option("--sigterm", is_flag=True, help="--repo: SIGTERM `serve` mid-load at the end; report how long it took "
                                              "to exit and its exit status (else it is stopped idle).")
@click.option("--drain-seconds", "drain_s", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="--repo: serve's --drain-seconds.")
@click.option("--metrics-url", help="URL mode: Triton's metrics (default http://HOST:8002/metrics).")
@click.option("--server-pid", type=int,
              help="URL mode: the tritonserver process whose memory to sample (default: the one on URL's port).")
@click.option("--allow-remote", is_flag=True, help="Allow a URL that is not a loopback address.")
@click.option("--model", default="ensemble", show_default=True, help="The model to call.")
@click.option("--request-timeout", "request_timeout_s", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds a request may wait for a response before it counts as an error.")
@click.option("--out", type=DIR, help="Write report.json, requests.csv and soak.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (without the samples).")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed.")
@user_errors
def bench_soak(url: str | None, as_json: bool, check: bool, **flags) -> None:
    """Soak a served deployment: USERS streams of real prompts for MINUTES, every greedy output checked against
    the prompt served alone, the server's memory and /metrics sampled, faults injected on request.

    URL is HOST:PORT of a running server's gRPC endpoint (loopback unless --allow-remote), or use --repo."""
    from trtspec.bench.soak import SoakOptions, run_soak
    from trtspec.bench.soak_report import format_report

    report = run_soak(SoakOptions(url=url, **flags), show=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(report.to_dict(samples=False), indent=2))
    else:
        for line in format_report(report):
            click.echo(line)
        if flags.get("out"):
            click.echo(f"wrote {flags['out']}/report.json, requests.csv, soak.png")
    if check and not report.passed:
        missed = ", ".join(t["name"] for t in report.targets if not t["ok"])
        click.echo(f"error: targets missed: {missed}", err=True)
        sys.exit(1)


@bench.command("quality")
@click.argument("engines", nargs=-1, required=True, type=EXISTING_DIR)
@click.option("--reference", required=True, type=EXISTING_DIR,
              help="The engine to compare with (the fp32 build of the same model).")
@click.option("--corpus", "corpora", multiple=True, type=click.Choice(["sharegpt", "humaneval"]),
              help="Corpora to score (default both): held-out ShareGPT replies, HumanEval solutions.")
@click.option("--samples", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per corpus.")
@click.option("--max-target", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens scored per text.")
@click.option("--max-context", type=click.IntRange(min=1), default=512, show_default=True,
              help="Skip texts whose context is longer (tokens).")
@click.option("--greedy-prompts", type=click.IntRange(min=0), default=4, show_default=True,
              help="Contexts per corpus decoded free-running (greedy) by every engine.")
@click.option("--greedy-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens each free-running decode generates.")
@click.option("--threads", type=click.IntRange(min=1), help="ONNX Runtime threads (default: the cores).")
@click.option("--out", type=DIR, help="Also write report.json here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def bench_quality(engines: tuple, reference, corpora: tuple[str, ...], out, as_json: bool, **flags) -> None:
    """Perplexity, top-1 agreement and free-running greedy divergence of ENGINES against --reference on the same
    held-out text (quantized builds against fp32)."""
    from trtspec.bench.quality import QualityOptions, format_report, measure_quality
    from trtspec.outdir import atomic_output_file

    options = QualityOptions(corpora=corpora or ("sharegpt", "humaneval"), **flags)
    report = measure_quality(list(engines), reference, options, show=lambda line: click.echo(line, err=True))
    if out is not None:
        with atomic_output_file(out / "report.json") as tmp:
            tmp.write_text(json.dumps(report.to_dict(), indent=2))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in format_report(report):
            click.echo(line)
