"""Batch formation: when the engine is free and work is queued, start now or hold a moment for a burst that is arriving.

Starting on the first arrival leaves the rest of a burst for the next batch. Under closed-loop load (every client
waits for its answer before it sends again: most real clients) that splits the clients into two groups that take
turns, so batches of ~half the clients run back to back, each paying the engine's fixed cost per batch. Holding
until the whole group is back merges them again.

How many rows to expect comes from occupancy: rows queued plus rows in the engine, sampled at every arrival. The
most seen within the last few batch times is what the recent load keeps in the system; when the queue holds fewer
while the engine is free, the difference is on its way (answers just went out, the next requests are coming in).
The hold ends as soon as

- the queue holds what is expected, or a full batch;
- the burst has stopped: no arrival for `gap_factor` times the recent gap between arrivals inside bursts;
- or the hold has lasted as long as the engine's fixed cost per batch (service/batching/cost.py): merging two groups
  into one batch saves one fixed cost, so waiting longer than that loses more engine time than it saves. It is
  also never more than `hold_share` of the recent batch time. Both bounds come from the engine's own measured
  speed; there is no fixed sleep.

A lone request on an idle server goes at once: occupancy older than the window is forgotten, so the only sample is
its own. One client in a closed loop always sees occupancy 1 and never waits. Not thread-safe: the batcher calls it
under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

GO = 0


@dataclass(frozen=True, slots=True)
class FormationPolicy:
    hold_share: float = 0.5  # the longest hold, as a share of the engine's recent batch time
    max_hold_ns: int = 50_000_000  # and never longer than this, whatever a slow batch took
    window_batches: float = 4.0  # occupancy is remembered for this many recent batch times
    gap_factor: float = 3.0  # a burst has stopped after this many recent in-burst gaps without an arrival
    min_gap_ns: int = 100_000  # the quiet time that ends a burst is never shorter than this
    min_quiet_share: float = 0.25  # ... nor than this share of the hold bound (in-burst gaps are a noisy estimate)
    ewma: float = 0.2  # weight of the newest sample in the batch-time and gap averages

    def __post_init__(self) -> None:
        if not 0.0 <= self.hold_share <= 1.0 or self.max_hold_ns < 0 or self.window_batches <= 0:
            raise ValueError("hold_share must be in [0, 1], max_hold_ns >= 0 and window_batches > 0")
        if self.gap_factor <= 0 or self.min_gap_ns < 0 or not 0.0 < self.ewma <= 1.0:
            raise ValueError("gap_factor must be > 0, min_gap_ns >= 0 and ewma in (0, 1]")


class BatchFormer:
    """Decides, each time it is asked, whether the free engine starts now (GO) or how long it may hold."""

    def __init__(self, policy: FormationPolicy | None = None) -> None:
        self.policy = policy or FormationPolicy()
        self._batch_ns = 0.0  # recent engine batch time (EWMA); 0 until a batch ran
        self._fixed_ns = 0.0  # the engine's fixed cost per batch, as last fitted
        self._gap_ns = 0.0  # recent gap between arrivals inside a burst (EWMA); 0 until one was seen
        self._last_arrival_ns: int | None = None
        self._occupancy: deque[tuple[int, int]] = deque()  # (time, rows queued + in the engine), oldest first

    # -- what happened ---------------------------------------------------------------------------------------------
    def arrived(self, now_ns: int, occupancy: int) -> None:
        """A request's rows were queued; `occupancy` counts them with everything queued and in the engine."""
        last, self._last_arrival_ns = self._last_arrival_ns, now_ns
        if last is not None and now_ns - last <= self.hold_limit_ns:  # longer gaps are idle time, not a burst
            self._gap_ns = self._average(self._gap_ns, now_ns - last)
        # A newer sample at least as large makes the older ones irrelevant to the maximum: drop them.
        while self._occupancy and self._occupancy[-1][1] <= occupancy:
            self._occupancy.pop()
        self._occupancy.append((now_ns, occupancy))

    def ran(self, busy_ns: int, fixed_ns: float) -> None:
        """The engine finished a batch that kept it busy for `busy_ns`; its fixed cost per batch is now `fixed_ns`."""
        self._batch_ns = self._average(self._batch_ns, max(busy_ns, 0))
        self._fixed_ns = max(fixed_ns, 0.0)

    # -- the decision ------------------------------------------------------------------------------------------------
    def expected_rows(self, now_ns: int) -> int:
        """The most rows the recent load has kept in the system (1 when nothing recent was seen)."""
        horizon = now_ns - int(self.policy.window_batches * self._batch_ns)
        while self._occupancy and self._occupancy[0][0] < horizon:
            self._occupancy.popleft()
        return self._occupancy[0][1] if self._occupancy else 1

    @property
    def hold_limit_ns(self) -> int:
        return int(min(self._fixed_ns, self.policy.hold_share * self._batch_ns, self.policy.max_hold_ns))

    def decide(self, now_ns: int, queued_rows: int, max_rows: int, hold_start_ns: int, in_engine_rows: int = 0
               ) -> int:
        """GO (0) to start a batch now, else how many ns to hold before asking again (an arrival asks sooner).

        `hold_start_ns` is when the engine was first free with this work queued. `in_engine_rows`: rows that other
        engine threads are running now. They are part of the expected occupancy but can never join this batch, so
        they come off what this one holds for (without that, a second engine thread held for rows the first one
        had, and always held to the bound)."""
        if queued_rows >= min(max(self.expected_rows(now_ns) - in_engine_rows, 1), max_rows):
            return GO
        remaining = hold_start_ns + self.hold_limit_ns - now_ns
        if remaining <= 0:
            return GO
        last = self._last_arrival_ns
        if self._gap_ns > 0 and last is not None and last > hold_start_ns:
            # The burst has begun to arrive (someone came during this hold): it has stopped when no one followed for
            # a few in-burst gaps. Before the first arrival, only the bound applies: while the engine ran, every
            # client may have been waiting on it, and their next requests start only once its answers are out.
            quiet_limit = max(self.policy.gap_factor * self._gap_ns, self.policy.min_gap_ns,
                              self.policy.min_quiet_share * self.hold_limit_ns)
            quiet_left = int(last + quiet_limit - now_ns)
            if quiet_left <= 0:
                return GO
            remaining = min(remaining, quiet_left)
        return remaining

    @property
    def batch_ns(self) -> float:
        """The engine's recent batch time (EWMA), 0 before the first batch."""
        return self._batch_ns

    def _average(self, current: float, sample: float) -> float:
        return sample if current == 0.0 else current + self.policy.ewma * (sample - current)
