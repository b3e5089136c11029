"""Triton's own load tools against the real server: perf_analyzer (Triton 2.51) and genai-perf 0.0.16, as installed
into .venv-tools/ by scripts/setup-load-tools.sh, each sending a handful of streamed requests to the ensemble."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv-tools" / "bin"
PERF_ANALYZER = TOOLS / "perf_analyzer"
GENAI_PERF = TOOLS / "genai-perf"
SETUP = "bash scripts/setup-load-tools.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK),
                       reason=f"perf_analyzer is not installed in .venv-tools: run `{SETUP}`"),
]

PROMPTS = ("Hello world, this is", "Speculative decoding drafts tokens", "The quick brown fox")


TIMEOUT_S = 300  # a hang: the tools' start-up and a handful of requests take longer on a loaded machine


def _run(args: list, cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    # the tools bring their own Python (genai-perf) or none (perf_analyzer): nothing of this venv may leak into them
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def test_perf_analyzer_streams_the_ensemble(server, tmp_path):
    data = {"data": [{"text_input": [p], "max_tokens": [16], "stream": [True]} for p in PROMPTS]}
    (tmp_path / "input.json").write_text(json.dumps(data))
    # The warm-up count must be 0 or at least the concurrency: below it perf_analyzer 2.51 waits forever on a
    # decoupled model.
    done = _run([PERF_ANALYZER, "-m", "ensemble", "-i", "grpc", "-u", server.grpc_url, "--async", "--streaming",
                 "--input-data", "input.json", "--concurrency-range", "1:2",
                 "--measurement-mode", "count_windows", "--measurement-request-count", "4",
                 "--stability-percentage", "1000", "--max-trials", "3", "--warmup-request-count", "2",
                 "-f", "pa.csv"], tmp_path)
    printed = dict(re.findall(r"^Concurrency: (\d+), throughput: ([\d.]+) infer/sec", done.stdout, re.M))
    assert set(printed) == {"1", "2"}, done.stdout[-2000:]
    assert all(float(v) > 0 for v in printed.values()), printed
    rows = list(csv.DictReader((tmp_path / "pa.csv").open()))
    assert [r["Concurrency"] for r in rows] == ["1", "2"]
    assert all(float(r["Inferences/Second"]) > 0 and float(r["Response Throughput"]) > 0 for r in rows), rows


@pytest.mark.skipif(not os.access(GENAI_PERF, os.X_OK),
                    reason=f"genai-perf is not installed in .venv-tools: run `{SETUP}` (without SKIP_GENAI_PERF=1)")
def test_genai_perf_profiles_the_ensemble(server, tiny_engine, tmp_path):
    manifest = json.loads((tiny_engine / "manifest.json").read_text())
    tokenizer = tiny_engine / manifest["tokenizer"]  # a local folder: the wrapper runs genai-perf offline
    _run([GENAI_PERF, "profile", "-m", "ensemble", "--backend", "tensorrtllm", "-u", server.grpc_url, "--streaming",
          "--tokenizer", tokenizer, "--synthetic-input-tokens-mean", "16", "--synthetic-input-tokens-stddev", "0",
          "--output-tokens-mean", "16", "--num-dataset-entries", "4", "--concurrency", "2", "--request-count", "6",
          "--warmup-request-count", "2", "--random-seed", "0", "--artifact-dir", tmp_path / "artifacts"],
         tmp_path)
    (export,) = (tmp_path / "artifacts").glob("*/profile_export_genai_perf.json")
    stats = json.loads(export.read_text())
    assert stats["request_count"]["avg"] == 6
    assert stats["request_throughput"]["avg"] > 0
    assert stats["output_token_throughput"]["avg"] > 0
    assert stats["time_to_first_token"]["avg"] > 0
