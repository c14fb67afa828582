"""When each request of an open-loop run is due: a piecewise-constant rate and the send times it implies.

Requests are spaced evenly within a segment (the way wrk2 paces them), not drawn at random: two runs of one plan
offer exactly the same load, and a test can say which request was due when. Request i is due at the moment the
integral of the rate from 0 reaches i, so request 0 goes out at t = 0 and a change of rate takes effect exactly
at its segment's start.

Profiles (`rate` is the peak rate the user asks for):

- steady: `rate` for the whole run.
- step: four equal steps at 25%, 50%, 75% and 100% of `rate`, to find where latency bends.
- burst: a baseline of `rate` with a burst at `factor` x `rate` (default 4x) for a tenth of every period,
  starting at the period's midpoint. The period is 10 s, or half the run when the run is shorter than 20 s,
  so every run holds at least two bursts with baseline before and after each.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

Profile = Literal["steady", "step", "burst"]
PROFILES: tuple[Profile, ...] = ("steady", "step", "burst")

STEP_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
BURST_FACTOR = 4.0
BURST_PERIOD_S = 10.0
BURST_SHARE = 0.1  # of each period spent bursting


@dataclass(frozen=True, slots=True)
class RatePlan:
    """`segments`: (start offset s, rate req/s), starts strictly increasing from 0; each rate holds until the
    next segment's start, the last until `duration_s`."""

    segments: tuple[tuple[float, float], ...]
    duration_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.duration_s) or self.duration_s <= 0:
            raise ValueError(f"duration_s must be a positive number, got {self.duration_s}")
        if not self.segments or self.segments[0][0] != 0:
            raise ValueError("the first segment must start at 0")
        starts = [start for start, _ in self.segments]
        if any(b <= a for a, b in itertools.pairwise(starts)) or starts[-1] >= self.duration_s:
            raise ValueError(f"segment starts must increase and lie before duration_s: {starts}")
        for _, rate in self.segments:
            if not math.isfinite(rate) or rate < 0:
                raise ValueError(f"rates must be finite and >= 0, got {rate}")

    # --- profiles ---------------------------------------------------------------------------------------------------
    @classmethod
    def steady(cls, rate: float, duration_s: float) -> RatePlan:
        return cls(((0.0, float(rate)),), float(duration_s))

    @classmethod
    def step(cls, rate: float, duration_s: float) -> RatePlan:
        width = duration_s / len(STEP_FRACTIONS)
        return cls(tuple((i * width, rate * f) for i, f in enumerate(STEP_FRACTIONS)), float(duration_s))

    @classmethod
    def burst(cls, rate: float, duration_s: float, *, factor: float = BURST_FACTOR,
              period_s: float | None = None) -> RatePlan:
        period = period_s if period_s is not None else min(BURST_PERIOD_S, duration_s / 2)
        if period <= 0 or factor <= 0:
            raise ValueError("period_s and factor must be positive")
        segments: list[tuple[float, float]] = [(0.0, float(rate))]
        start = 0.0
        while start < duration_s:
            on, off = start + period / 2, start + period / 2 + period * BURST_SHARE
            if on < duration_s:
                segments.append((on, rate * factor))
                if off < duration_s:
                    segments.append((off, float(rate)))
            start += period
        return cls(tuple(segments), float(duration_s))

    @classmethod
    def of(cls, profile: Profile, rate: float, duration_s: float) -> RatePlan:
        if profile == "steady":
            return cls.steady(rate, duration_s)
        if profile == "step":
            return cls.step(rate, duration_s)
        if profile == "burst":
            return cls.burst(rate, duration_s)
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")

    # --- what the plan implies --------------------------------------------------------------------------------------
    def _ends(self) -> list[float]:
        return [start for start, _ in self.segments[1:]] + [self.duration_s]

    def rate_at(self, t: float) -> float:
        """The planned rate at offset t (0 outside [0, duration_s))."""
        if not 0 <= t < self.duration_s:
            return 0.0
        index = bisect.bisect_right([start for start, _ in self.segments], t) - 1
        return self.segments[index][1]

    def expected(self, t: float) -> float:
        """Requests due in [0, t): the integral of the rate."""
        total = 0.0
        for (start, rate), end in zip(self.segments, self._ends(), strict=True):
            if t <= start:
                break
            total += rate * (min(t, end) - start)
        return total

    @property
    def count(self) -> int:
        """How many requests the plan sends: those due strictly before duration_s."""
        return sum(1 for _ in self.times())

    @property
    def mean_rate(self) -> float:
        return self.expected(self.duration_s) / self.duration_s

    def times(self) -> Iterator[float]:
        """Intended send offsets in seconds, ascending: request i at the t where expected(t) == i."""
        index = 0
        done = 0.0  # requests due before the current segment's start
        # A request due at the very end of a segment, computed in floating point, must not be sent twice or lost:
        # each one is placed by integer index, so rounding moves it by ~1e-15 s at most, never duplicates it.
        for (start, rate), end in zip(self.segments, self._ends(), strict=True):
            if rate > 0:
                while True:
                    t = max(start, start + (index - done) / rate)
                    if t >= end:
                        break
                    yield t
                    index += 1
            done += rate * (end - start)

    def to_json(self) -> dict[str, object]:
        return {"duration_s": self.duration_s, "segments": [list(s) for s in self.segments],
                "requests": self.count, "mean_rate": self.mean_rate}
