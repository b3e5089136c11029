"""Measure peak RSS and time of `trtspec convert` on a LLaMA-shaped random base of any size.

    .venv/bin/python benchmarks/convert_memory.py --preset llama-7b --work /tmp/convert-bench

Writes the base once (streamed, one tensor at a time), converts it in a child process, and prints the
largest input shard, the child's peak RSS (ru_maxrss), the RSS of a child that only imports the converter
(the baseline), and the wall time. The contract: peak RSS well under twice the largest shard.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click

from trtspec.testing import TinyModel, write_hf_base

PRESETS = {
    # Llama-2-7B shapes in fp16 (13.5 GB single shard).
    "llama-7b": TinyModel(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, intermediate_size=11008,
                          vocab_size=32000, dtype="float16", max_position_embeddings=4096),
    # SmolLM2-135M shapes in fp32 (the real model of this project).
    "smollm2-135m": TinyModel(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536,
                              vocab_size=49152, tie_word_embeddings=True, dtype="float32"),
    # Small enough for a test: ~230 MB fp32.
    "small": TinyModel(hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=2, intermediate_size=2048,
                       vocab_size=8192, dtype="float32"),
}


# A child's ru_maxrss includes its parent's memory at fork/exec time, so the command runs under a bare
# interpreter (a few MB) that reports the peak of its own child.
_RUNNER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(json.loads(sys.argv[1]), stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, time.perf_counter() - start]))
"""


def run_measured(argv: list[str]) -> tuple[int, float]:
    """Run argv as a child; return (peak RSS in bytes, wall seconds)."""
    out = subprocess.run([sys.executable, "-S", "-c", _RUNNER, json.dumps(argv)], capture_output=True, text=True,
                         check=True).stdout
    code, peak, seconds = json.loads(out)
    if code:
        raise SystemExit(f"{argv} failed with exit code {code}")
    return peak, seconds


def measure(model: TinyModel, work: Path, extra: list[str]) -> dict:
    base = work / "base"
    if not (base / "model.safetensors").is_file():
        shutil.rmtree(base, ignore_errors=True)
        write_hf_base(base, model, storage="streamed")
    shard = (base / "model.safetensors").stat().st_size
    trtspec = [sys.executable, "-m", "trtspec.cli"]
    baseline, _ = run_measured([sys.executable, "-c", "import trtspec.checkpoint.convert"])
    peak, seconds = run_measured([*trtspec, "convert", "--base", str(base), "--out", str(work / "ckpt"), "--force",
                                  "--json", *extra])
    out_bytes = sum(p.stat().st_size for p in (work / "ckpt").glob("rank*.safetensors"))
    return {"largest_shard_bytes": shard, "output_bytes": out_bytes, "peak_rss_bytes": peak,
            "baseline_rss_bytes": baseline, "seconds": round(seconds, 1),
            "peak_over_shard": round(peak / shard, 3), "gb_per_s": round((shard + out_bytes) / seconds / 1e9, 2)}


@click.command()
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="small", show_default=True)
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Scratch folder (the base is kept for reruns).")
@click.argument("extra", nargs=-1)
def main(preset: str, work: Path, extra: tuple[str, ...]) -> None:
    """Peak RSS and time of `trtspec convert` on a random LLaMA-shaped base (EXTRA: convert flags after --)."""
    click.echo(json.dumps(measure(PRESETS[preset], work, list(extra)), indent=2))


if __name__ == "__main__":
    main()
