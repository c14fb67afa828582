"""The circuit breaker in front of the GPU: closed (GPU serves), open (CPU serves until a cooldown ends), probing
(one batch tries the GPU). The cooldown doubles on every failed probe, up to a ceiling. A probe costs little (one
batch tries the GPU and, if it fails, runs on the CPU as it would have anyway), while every second on the CPU after the
GPU is well again serves at a fraction of its speed, so the defaults keep the ceiling short (service/settings.py).
What stops a flapping GPU (a probe that passes, then the next real batch fails) from being retried at the first,
shortest cooldown again and again is the settling time: the cooldown only goes back to the first one after the GPU has
served `settle_s` without a failure; a trip sooner than that re-opens with the last cooldown doubled.

Pure state and arithmetic over an injected clock, so every transition is tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

BreakerPhase = Literal["closed", "open", "probing"]
SETTLE_S = 60.0  # a GPU that served this long after a probe closed the breaker counts as recovered


@dataclass(frozen=True, slots=True)
class BreakerState:
    phase: BreakerPhase
    cooldown_s: float  # the wait in force: until the next probe while open, the first wait while closed
    opened_at_s: float  # clock reading when it last opened; 0.0 while it never did
    failures: int  # failures since it last closed: the trip plus every failed probe

    @property
    def probe_at_s(self) -> float:
        """When the next probe is due (meaningful while open)."""
        return self.opened_at_s + self.cooldown_s


class CircuitBreaker:
    """Owned by the engine thread; `state` may be read from any thread (it returns an immutable snapshot)."""

    def __init__(
        self, cooldown_s: float, max_cooldown_s: float, clock: Callable[[], float] = time.monotonic,
        settle_s: float = SETTLE_S,
    ) -> None:
        if cooldown_s <= 0 or max_cooldown_s < cooldown_s:
            raise ValueError("cooldown_s must be positive and max_cooldown_s at least cooldown_s")
        if settle_s < 0:
            raise ValueError("settle_s must not be negative")
        self._first_cooldown_s = cooldown_s
        self._max_cooldown_s = max_cooldown_s
        self._settle_s = settle_s
        self._clock = clock
        self._state = BreakerState("closed", cooldown_s, 0.0, 0)
        # When a probe last closed the breaker, and the cooldown in force then; None until one did.
        self._closed_at_s: float | None = None
        self._last_cooldown_s = cooldown_s

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state.phase == "closed"

    def trip(self) -> BreakerState:
        """A GPU failure while closed: open with the first cooldown, or, within `settle_s` of the last recovery,
        with the cooldown of then doubled (up to the ceiling)."""
        self._expect("closed", "trip")
        now = self._clock()
        cooldown = self._first_cooldown_s
        if self._closed_at_s is not None and now - self._closed_at_s < self._settle_s:
            cooldown = min(self._last_cooldown_s * 2, self._max_cooldown_s)
        self._state = BreakerState("open", cooldown, now, 1)
        return self._state

    def probe_due(self) -> bool:
        state = self._state
        return state.phase == "open" and self._clock() >= state.probe_at_s

    def begin_probe(self) -> BreakerState:
        if not self.probe_due():
            raise RuntimeError(f"no probe is due (breaker {self._state.phase})")
        self._state = BreakerState("probing", self._state.cooldown_s, self._state.opened_at_s, self._state.failures)
        return self._state

    def probe_succeeded(self) -> BreakerState:
        self._expect("probing", "close")
        self._closed_at_s, self._last_cooldown_s = self._clock(), self._state.cooldown_s
        self._state = BreakerState("closed", self._first_cooldown_s, self._state.opened_at_s, 0)
        return self._state

    def probe_failed(self) -> BreakerState:
        """Open again, waiting twice as long as last time (at most the ceiling) before the next probe."""
        self._expect("probing", "re-open")
        cooldown = min(self._state.cooldown_s * 2, self._max_cooldown_s)
        self._state = BreakerState("open", cooldown, self._clock(), self._state.failures + 1)
        return self._state

    def _expect(self, phase: BreakerPhase, action: str) -> None:
        if self._state.phase != phase:
            raise RuntimeError(f"cannot {action} a breaker that is {self._state.phase}")
