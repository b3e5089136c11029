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
