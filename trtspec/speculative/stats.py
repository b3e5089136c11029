"""Acceptance statistics with the definitions every part of trtspec shares (docs/design.md, "Metrics").

acceptance rate = accepted draft tokens / drafted tokens; acceptance length τ = 1 + accepted / steps (the
bonus token counts); per-position acceptance = P(draft token at depth d accepted | depth d − 1 accepted).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Running statistics of one request (or, merged, of many)."""

    steps: int = 0  # verify steps (the prefill is not a step)
    draft_tokens: int = 0  # draft tokens proposed over all steps (tree nodes)
    accepted_tokens: int = 0  # draft tokens accepted over all steps
    position_trials: list[int] = field(default_factory=list)  # [d-1]: steps with depth d drafted and d-1 accepted
    position_hits: list[int] = field(default_factory=list)  # [d-1]: steps that accepted depth d
    profile_steps: dict[int, int] = field(default_factory=dict)  # slot profile → verify steps run over it
    draft_s: float = 0.0  # wall time in the drafter (propose + observe, an EAGLE draft's graph runs included)

    def record(self, *, drafted: int, depth: int, accepted: int, slots: int = 0) -> None:
        """Count one verify step: `drafted` nodes in a tree of `depth`, `accepted` of them on the path, run over a
        slot profile of `slots` (1: a plain step; 0: the engine did not say)."""
        self.steps += 1
        if slots:
            self.profile_steps[slots] = self.profile_steps.get(slots, 0) + 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        _grow(self.position_trials, depth)
        _grow(self.position_hits, depth)
        for d in range(min(depth, accepted + 1)):  # depth d+1 was tried iff d tokens were accepted
            self.position_trials[d] += 1
        for d in range(accepted):
            self.position_hits[d] += 1

    def merge(self, other: SpecStats) -> SpecStats:
        n = max(len(self.position_trials), len(other.position_trials))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        profiles = dict(self.profile_steps)
        for slots, steps in other.profile_steps.items():
            profiles[slots] = profiles.get(slots, 0) + steps
        return SpecStats(self.steps + other.steps, self.draft_tokens + other.draft_tokens,
                         self.accepted_tokens + other.accepted_tokens,
                         [a + b for a, b in zip(pad(self.position_trials), pad(other.position_trials))],
                         [a + b for a, b in zip(pad(self.position_hits), pad(other.position_hits))],
                         dict(sorted(profiles.items())), self.draft_s + other.draft_s)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [h / t if t else 0.0 for h, t in zip(self.position_hits, self.position_trials)]

    def to_dict(self) -> dict:
        return {"steps": self.steps, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "acceptance_length": round(self.acceptance_length, 4),
                "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
                "steps_per_profile": {str(k): v for k, v in sorted(self.profile_steps.items())}}


def _grow(counts: list[int], size: int) -> None:
    counts.extend([0] * (size - len(counts)))
