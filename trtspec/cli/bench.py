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
    method on the same engines, per request (one engine or a server) or compared across engines, prompt sets and
    peers."""


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


def _pair(ctx, param, value):
    """N,K → (N, K)."""
    try:
        n, k = (int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected two integers N,K, got {value!r}") from None
    return n, k


@bench.command("run")
@click.argument("engines", nargs=-1, type=EXISTING_DIR)
@click.option("--url", help="HOST:PORT of a served ensemble's gRPC endpoint (`trtspec serve`) instead of ENGINE; with "
                           "ENGINE too (the engine that server runs): both, side by side (serving mode).")
@click.option("--serve", is_flag=True,
              help="Serving mode: deploy ENGINE, serve it on loopback for this run and measure every request in "
                   "process and through Triton (gRPC streaming), back to back: the served ÷ in-process ratio "
                   "(target ≥ 0.9 at concurrency 1), identical outputs, the engine's batching per step.")
@click.option("--prompt-set", help="Requests: mt-bench (default), mt-bench-2turn (in process), humaneval, sharegpt, "
                                   "champ, sharegpt-grounded, code-edit (their measure split) or a .jsonl file.")
@click.option("--sets", callback=_csv(str), metavar="A,B",
              help="Compare over these prompt sets (default with several ENGINES or --peers: sharegpt-grounded, "
                   "code-edit, mt-bench-2turn, mt-bench; mt-bench-2turn: the second turn after the first ENGINE's "
                   "greedy first answer).")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True,
              help="Prompts per set (its measure split's first N; a set stored by category: spread across them).")
@click.option("--method", "--methods", "methods", callback=_csv(str), metavar="A,B",
              help="Drafters beside plain decoding (default: the engine's own; served: the deployment's; compare: "
                   "ngram, and each engine's own). Compare: METHOD:full runs METHOD's whole tree every step.")
@click.option("--concurrency", callback=_csv(int), default="1", show_default=True, metavar="1,4,16",
              help="Requests: closed-loop users per level (in process: the in-flight batch).")
@click.option("--request-rate", callback=_csv(float), metavar="0.5,1,2",
              help="Requests, --url: open-loop levels, requests per second arriving as a Poisson process (seeded), "
                   "each sent at its arrival; with it, closed-loop levels run only if --concurrency is given.")
@click.option("--draft-budget", type=int, metavar="N",
              help="Requests, in process: ngram, suffix, hybrid's n-grams and lookahead draft at most N tokens a "
                   "step (as `deploy --draft-budget N` serves them; default: the engine's K).")
@click.option("--goodput", metavar="ttft:MS,tpot:MS,e2el:MS",
              help="--request-rate: count as good the requests within these SLOs, and report good requests/s.")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Requests: 0 = greedy (outputs checked identical to plain decoding).",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed of every request (T > 0).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens to generate per prompt.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="ONNX Runtime intra-op threads (compare: every system's).")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--model", default="ensemble", show_default=True, help="--url: the model to call.")
@click.option("--no-spec", is_flag=True, help="Requests: plain decoding alone (e.g. the serving overhead).")
@click.option("--backoff/--no-backoff", default=True, show_default=True,
              help="Medusa, EAGLE and lookahead drafts shrink, or rest, while they do not pay; --no-backoff: the "
                   "whole tree every step.")
@click.option("--datastore", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Compare: method suffix's corpus (`trtspec datastore build`).")
@click.option("--peers", callback=_csv(str), metavar="A,B",
              help="Compare against transformers, onnxruntime-genai, llama.cpp, openvino: each at every ENGINE "
                   "weight format it runs, plain and with its own prompt lookup, on the same ids (needs --hf; "
                   "`bash scripts/setup-peers.sh` installs llama.cpp and OpenVINO GenAI).")
@click.option("--hf", type=EXISTING_DIR, help="--peers: the engines' Hugging Face model folder.")
@click.option("--gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--peers llama.cpp: its model (default: the GGUF the --hf folder was converted from).")
@click.option("--peer-limit", type=click.IntRange(min=1), help="--peers: prompts per set the peers decode (all).")
@click.option("--transformers-lookup", type=click.IntRange(min=1), default=10, show_default=True,
              help="transformers' prompt_lookup_num_tokens.")
@click.option("--genai-lookup", callback=_pair, default="3,4", show_default=True, metavar="N,K",
              help="onnxruntime-genai's n-gram speculation: ngram_size, max_draft_tokens.")
@click.option("--llama-lookup", callback=_pair, default="2,2", show_default=True, metavar="N,K",
              help="llama.cpp's prompt lookup: max_ngram_size, num_pred_tokens.")
@click.option("--openvino-lookup", callback=_pair, default="3,5", show_default=True, metavar="N,K",
              help="OpenVINO GenAI's prompt lookup: max_ngram_size, num_assistant_tokens.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Compare: rounds over all systems, the order reversed every other round.")
@click.option("--curves", is_flag=True, help="Compare: measure each engine's verify cost curve (its drafters then "
                                             "budget with it).")
@click.option("--past", type=click.IntRange(min=1), default=256, show_default=True,
              help="--curves: the prefilled length.")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="--curves: timed steps per slot count (over all rounds).")
@click.option("--work", type=DIR, help="Compare: the peers' builds and the children's log (default: the cache's "
                                       "bench/compare).")
@click.option("--out", type=DIR, help="Write summary.json and plots here (requests: also requests.csv).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of the table.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def bench_run(engines: tuple[Path, ...], methods, sets, peers, out: Path | None, as_json: bool, no_progress: bool,
              **flags) -> None:
    """Plain decoding and each method on the same engine, interleaved prompt by prompt, in one run.

    Requests (one ENGINE, or --url, on one --prompt-set): TTFT, TPOT, ITL, tokens/s, τ, acceptance per position,
    speedup and p50/p90/p99 per category and --concurrency, in process and served, and how many outputs equal plain
    decoding's at T = 0.

    Compare (several ENGINES, or any of --sets, --peers, --peer-limit, --gguf, --curves, --datastore, --work,
    --rounds > 1): every engine and peer in its own process on the same token ids, per set and method: tokens/s,
    the speedup over the same system's plain decoding, τ, identical outputs; the verify curves on request."""
    show = lambda line: click.echo(line, err=True)  # noqa: E731
    compare_flags = ("datastore", "gguf", "peer_limit", "curves", "work")
    if len(engines) > 1 or sets or peers or flags["rounds"] > 1 or any(flags[f] for f in compare_flags):
        _compare(engines, methods, sets, peers, out, as_json, no_progress, flags, show)
        return
    if flags["hf"]:
        raise click.UsageError("--hf is the peers' model folder: pass --peers too")
    from trtspec.bench import BenchOptions, format_bench_table, parse_slos, run_bench, write_bench_outputs

    request_flags = ("url", "serve", "concurrency", "temperature", "seed", "max_tokens", "threads", "spin", "model",
                     "no_spec", "backoff", "limit", "draft_budget")
    if flags["request_rate"] and click.get_current_context().get_parameter_source("concurrency").name == "DEFAULT":
        flags["concurrency"] = ()  # open loop alone unless closed-loop levels are asked for
    options = BenchOptions(engine=engines[0] if engines else None, methods=methods or (),
                           prompt_set=flags["prompt_set"] or "mt-bench", show_progress=not no_progress,
                           request_rate=flags["request_rate"] or (), goodput=parse_slos(flags["goodput"]),
                           **{f: flags[f] for f in request_flags})
    run = run_bench(options, show=show)
    click.echo(json.dumps(run.report, indent=1) if as_json else "\n".join(format_bench_table(run.report)))
    if out is not None:
        written = write_bench_outputs(run, out)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)


def _compare(engines, methods, sets, peers, out, as_json, no_progress, flags, show) -> None:
    from trtspec.bench import DEFAULT_SETS, CompareOptions, render_compare_table, run_compare, write_compare_outputs

    for name, default in (("url", None), ("serve", False), ("prompt_set", None), ("concurrency", (1,)),
                          ("request_rate", None), ("goodput", None), ("draft_budget", None),
                          ("temperature", 0.0), ("seed", 0), ("model", "ensemble"), ("no_spec", False)):
        if flags[name] != default:
            raise click.UsageError(f"--{name.replace('_', '-')} measures requests on one engine; comparing "
                                   "(several ENGINES, --sets, --peers, ...) takes neither")
    if not engines:
        raise click.UsageError("comparing needs ENGINE_DIR (one or more)")
    keep = ("limit", "max_tokens", "threads", "spin", "backoff", "datastore", "hf", "gguf", "peer_limit",
            "transformers_lookup", "genai_lookup", "llama_lookup", "openvino_lookup", "rounds", "curves", "past",
            "repeats", "work")
    options = CompareOptions(engines=engines, sets=sets or DEFAULT_SETS, peers=peers or (),
                             **({"methods": methods} if methods else {}), **{k: flags[k] for k in keep})
    report = run_compare(options, show=show, progress=not no_progress)
    if out is not None:
        write_compare_outputs(report, out)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(render_compare_table(report)))
    if out is not None and not as_json:
        click.echo(f"wrote {out}/summary.json, {out}/compare.png", err=True)


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

    from trtspec.bench import load_bench_prompts, perf_analyzer_command as command, perf_input_data as input_data
    from trtspec.outdir import atomic_output_file

    prompts = [p.text for p in load_bench_prompts(prompt_set, limit=limit, max_tokens=max_tokens)]
    with atomic_output_file(out) as tmp:
        tmp.write_text(json.dumps(input_data(prompts, max_tokens, method=method, speculation=not no_spec)) + "\n")
    click.echo(shlex.join(command(url, out, requests=len(prompts))))


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
@click.option("--out", type=DIR, help="Write summary.json, requests.csv and PNG plots here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@user_errors
def bench_serving(engine: Path, prompt_set: str, limit: int, max_tokens: int, concurrency: int, threads: int,
                  methods, no_spec: bool, out: Path | None, as_json: bool, no_progress: bool) -> None:
    """Serving overhead on one engine: `trtspec bench ENGINE --serve --concurrency 1,N` (Triton gRPC streaming
    against in-process generate, back to back, at concurrency 1 — target ratio >= 0.9 — and N, with how many
    sequences the engine batched per step)."""
    from trtspec.bench import BenchOptions, format_bench_table, run_bench, write_bench_outputs

    options = BenchOptions(engine=engine, serve=True, prompt_set=prompt_set, limit=limit, max_tokens=max_tokens,
                           concurrency=tuple(dict.fromkeys((1, concurrency))), threads=threads,
                           methods=methods or (), no_spec=no_spec, show_progress=not no_progress)
    run = run_bench(options, show=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(run.report, indent=1) if as_json else "\n".join(format_bench_table(run.report)))
    if out is not None:
        written = write_bench_outputs(run, out)
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)


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
    from trtspec.bench import SoakOptions, format_soak_report as format_report, run_soak

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
    from trtspec.bench import QualityOptions, format_quality_report as format_report, measure_quality
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
