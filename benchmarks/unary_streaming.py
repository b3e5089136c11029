"""Unary requests to a --no-decoupled deployment against as many gRPC streams to a decoupled one, both served at
once from the same engine, rounds alternating: the wall time of the whole group each way, and whether the outputs are
identical (an instrument of trtspec's non-decoupled path, which batches unary calls in flight too).

    .venv/bin/python benchmarks/unary_streaming.py ENGINE [--prompt-set mt-bench] [--limit 8] [--max-tokens 128]
        [--threads 2] [--rounds 2] [--json]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click

from trtspec.cli.app import user_errors


def _texts(name: str, limit: int) -> list[str]:
    from trtspec.data.prompts import load_prompts

    return [p.text for p in load_prompts(name, limit=limit)]


def unary_vs_streaming(engine: Path, *, prompt_set: str = "mt-bench", limit: int = 8, max_tokens: int = 128,
                       threads: int | None = 2, rounds: int = 2, show=print) -> dict:
    """`limit` concurrent requests as unary ModelInfer calls to a --no-decoupled deployment and as gRPC streams to
    a decoupled one, both served at once, rounds alternating: wall time for the whole group each way."""
    import threading

    import tritonclient.grpc as grpcclient

    from trtspec.speculative.loop import GenerationConfig
    from trtspec.triton.client import TritonClient, build_inputs, generate_concurrently
    from trtspec.triton.deploy import deploy
    from trtspec.triton.deploy_options import DeployOptions
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    prompts = _texts(prompt_set, limit)
    options = GenerationConfig(max_tokens=max_tokens)

    def unary(url: str) -> list[list[int]]:
        with TritonClient(url) as probe:
            accepted = probe.model_inputs()
        out: list = [None] * len(prompts)

        def call(i):
            client = grpcclient.InferenceServerClient(url)
            try:
                result = client.infer("ensemble", build_inputs(prompts[i], options, stream=False, accepted=accepted))
                out[i] = result.as_numpy("output_ids").reshape(-1).tolist()
            finally:
                client.close()

        workers = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return out

    with tempfile.TemporaryDirectory(prefix="trtspec-bench-unary-") as tmp:
        servers = {}
        for name, decoupled in (("streaming", True), ("unary", False)):
            repo = deploy(DeployOptions(engine_dir=engine, out=Path(tmp) / name, threads=threads,
                                        decoupled=decoupled))
            servers[name] = TritonServer(ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                                       metrics_port=free_port(), exit_timeout_s=5),
                                         on_log=lambda line: None)
        with servers["streaming"], servers["unary"]:
            times = {"streaming": [], "unary": []}
            ids = {}
            run_one = {"streaming": lambda: [r.output_ids for r in generate_concurrently(
                           servers["streaming"].grpc_url, prompts, options, concurrency=len(prompts))],
                       "unary": lambda: unary(servers["unary"].grpc_url)}
            for name in run_one:  # warm up
                run_one[name]()
            for r in range(rounds):
                for name in (("streaming", "unary") if r % 2 == 0 else ("unary", "streaming")):
                    start = time.perf_counter()
                    ids[name] = run_one[name]()
                    times[name].append(time.perf_counter() - start)
                    show(f"  round {r + 1}: {len(prompts)} {name} requests in {times[name][-1]:.2f} s")
    tokens = sum(len(x) for x in ids["unary"])
    report = {"requests": len(prompts), "max_tokens": max_tokens, "rounds": rounds,
              "outputs_identical": ids["unary"] == ids["streaming"]}
    for name in ("streaming", "unary"):
        wall = sum(times[name]) / len(times[name])
        report[name] = {"wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1)}
    report["unary_over_streaming"] = round(report["unary"]["wall_s"] / report["streaming"]["wall_s"], 3)
    return report


def format_unary(report: dict) -> str:
    return (f"{report['requests']} concurrent requests: streaming {report['streaming']['wall_s']} s "
            f"({report['streaming']['tok_s']} tok/s), unary {report['unary']['wall_s']} s "
            f"({report['unary']['tok_s']} tok/s), unary / streaming = {report['unary_over_streaming']}; "
            f"outputs identical: {report['outputs_identical']}")


@click.command()
@click.argument("engine", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--prompt-set", default="mt-bench", show_default=True, help="A known prompt set or a .jsonl file.")
@click.option("--limit", type=click.IntRange(min=1), default=8, show_default=True, help="Concurrent requests.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens per prompt.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="ONNX Runtime intra-op threads of each server.")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True, help="Rounds each way.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def main(engine: Path, as_json: bool, **options) -> None:
    """ENGINE served twice, decoupled and --no-decoupled: --limit concurrent unary requests against as many streams."""
    report = unary_vs_streaming(engine, **options, show=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(report, indent=2) if as_json else format_unary(report))


if __name__ == "__main__":
    main()
