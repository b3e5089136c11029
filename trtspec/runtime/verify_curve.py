"""The verify curve of an engine on this machine: one step's time per slot profile, for one sequence and for an
in-flight batch, measured once and cached.

`load_or_measure(engine)` returns the engine's `StepCosts`: from `verify_curve.json` beside the engine when it was
measured for the same slot profiles, thread count, spinning and ONNX Runtime version, else measured now (a second or
ten for SmolLM2-135M: every profile's step after a 256-token past, rounds alternating between profiles, the median of
each, levelled so that no profile costs more than a larger one; then the same over a batch of up to 8 sequences) and
written there atomically (kept in memory only when the engine folder is read-only). Delete `verify_curve.json` to have
it measured again (e.g. after a run on a busy machine: a curve measured under load is steeper than the quiet one).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from trtspec.engine.summary import CURVE_FILE
from trtspec.outdir import chmod_as_created
from trtspec.speculative.engine import BatchedEngine
from trtspec.speculative.step_costs import StepCosts
from trtspec.speculative.tree import chain_tree

log = logging.getLogger(__name__)

PAST_TOKENS = 256  # a typical chat context; the curve is flatter after a longer past
ROUNDS = 15
BATCH, BATCH_ROUNDS = 8, 5  # the batch curve: at most 8 sequences, fewer rounds (each step is several times longer)


def curve_key(engine) -> dict:
    """What a cached curve must match to be reused."""
    import onnxruntime

    return {"slot_profiles": list(engine.slot_profiles), "threads": engine.threads, "spin": engine.spin,
            "past": min(PAST_TOKENS, engine.manifest.profile.max_input_len), "onnxruntime": onnxruntime.__version__}


def measure(engine, *, rounds: int = ROUNDS, past: int = PAST_TOKENS) -> StepCosts:
    """Time one verify step per profile (and the plain one-slot step) over one sequence, rounds alternating; then
    the same over a batch of min(max_batch_size, BATCH) sequences (fewer rounds: the in-flight batch's budget)."""
    profiles = (1, *engine.slot_profiles)
    past = max(1, min(past, engine.manifest.profile.max_input_len))
    ms = _times(engine, profiles, 1, rounds, past)
    batch = min(engine.manifest.profile.max_batch_size, BATCH) if isinstance(engine, BatchedEngine) else 1
    batch_ms = _times(engine, profiles, batch, BATCH_ROUNDS, past) if batch > 1 else []
    # rounded as the cache stores them, so a curve read back equals the one measured
    return StepCosts(profiles, tuple(round(t / ms[0], 4) for t in ms), tuple(round(t, 3) for t in ms),
                     batch, tuple(round(t / ms[0], 4) for t in batch_ms))


def _times(engine, profiles: tuple[int, ...], batch: int, rounds: int, past: int) -> list[float]:
    """Median ms of a chain step per profile over `batch` sequences after `past` tokens, levelled so that no profile
    costs more than a larger one (a step may always run padded into a larger profile: noise that says otherwise is
    levelled down)."""
    rng = np.random.default_rng(0)
    seqs = [engine.open() for _ in range(batch)]
    times: dict[int, list[float]] = {p: [] for p in profiles}
    try:
        for seq in seqs:
            engine.prefill(seq, rng.integers(0, engine.vocab_size, past))
        for r in range(rounds + 1):
            for slots in profiles if r % 2 else profiles[::-1]:
                tree = chain_tree(slots - 1)
                items = [(seq, rng.integers(0, engine.vocab_size, slots), tree.position_offsets, tree.mask)
                         for seq in seqs]
                start = time.perf_counter()
                engine.verify_batch(items) if batch > 1 else engine.verify(*items[0])
                if r:  # round 0 warms every binding up
                    times[slots].append(time.perf_counter() - start)
    finally:
        for seq in seqs:
            engine.close(seq)
    ms = [float(np.median(times[p])) * 1000 for p in profiles]
    for i in range(len(ms) - 2, -1, -1):
        ms[i] = min(ms[i], ms[i + 1])
    return ms


def load_or_measure(engine) -> StepCosts:
    """The cached curve when it matches this engine and machine setup, else a fresh measurement (then cached)."""
    key, path = curve_key(engine), Path(engine.engine_dir) / CURVE_FILE
    cached = _read(path, key)
    if cached is not None:
        return cached
    costs = measure(engine)
    log.info("verify curve of %s: %s", engine.engine_dir,
             ", ".join(f"{p} slots {c:.2f}x" for p, c in zip(costs.profiles, costs.relative)))
    save(path, key, costs)
    return costs


def save(path: Path, key: dict, costs: StepCosts) -> None:
    """Write the curve atomically; a read-only engine folder keeps it in memory only."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verify-curve-")
        with os.fdopen(fd, "w") as f:
            json.dump({**key, **costs.to_dict()}, f, indent=2)
        chmod_as_created(tmp)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("verify curve not cached in %s: %s", path.parent, e)


def _read(path: Path, key: dict) -> StepCosts | None:
    try:
        data = json.loads(path.read_text())
        if any(data.get(k) != v for k, v in key.items()):
            return None
        return StepCosts(tuple(data["profiles"]), tuple(data["relative"]), tuple(data["step_ms"]), data["batch"],
                         tuple(data["batch_relative"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
