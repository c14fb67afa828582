"""Refusals paced against answers: a closed loop of clients that sends again as soon as a 429 comes back must not turn
the CPU the engine needs into refusals.

Admission refuses at once, and a client that honours `Retry-After` is gone for a second or more. Load generators
(`wrk`, `hey`, `ab`) and scripts with a fixed number of workers do not wait: every 429 brings the next request
straight back, so beyond the admission floor each refusal begets another, thousands a second, and on a small host
their handling takes a core the engine needed (docs/benchmarks/2026-12-04-closed-loops-retry-after.md).
So each HTTP process answers refusals at once only up to a budget: `per_answer` refusals a second for every request
it answered 200 a second (both counted over about the last second), plus `floor` a second, with a quarter of a
second's worth as a burst. A refusal beyond the budget is held in turn, as a generic cell rate algorithm spaces
cells, until its slot comes, for at most `MAX_HOLD_S` (the shortest `Retry-After` a refusal ever gives) and never past
the request's deadline, then answered. Open-loop overload of a few times capacity refuses a few requests per one
admitted and stays within the budget; a closed loop that does not wait is slowed to the budget's rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MAX_HOLD_S = 1.0  # the shortest Retry-After a refusal gives: a client that honours it waits that long anyway
FLOOR_PER_S = 200.0  # refusals a second answered at once whatever was answered 200
BURST_S = 0.25  # refusals the budget lets through at once after a quiet spell, in seconds of the budget's rate
WINDOW_S = 1.0  # time constant of the decaying count of 200 answers


class RefusalPacer:
    """When each refusal may be answered. One per HTTP process, used from its event loop only (not thread-safe)."""

    __slots__ = ("_answered", "_at", "_clock", "_due", "floor", "per_answer")

    def __init__(self, per_answer: float, floor: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        floor = FLOOR_PER_S if floor is None else floor
        if not per_answer > 0 or not floor > 0:
            raise ValueError("per_answer and floor must be positive")
        self.per_answer = per_answer
        self.floor = floor
        self._clock = clock
        self._answered = 0.0  # 200 answers, decaying with WINDOW_S: about the rate a second in a steady state
        self._at = clock()
        self._due = 0.0  # the theoretical time of the next refusal: the budget is spent up to here

    def answered(self) -> None:
        """A request was answered 200."""
        self._decay()
        self._answered += 1.0

    def hold_s(self, deadline_left_s: float = math.inf) -> float:
        """Seconds to hold the refusal being made now before answering it (0: answer at once); it takes its slot."""
        now = self._decay()
        interval = 1.0 / (self.per_answer * self._answered + self.floor)
        due = max(self._due, now)
        hold = due - BURST_S - now
        if hold > MAX_HOLD_S:  # beyond the longest hold: answered then, without pushing later refusals further out
            hold, due = MAX_HOLD_S, now + BURST_S + MAX_HOLD_S
        self._due = due + interval
        return max(0.0, min(hold, deadline_left_s))

    @property
    def budget_per_s(self) -> float:
        """Refusals a second answered at once now."""
        self._decay()
        return self.per_answer * self._answered + self.floor

    def _decay(self) -> float:
        now = self._clock()
        if now > self._at:
            self._answered *= math.exp(-(now - self._at) / WINDOW_S)
            self._at = now
        return now
