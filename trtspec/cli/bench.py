"""bench: benchmarks measured side by side in one run."""

from __future__ import annotations

import json
import sys

import click

from trtspec.cli.app import DIR, EXISTING_DIR, cli, user_errors


@cli.group()
def bench() -> None:
    """Benchmarks that measure side by side in one run and print ratios."""


@bench.command("cpu-engine", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_cpu_engine(args: tuple[str, ...]) -> None:
    """SmolLM2 plain decoding vs onnxruntime-genai and transformers, verify cost curve, bandwidth floor
    (`trtspec bench cpu-engine --help` for its options)."""
    from trtspec.bench.cpu_engine import main as run

    run(list(args))



@bench.command("drafting", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_drafting(args: tuple[str, ...]) -> None:
    """Drafters against plain decoding on real prompt sets (grounded, MT-Bench 2-turn), alternating, with the
    peers' own speculation (`trtspec bench drafting --help` for its options)."""
    from trtspec.bench.drafting import main as run

    run(list(args))


@bench.command("serving", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_serving(args: tuple[str, ...]) -> None:
    """Triton gRPC streaming vs in-process generate on one engine, at concurrency 1 and N
    (`trtspec bench serving --help` for its options)."""
    from trtspec.bench.serving import main as run

    run(list(args))


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
    from trtspec.bench.soak import SoakOptions, format_report, run_soak

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
