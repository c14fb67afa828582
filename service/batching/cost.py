"""What a batch costs the engine: a fixed part per batch and a part per real token, fitted to the batches it ran.

    busy time of a batch ~= fixed + per_token x real tokens

Two decisions use it. Batch formation holds a free engine for a burst that is arriving at most as long as the
fixed part: that is what merging two groups into one batch saves. Admission predicts the wait in front of a new
request as the batches the queue will make (each paying the fixed part once) plus its tokens; a plain tokens-per-
second rate measured on small batches (light load) would charge every queued token the small batches' overhead and
refuse work that, queued, runs in bigger and cheaper batches.

The fit is least squares over the recent batches of the device serving now (the window restarts when the device
changes: GPU to CPU fallback and back, and when the engine's speed changes: `shift_run` batches in a row all off
the fitted cost by more than `shift_factor` either way, as when a noisy neighbour comes or goes, restart it from
those batches, so a slow spell stops inflating the hold and the predicted wait a few batches after it ends).
Until the batches vary enough in size to separate the two parts, or when
the fit says something impossible (a negative part), the whole cost is put on the tokens. Not thread-safe: the
batcher calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cost:
    fixed_ns: float  # per batch
    per_token_ns: float  # per real token

    def batch_ns(self, tokens: float) -> float:
        return self.fixed_ns + self.per_token_ns * tokens

    def rows_within(self, budget_ns: float, tokens_per_row: float) -> float:
        # The inverse of batch_ns: how many rows of that length one batch holds within the budget (inf: no limit).
        per_row_ns = self.per_token_ns * tokens_per_row
        return (budget_ns - self.fixed_ns) / per_row_ns if per_row_ns > 0.0 else float("inf")


class CostModel:
    def __init__(self, window: int = 64, shift_run: int = 8, shift_factor: float = 2.0) -> None:
        if window < 2:
            raise ValueError("window must be at least 2")
        if shift_run < 2 or shift_factor <= 1.0:
            raise ValueError("shift_run must be at least 2 and shift_factor above 1")
        self._window = window
        self._shift_run = min(shift_run, window)
        self._shift_factor = shift_factor
        self._off = 0  # batches in a row off the fitted cost by more than shift_factor, the same way
        self._off_slower = False
        self._device = ""
        self._samples = _Window()
        self._cost: Cost | None = None

    def record(self, device: str, tokens: int, busy_ns: int) -> None:
        """One batch ran. O(1): the fit is kept as running sums (the engine thread calls this under the batcher's
        lock after every batch, so a pass over the window each time held the lock ~20 µs a batch)."""
        samples = self._samples
        if device != self._device:
            samples.clear()
            self._device = device
            self._off = 0
        sample = (float(max(tokens, 1)), float(max(busy_ns, 1)))
        self._track_shift(sample)
        samples.append(sample)
        if self._off >= self._shift_run:  # the engine's speed changed: what came before no longer describes it
            while len(samples) > self._shift_run:
                samples.popleft()
            self._off = 0
        if len(samples) > self._window:
            samples.popleft()
        self._cost = samples.fit()

    def _track_shift(self, sample: tuple[float, float]) -> None:
        if self._cost is None:
            return
        predicted = self._cost.batch_ns(sample[0])
        slower, faster = sample[1] > predicted * self._shift_factor, sample[1] * self._shift_factor < predicted
        if not (slower or faster):
            self._off = 0
        elif self._off and slower == self._off_slower:
            self._off += 1
        else:
            self._off, self._off_slower = 1, slower

    @property
    def device(self) -> str:
        return self._device

    @property
    def cost(self) -> Cost | None:
        """None before the first batch on this device."""
        return self._cost


class _Window:
    """The recent (real tokens, busy ns) samples with the sums their least-squares fit needs, kept as samples come and
    go. The sums are recomputed from the samples every `_RESUM` changes, so rounding cannot build up over a long run."""

    _RESUM = 256

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()
        self._changes = 0
        self._sx = self._sy = self._sxx = self._sxy = 0.0

    def __len__(self) -> int:
        return len(self._samples)

    def clear(self) -> None:
        self._samples.clear()
        self._sx = self._sy = self._sxx = self._sxy = 0.0

    def append(self, sample: tuple[float, float]) -> None:
        self._samples.append(sample)
        self._add(sample, 1.0)

    def popleft(self) -> None:
        self._add(self._samples.popleft(), -1.0)

    def _add(self, sample: tuple[float, float], sign: float) -> None:
        x, y = sample
        self._sx += sign * x
        self._sy += sign * y
        self._sxx += sign * x * x
        self._sxy += sign * x * y
        self._changes += 1
        if self._changes >= self._RESUM:
            self._changes = 0
            samples = self._samples
            self._sx = sum(x for x, _ in samples)
            self._sy = sum(y for _, y in samples)
            self._sxx = sum(x * x for x, _ in samples)
            self._sxy = sum(x * y for x, y in samples)

    def fit(self) -> Cost:
        n = len(self._samples)
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx - self._sx * mean_x  # sum of (x - mean_x)^2
        # The sizes must spread by more than a few tokens for the two parts to be told apart.
        if n >= 4 and var_x > n * 16.0:
            slope = (self._sxy - self._sx * mean_y) / var_x  # sum of (x - mean_x)(y - mean_y), over var_x
            intercept = mean_y - slope * mean_x
            if slope > 0 and intercept >= 0:
                return Cost(intercept, slope)
        return Cost(0.0, mean_y / mean_x)
