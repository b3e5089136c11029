"""The served ensemble measured by Triton's own load generator, perf_analyzer: its --input-data file from a prompt
set, the command line, and its CSV read back.

perf_analyzer streams to a decoupled model (`--streaming`) and times the first response (its "latency" is TTFT for
an LLM ensemble); its throughput counts requests. The binary ships in the `tritonclient[all]` wheels up to 2.40
(`bin/perf_analyzer`, linked against libb64 and the CUDA runtime, which it loads without a GPU).
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

from trtspec.errors import ConfigError

BINARY_ENV = "PERF_ANALYZER"  # a perf_analyzer binary to use when it is not on PATH


def input_data(prompts: list[str], max_tokens: int, *, method: str | None = None, speculation: bool = True) -> dict:
    """perf_analyzer's --input-data JSON: one request per prompt (batch 1), streamed, with trtspec's CPU-flavour
    inputs when a method is named or speculation is off."""
    rows = []
    for text in prompts:
        row = {"text_input": {"content": [text], "shape": [1]}, "max_tokens": {"content": [max_tokens], "shape": [1]},
               "stream": {"content": [True], "shape": [1]}}
        if method is not None:
            row["draft_method"] = {"content": [method], "shape": [1]}
        if not speculation:
            row["use_speculation"] = {"content": [False], "shape": [1]}
        rows.append(row)
    return {"data": rows}


def command(url: str, input_file: Path, *, concurrency: str = "1:8:2", requests: int = 16, model: str = "ensemble",
            csv_file: Path | None = None, binary: str = "perf_analyzer") -> list[str]:
    """The perf_analyzer command line: gRPC streaming, a concurrency range START:END:STEP, `requests` per window."""
    cmd = [binary, "-m", model, "-u", url, "-i", "grpc", "--streaming", "--input-data", str(input_file),
           "--concurrency-range", concurrency, "--measurement-mode", "count_windows",
           "--measurement-request-count", str(requests), "--stability-percentage", "100", "--max-trials", "6"]
    return cmd + (["-f", str(csv_file)] if csv_file is not None else [])


def find_binary() -> str | None:
    """perf_analyzer from $PERF_ANALYZER or PATH (None when neither has it)."""
    path = os.environ.get(BINARY_ENV)
    if path:
        if not os.access(path, os.X_OK):
            raise ConfigError(f"${BINARY_ENV}={path} is not an executable file")
        return path
    return shutil.which("perf_analyzer")


def read_csv(path: Path) -> list[dict]:
    """perf_analyzer's -f CSV: one row per concurrency, ascending, numbers as floats (latencies in µs)."""
    with Path(path).open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    return sorted(rows, key=lambda r: r["Concurrency"])
