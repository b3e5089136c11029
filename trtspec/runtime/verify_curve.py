"""The verify curve of an engine on this machine: one step's time per slot profile, for one sequence and for an
in-flight batch, measured once and cached.

`load_or_measure(engine)` returns the engine's `StepCosts`: from `verify_curve.json` beside the engine when a curve
there was measured for the same slot profiles, thread count, spinning, ONNX Runtime version (and build of trtspec's
TreeAttention, for engines that run it), else measured now (every profile's step after a PAST_TOKENS past, rounds
alternating between profiles, the median of each, levelled so that no profile costs more than a larger one; then the
same over a batch of up to BATCH sequences) and added there atomically (kept in memory only when the engine folder
is read-only). The file keeps one curve per setting, the MAX_CURVES most recent (`{"curves": [...]}`), so runs with
and without spinning, or with other thread counts, do not measure each other's curve away.
Delete `verify_curve.json` to have it measured again (e.g. after a run on a busy machine: a curve measured under load
is steeper than the quiet one).
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
MAX_CURVES = 8  # settings kept in one verify_curve.json, the most recent last


def curve_key(engine) -> dict:
    """What a cached curve must match to be reused."""
    import onnxruntime

    key = {"slot_profiles": list(engine.slot_profiles), "threads": engine.threads, "spin": engine.spin,
           "past": min(PAST_TOKENS, engine.manifest.profile.max_input_len), "onnxruntime": onnxruntime.__version__}
    if engine.manifest.native_ops:  # trtspec's own kernels: the build of them that ran
        from trtspec import native

        key["native_ops"] = native.fingerprint()[:16]
    return key


def measure(engine, *, rounds: int = ROUNDS, past: int = PAST_TOKENS, batch: bool = True) -> StepCosts:
    """Time one verify step per profile (and the plain one-slot step) over one sequence after `past` tokens (up to
    max_seq_len less the largest profile: a past longer than max_input_len is prefilled in chunks), rounds
    alternating; then, unless `batch` is False, the same over a batch of min(max_batch_size, BATCH) sequences
    (fewer rounds: the in-flight batch's budget)."""
    profiles = (1, *engine.slot_profiles)
    past = max_past(engine, past)
    ms = _times(engine, profiles, 1, rounds, past)
    batch = min(engine.manifest.profile.max_batch_size, BATCH) if batch and isinstance(engine, BatchedEngine) else 1
    batch_ms = _times(engine, profiles, batch, BATCH_ROUNDS, past) if batch > 1 else []
    # rounded as the cache stores them, so a curve read back equals the one measured
    return StepCosts(profiles, tuple(round(t / ms[0], 4) for t in ms), tuple(round(t, 3) for t in ms),
                     batch, tuple(round(t / ms[0], 4) for t in batch_ms))


def _times(engine, profiles: tuple[int, ...], batch: int, rounds: int, past: int) -> list[float]:
    """Median ms of a chain step per profile over `batch` sequences after `past` tokens, `level`led."""
    times = step_samples(engine, profiles, batch=batch, rounds=rounds, past=past)
    return level([float(np.median(times[p])) * 1000 for p in profiles])


def step_samples(engine, profiles: tuple[int, ...], *, batch: int = 1, rounds: int = ROUNDS, past: int = PAST_TOKENS,
                 warmup: int = 1) -> dict[int, list[float]]:
    """Seconds of every timed chain step of each slot count in `profiles` over `batch` sequences after `past` tokens
    (prefilled in chunks of max_input_len; the steps are not committed, so each follows the same past): `rounds`
    rounds alternating descending and ascending slot counts, after `warmup` untimed ones that warm every binding up."""
    rng = np.random.default_rng(0)
    seqs = [engine.open() for _ in range(batch)]
    times: dict[int, list[float]] = {p: [] for p in profiles}
    chunk = engine.manifest.profile.max_input_len
    try:
        for seq in seqs:
            for start in range(0, past, chunk):
                engine.prefill(seq, rng.integers(0, engine.vocab_size, min(chunk, past - start)))
        for r in range(warmup + rounds):
            for slots in profiles if r % 2 else profiles[::-1]:
                tree = chain_tree(slots - 1)
                items = [(seq, rng.integers(0, engine.vocab_size, slots), tree.position_offsets, tree.mask)
                         for seq in seqs]
                start = time.perf_counter()
                engine.verify_batch(items) if batch > 1 else engine.verify(*items[0])
                if r >= warmup:
                    times[slots].append(time.perf_counter() - start)
    finally:
        for seq in seqs:
            engine.close(seq)
    return times


def level(ms: list[float]) -> list[float]:
    """Step costs ordered by slot count, levelled so that none costs more than a larger one (a step may always run
    padded into a larger profile: noise that says otherwise is levelled down)."""
    ms = list(ms)
    for i in range(len(ms) - 2, -1, -1):
        ms[i] = min(ms[i], ms[i + 1])
    return ms


def max_past(engine, past: int) -> int:
    """`past` within what a verify step can follow: 1 to max_seq_len less the largest slot profile."""
    return max(1, min(int(past), engine.manifest.profile.max_seq_len - max(engine.slot_profiles, default=1)))


def load_or_measure(engine) -> StepCosts:
    """The cached curve when it matches this engine and machine setup, else a fresh measurement (then cached)."""
    key, path = curve_key(engine), Path(engine.engine_dir) / CURVE_FILE
    cached = _read(path, key)
    if cached is not None:
        return cached
    costs = measure(engine, past=key["past"])
    log.info("verify curve of %s: %s", engine.engine_dir,
             ", ".join(f"{p} slots {c:.2f}x" for p, c in zip(costs.profiles, costs.relative)))
    save(path, key, costs)
    return costs


def save(path: Path, key: dict, costs: StepCosts) -> None:
    """Add the curve to the file atomically, replacing one of the same setting; a read-only engine folder keeps it
    in memory only."""
    others = [c for c in read_curves(path) if any(c.get(k) != v for k, v in key.items())]
    curves = [*others, {**key, **costs.to_dict()}][-MAX_CURVES:]
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verify-curve-")
        with os.fdopen(fd, "w") as f:
            json.dump({"curves": curves}, f, indent=2)
        chmod_as_created(tmp)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("verify curve not cached in %s: %s", path.parent, e)


def read_curves(path: Path) -> list[dict]:
    """Every curve in the file, the most recent last (a missing, unreadable or malformed file: none, so the curve
    is measured again)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    curves = data.get("curves") if isinstance(data, dict) else None
    return [c for c in curves if isinstance(c, dict)] if isinstance(curves, list) else []


def _read(path: Path, key: dict) -> StepCosts | None:
    for data in reversed(read_curves(path)):
        if any(data.get(k) != v for k, v in key.items()):
            continue
        try:
            return StepCosts(tuple(data["profiles"]), tuple(data["relative"]), tuple(data["step_ms"]),
                             data["batch"], tuple(data["batch_relative"]))
        except (KeyError, TypeError):
            return None
    return None
