"""A decode step's milliseconds as `trtspec tune` predicts them: per slot profile, a line in the context's length.

`measure` times the verify curve after a few pasts spanning the prompts' contexts, `fit` draws a least-squares line
through each profile's times (levelled so that no profile costs more than a larger one), the loop's own acceptance
work per step is added, and `anchored` scales the lines to what the calibration run's plain steps took. Why each
part is there: docs/tuning.md, "The step-time model".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

ACCEPT_ROUNDS = 8  # acceptance timings per profile (the median is kept), each after a verify step


@dataclass(frozen=True)
class StepModel:
    """Per slot profile (ascending, the plain step's 1 first): ms = scale · (base + per_past · past) + acceptance."""

    profiles: tuple[int, ...]
    base_ms: tuple[float, ...]  # the line at past 0
    per_past_ms: tuple[float, ...]  # its slope: ms per token of past (>= 0)
    acceptance_ms: tuple[float, ...] = ()  # the loop's acceptance of the step's rows beyond a plain step's
    scale: float = 1.0
    pasts: tuple[int, ...] = ()  # where the curve was measured
    measured_ms: tuple[tuple[float, ...], ...] = ()  # [past][profile]: the curve's medians there

    def verify_ms(self, slots: int, past: float) -> float:
        """The verify step over `slots` slots after `past` tokens, scaled: the cheapest line of its profile and the
        larger ones."""
        i = self.profiles.index(slots)
        return self.scale * min(b + k * past for b, k in zip(self.base_ms[i:], self.per_past_ms[i:]))

    def step_ms(self, slots: int, past: float) -> float:
        """A decode step over `slots` slots after `past` tokens: its verify step and its acceptance."""
        extra = self.acceptance_ms[self.profiles.index(slots)] if self.acceptance_ms else 0.0
        return self.verify_ms(slots, past) + extra

    def steps_ms(self, profile_steps: dict[int, int], past: float) -> float:
        """Steps counted per profile (`SpecStats.profile_steps`), all after `past` tokens."""
        return sum(n * self.step_ms(slots, past) for slots, n in profile_steps.items())

    def anchored(self, plain: list[tuple[int, float, float]]) -> StepModel:
        """Scaled so that the plain steps of a run cost what they took: `plain` holds each prompt's (plain steps,
        mean past, seconds they took)."""
        from dataclasses import replace

        modelled = sum(n * self.verify_ms(1, past) for n, past, _ in plain) / self.scale
        took = 1000 * sum(s for *_, s in plain)
        return replace(self, scale=took / modelled if modelled and took else 1.0)

    def to_dict(self, at: float | None = None) -> dict:
        out = {"profiles": list(self.profiles), "base_ms": [round(x, 3) for x in self.base_ms],
               "per_1k_past_ms": [round(1000 * x, 3) for x in self.per_past_ms],
               "acceptance_ms": [round(x, 3) for x in self.acceptance_ms], "scale": round(self.scale, 4),
               "pasts": list(self.pasts), "measured_ms": [[round(x, 3) for x in row] for row in self.measured_ms]}
        if at is not None:  # the scaled steps at one context, for a glance
            out["past"] = round(at)
            out["step_ms"] = [round(self.step_ms(p, at), 3) for p in self.profiles]
        return out


def fit(profiles: tuple[int, ...], pasts: list[int], measured_ms: list[list[float]],
        acceptance: tuple[float, ...] = ()) -> StepModel:
    """Each profile's least-squares line through its times after `pasts` (one past: flat), its slope kept >= 0 (a
    longer past never makes a step cheaper: noise that says otherwise gives the mean)."""
    x = np.asarray(pasts, float)
    y = np.asarray(measured_ms, float)  # [past, profile]
    base, slope = [], []
    for i in range(len(profiles)):
        k = float(np.polyfit(x, y[:, i], 1)[0]) if len(set(pasts)) > 1 else 0.0
        k = max(0.0, k)
        slope.append(k)
        base.append(float(np.mean(y[:, i] - k * x)))
    return StepModel(tuple(profiles), tuple(base), tuple(slope), tuple(acceptance), 1.0, tuple(int(p) for p in pasts),
                     tuple(tuple(float(v) for v in row) for row in y))


def measure(engine, pasts: list[int], *, rounds: int) -> StepModel:
    """The verify curve of one sequence after each of `pasts` tokens (`rounds` per profile), the lines through it
    and the acceptance's cost per profile."""
    from trtspec.runtime.verify_curve import max_past, measure as measure_curve

    pasts = sorted({max_past(engine, p) for p in pasts})
    curves = [measure_curve(engine, rounds=rounds, past=p, batch=False) for p in pasts]
    profiles = curves[0].profiles
    return fit(profiles, pasts, [list(c.step_ms) for c in curves], acceptance_ms(engine, profiles, past=pasts[0]))


def acceptance_ms(engine, profiles: tuple[int, ...], *, past: int = 1, rounds: int = ACCEPT_ROUNDS,
                  seed: int = 0) -> tuple[float, ...]:
    """The greedy acceptance of a chain over each profile's verified rows, timed right after the verify step that
    produced them (after `past` random tokens), beyond a plain step's one row: median ms per profile, the plain
    profile's 0."""
    from trtspec.speculative.acceptance import accept_greedy
    from trtspec.speculative.tree import chain_tree

    rng = np.random.default_rng(seed)
    times: dict[int, list[float]] = {slots: [] for slots in profiles}
    seq = engine.open()
    try:
        engine.prefill(seq, rng.integers(0, engine.vocab_size, max(1, min(past, engine.manifest.profile.max_input_len))))
        for _ in range(rounds):
            for slots in profiles:
                tree = chain_tree(slots - 1)
                tokens = rng.integers(0, engine.vocab_size, slots)
                out = engine.verify(seq, tokens, tree.position_offsets, tree.mask)
                start = time.perf_counter()
                accept_greedy(tokens, out.logits, tree.paths)
                times[slots].append(time.perf_counter() - start)
    finally:
        engine.close(seq)
    ms = [1000 * float(np.median(times[slots])) for slots in profiles]
    return tuple(max(0.0, m - ms[0]) for m in ms)


def mean_past(prompt_tokens: int, decoded: int) -> float:
    """The mean context of a prompt's decode steps: the prompt, then half the tokens decoded after the first."""
    return prompt_tokens + decoded / 2


def measured_pasts(prompt_lengths: list[int], max_tokens: int) -> list[int]:
    """Where to measure the curve for prompts of these lengths decoding up to `max_tokens`: the shortest prompt,
    the median context and the longest prompt's end."""
    lengths = sorted(prompt_lengths)
    return sorted({lengths[0], int(np.median(lengths)) + max_tokens // 2, lengths[-1] + max_tokens})
