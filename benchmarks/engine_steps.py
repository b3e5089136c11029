"""What CPU engines' steps cost, side by side: a prompt, and verify steps of 1, 2, 3, 5, 9 and 16 slots over a
sequence with cached tokens, through the engine's own prefill / verify (as decoding calls them). Each engine runs in
a process of its own, the engines alternating round by round; a cell is the least over the rounds of the median of
its timed calls, and each engine's ratio to the first engine's cell is printed beside it.

    .venv/bin/python benchmarks/engine_steps.py ENGINE [ENGINE ...] [--slots 1,2,3,5,9,16] [--past 300]
        [--prompt 500] [--rounds 3] [--repeats 40] [--threads 2]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np

PROMPT_REPEATS = 5  # prompts timed per round (after one untimed)


def token_ids(n: int, seed: int, vocab: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) * 7919 + seed) % vocab


def measure(engine_dir: str, slots: list[int], past: int, prompt: int, repeats: int, threads: int) -> dict:
    """One round in this process: the median ms of a `prompt`-token prefill, and of a verify step of each slot count
    (a chain of that many tokens) over `past` cached tokens, uncommitted, so every call sees the same cache."""
    from trtspec.runtime.ort_engine import OrtEngine

    engine = OrtEngine(engine_dir, threads=threads)
    vocab = engine.manifest.model.vocab_size
    times = []
    for i in range(PROMPT_REPEATS + 1):
        seq = engine.open()
        start = time.perf_counter()
        engine.prefill(seq, token_ids(prompt, 11, vocab))
        times.append(time.perf_counter() - start)
        engine.close(seq)
    cells = {"prompt": 1000 * statistics.median(times[1:])}
    seq = engine.open()
    engine.prefill(seq, token_ids(past, 13, vocab))
    for n in slots:
        tokens, depths, mask = token_ids(n, 17, vocab), np.arange(n), np.tril(np.ones((n, n), dtype=bool))
        times = []
        for i in range(repeats + 5):
            start = time.perf_counter()
            engine.verify(seq, tokens, depths, mask)
            times.append(time.perf_counter() - start)
        cells[str(n)] = 1000 * statistics.median(times[5:])
    return cells


@click.command()
@click.argument("engines", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--slots", default="1,2,3,5,9,16", show_default=True, help="Verify-step slot counts, comma-separated.")
@click.option("--past", default=300, show_default=True, type=click.IntRange(1), help="Cached tokens under each step.")
@click.option("--prompt", default=500, show_default=True, type=click.IntRange(1), help="Tokens of the timed prompt.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1))
@click.option("--repeats", default=40, show_default=True, type=click.IntRange(1), help="Timed steps per cell.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1))
@click.option("--child", is_flag=True, hidden=True, help="Measure ENGINES[0] once here and print JSON.")
def main(engines, slots, past, prompt, rounds, repeats, threads, child) -> None:
    slot_counts = [int(s) for s in slots.split(",")]
    if child:
        print(json.dumps(measure(engines[0], slot_counts, past, prompt, repeats, threads)))
        return
    best: dict[str, dict[str, float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(rounds):
        for engine in engines:
            cmd = [sys.executable, __file__, engine, "--child", "--slots", slots, "--past", str(past), "--prompt",
                   str(prompt), "--repeats", str(repeats), "--threads", str(threads)]
            cells = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            row = best.setdefault(engine, {})
            for key, ms in cells.items():
                row[key] = min(ms, row.get(key, ms))
    print(f"ms per call, least of {rounds} round(s) of medians; {threads} threads; prompt of {prompt} tokens; verify "
          f"steps over {past} cached tokens; load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    keys = ["prompt", *map(str, slot_counts)]
    print(f"{'engine':<24}" + "".join(f"{k if k == 'prompt' else k + '-slot step':>18}" for k in keys))
    first = best[engines[0]]
    for engine in engines:
        row = best[engine]
        print(f"{Path(engine).name:<24}" + "".join(f"{row[k]:>9.2f} ({row[k] / first[k]:4.2f}x)" for k in keys))


if __name__ == "__main__":
    main()
