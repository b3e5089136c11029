"""What a verify step costs per slot profile, relative to a plain one-slot step: the curve drafters budget against.

On a CPU a verify step's time grows with its slots, so a draft is worth its slots only when the tokens it is
expected to add pay for the step's extra cost. The engine measures the curve once (`runtime.verify_curve`); the core only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

# a line in the slots: the guess used until the engine's curve is measured
DEFAULT_COST_PER_SLOT = 0.0375


@dataclass(frozen=True)
class StepCosts:
    """`relative[i]` is the cost of a step over `profiles[i]` slots; profiles[0] is 1 (plain) at cost 1.0."""

    profiles: tuple[int, ...]
    relative: tuple[float, ...]
    step_ms: tuple[float, ...] = ()  # the measured milliseconds behind `relative`, when measured
    # the same steps over `batch` sequences at once (an in-flight batch), relative to the one-sequence plain step:
    # a batch's slots cost far more than one sequence's
    batch: int = 1
    batch_relative: tuple[float, ...] = ()

    def __post_init__(self):
        if not self.profiles or self.profiles[0] != 1 or len(self.profiles) != len(self.relative):
            raise ValueError(f"step costs need profiles starting at 1 and one cost each, got {self}")
        if list(self.profiles) != sorted(set(self.profiles)):
            raise ValueError(f"step-cost profiles must increase, got {self.profiles}")

    @classmethod
    def linear(cls, slot_profiles: tuple[int, ...], per_slot: float = DEFAULT_COST_PER_SLOT) -> StepCosts:
        """A straight-line guess: 1 + per_slot x (slots - 1)."""
        profiles = (1, *(s for s in slot_profiles if s > 1))
        return cls(profiles, tuple(1.0 + per_slot * (s - 1) for s in profiles))

    @property
    def max_slots(self) -> int:
        return self.profiles[-1]

    def profile_for(self, slots: int) -> int:
        """The smallest profile holding `slots` slots."""
        for size in self.profiles:
            if size >= slots:
                return size
        raise ValueError(f"{slots} slots exceed the largest profile ({self.max_slots})")

    def cost(self, slots: int) -> float:
        """The relative cost of a step that feeds `slots` slots (padded to its profile)."""
        return self.relative[self.profiles.index(self.profile_for(slots))]

    def batch_cost(self, rows: int, slots: int) -> float:
        """The relative cost of a step over `rows` sequences padded to the profile holding `slots`: interpolated
        linearly in rows between the one-sequence curve and the measured batch curve (rows x the one-sequence cost
        where no batch curve was measured)."""
        i = self.profiles.index(self.profile_for(slots))
        if rows <= 1:
            return self.relative[i]
        if not self.batch_relative or self.batch <= 1:
            return rows * self.relative[i]
        share = (rows - 1) / (self.batch - 1)
        return self.relative[i] + share * (self.batch_relative[i] - self.relative[i])

    def to_dict(self) -> dict:
        return {"profiles": list(self.profiles), "relative": [round(c, 4) for c in self.relative],
                "step_ms": [round(t, 3) for t in self.step_ms], "batch": self.batch,
                "batch_relative": [round(c, 4) for c in self.batch_relative]}
