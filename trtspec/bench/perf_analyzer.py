"""The served ensemble measured by Triton's own load generator, perf_analyzer, on a trtspec prompt set: its
--input-data file and the command line (`trtspec bench perf-input`).

perf_analyzer streams to a decoupled model (`--streaming`) and times the first response (its "latency" is TTFT for
an LLM ensemble); its throughput counts requests. `scripts/setup-load-tools.sh` installs it (docs/serving.md, "Load
tools").
"""

from __future__ import annotations

from pathlib import Path


def input_data(prompts: list[str], max_tokens: int, *, method: str | None = None, speculation: bool = True) -> dict:
    """perf_analyzer's --input-data JSON: one request per prompt (batch 1), streamed, with trtspec's CPU-flavour
    inputs when a method is named or speculation is off."""
    extra = {**({"draft_method": [method]} if method is not None else {}),
             **({} if speculation else {"use_speculation": [False]})}
    return {"data": [{"text_input": [text], "max_tokens": [max_tokens], "stream": [True], **extra} for text in prompts]}


def command(url: str, input_file: Path, *, concurrency: str = "1:4", requests: int = 16, model: str = "ensemble",
            binary: str = ".venv-tools/bin/perf_analyzer") -> list[str]:
    """The perf_analyzer command line: gRPC streaming, a concurrency range START:END[:STEP], `requests` per window.
    The warm-up is as many requests as the largest concurrency: fewer hang perf_analyzer 2.51 on a decoupled model."""
    warmup = concurrency.split(":")[1] if ":" in concurrency else concurrency
    return [binary, "-m", model, "-i", "grpc", "-u", url, "--async", "--streaming", "--input-data", str(input_file),
            "--concurrency-range", concurrency, "--measurement-mode", "count_windows",
            "--measurement-request-count", str(requests), "--stability-percentage", "1000", "--max-trials", "3",
            "--warmup-request-count", warmup, "-f", "pa.csv"]
