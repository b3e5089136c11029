"""Serving overhead, measured side by side in one run: the same engine and prompts in process and through a
real tritonserver over gRPC streaming.

1. concurrency 1: tokens/s through Triton (streaming) ÷ tokens/s of in-process `generate` — requests alternate
   between the two, prompt by prompt, so both see the same machine load (target ≥ 0.9);
2. concurrency N: aggregate tokens/s of N concurrent gRPC streams, next to in-process in-flight batching of
   the same prompts, and how many sequences the engine batched per step.

    trtspec bench serving ENGINE [--prompt-set mt-bench] [--limit 16] [--max-tokens 128] [--concurrency 8]
        [--threads 2] [--no-spec] [--unary] [--json]
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

TARGET_OVERHEAD = 0.9


def _texts(name: str, limit: int) -> list[str]:
    from trtspec.data.prompts import load_prompts

    return [p.text for p in load_prompts(name, limit=limit)]


def run(engine: Path, *, prompt_set: str = "mt-bench", limit: int = 16, max_tokens: int = 128,
        concurrency: int = 8, threads: int | None = 2, no_spec: bool = False, show=print) -> dict:
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.runtime.loop import GenerationConfig
    from trtspec.triton.client import TritonClient, generate_concurrently
    from trtspec.triton.deploy import deploy
    from trtspec.triton.deploy_options import DeployOptions
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    prompts = _texts(prompt_set, limit)
    options = GenerationConfig(max_tokens=max_tokens, no_spec=no_spec)
    local = LocalGenerator(engine, threads=threads)
    with tempfile.TemporaryDirectory(prefix="trtspec-bench-serving-") as tmp:
        repo = deploy(DeployOptions(engine_dir=engine, out=Path(tmp) / "repo", threads=threads))
        server_options = ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                       metrics_port=free_port(), exit_timeout_s=5)
        server = TritonServer(server_options, on_log=lambda line: None)
        with server:
            with TritonClient(server.grpc_url) as client:
                client.generate(prompts[0], GenerationConfig(max_tokens=8))  # warm up both paths
                local.generate(prompts[0], GenerationConfig(max_tokens=8))
                times = {"local": 0.0, "grpc": 0.0}
                tokens = {"local": 0, "grpc": 0}
                mismatches = 0
                for i, prompt in enumerate(prompts):
                    start = time.perf_counter()
                    mine = local.generate(prompt, options, index=i)
                    times["local"] += time.perf_counter() - start
                    start = time.perf_counter()
                    remote = client.generate(prompt, options, index=i)
                    times["grpc"] += time.perf_counter() - start
                    tokens["local"] += len(mine.output_ids)
                    tokens["grpc"] += len(remote.output_ids)
                    mismatches += remote.output_ids != mine.output_ids
                    show(f"  prompt {i + 1}/{len(prompts)}: {len(mine.output_ids)} tokens, local "
                         f"{len(mine.output_ids) / mine.result.total_s:.1f} tok/s, gRPC {remote.to_dict()['stats']['tokens_per_second']:.1f} tok/s")
            start = time.perf_counter()
            batched = local.generate_many(prompts, options)
            local_batch_s = time.perf_counter() - start
            before = read_counters(server.metrics_url, publish_via=server.grpc_url)
            start = time.perf_counter()
            results = generate_concurrently(server.grpc_url, prompts, options, concurrency=concurrency)
            grpc_batch_s = time.perf_counter() - start
            after = read_counters(server.metrics_url, publish_via=server.grpc_url)
        for r in results:
            if isinstance(r, BaseException):
                raise r
    local_tps = tokens["local"] / times["local"]
    grpc_tps = tokens["grpc"] / times["grpc"]
    report = {
        "engine": str(engine), "prompts": f"{prompt_set}[:{len(prompts)}]", "max_tokens": max_tokens,
        "speculation": not no_spec, "threads": threads,
        "concurrency_1": {"in_process_tok_s": round(local_tps, 2), "grpc_streaming_tok_s": round(grpc_tps, 2),
                          "ratio": round(grpc_tps / local_tps, 3), "target": TARGET_OVERHEAD,
                          "outputs_identical": mismatches == 0},
        f"concurrency_{concurrency}": {
            "in_process_batched_tok_s": round(sum(len(g.output_ids) for g in batched) / local_batch_s, 2),
            "grpc_tok_s": round(sum(len(r.output_ids) for r in results) / grpc_batch_s, 2),
            "outputs_identical": [r.output_ids for r in results] == [g.output_ids for g in batched],
            "engine_batching": _batching(before, after)},
    }
    return report


def read_counters(metrics_url: str, *, publish_via: str | None = None) -> dict[str, float]:
    """trtspec's counters from Triton's Prometheus endpoint (summed over models and instances).

    The engine model publishes its counters when it receives a request; `publish_via` (a gRPC URL) sends a
    one-token request first so the counters cover everything before this call."""
    import urllib.request

    if publish_via is not None:
        from trtspec.runtime.loop import GenerationConfig
        from trtspec.triton.client import TritonClient

        with TritonClient(publish_via) as client:
            client.generate("count", GenerationConfig(max_tokens=1))

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    counters: dict[str, float] = {}
    for m in re.finditer(r"^(trtspec_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", text, re.M):
        counters[m[1]] = counters.get(m[1], 0.0) + float(m[3])
        slots = re.search(r'slots="(\d+)"', m[2] or "")
        if slots:  # per slot profile too: trtspec_engine_profile_steps_total[5]
            key = f"{m[1]}[{slots[1]}]"
            counters[key] = counters.get(key, 0.0) + float(m[3])
    return counters


def _batching(before: dict, after: dict) -> dict:
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = delta.get("trtspec_engine_steps_total", 0.0)
    sequences = delta.get("trtspec_engine_step_sequences_total", 0.0)
    return {"steps": int(steps), "sequences_per_step": round(sequences / steps, 2) if steps else None}


def unary_vs_streaming(engine: Path, *, prompt_set: str = "mt-bench", limit: int = 8, max_tokens: int = 128,
                       threads: int | None = 2, rounds: int = 2, show=print) -> dict:
    """`limit` concurrent requests as unary ModelInfer calls to a --no-decoupled deployment and as gRPC streams to
    a decoupled one, both served at once, rounds alternating: wall time for the whole group each way."""
    import threading

    import tritonclient.grpc as grpcclient

    from trtspec.runtime.loop import GenerationConfig
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


def format_report(report: dict, concurrency: int) -> list[str]:
    c1, cn = report["concurrency_1"], report[f"concurrency_{concurrency}"]
    return [f"concurrency 1: gRPC streaming {c1['grpc_streaming_tok_s']} tok/s ÷ in-process {c1['in_process_tok_s']} "
            f"tok/s = {c1['ratio']}× (target ≥ {TARGET_OVERHEAD}); outputs identical: {c1['outputs_identical']}",
            f"concurrency {concurrency}: gRPC {cn['grpc_tok_s']} tok/s, in-process batched "
            f"{cn['in_process_batched_tok_s']} tok/s; outputs identical: {cn['outputs_identical']}; "
            f"engine batching: {cn['engine_batching']}"]


def format_unary(report: dict) -> str:
    return (f"{report['requests']} concurrent requests: streaming {report['streaming']['wall_s']} s "
            f"({report['streaming']['tok_s']} tok/s), unary {report['unary']['wall_s']} s "
            f"({report['unary']['tok_s']} tok/s), unary / streaming = {report['unary_over_streaming']}; "
            f"outputs identical: {report['outputs_identical']}")
