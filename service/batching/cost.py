"""What a batch costs the engine: a fixed part per batch and a part per real token, fitted to the batches it ran.

    busy time of a batch ~= fixed + per_token x real tokens

Two decisions use it. Batch formation holds a free engine for a burst that is arriving at most as long as the
fixed part: that is what merging two groups into one batch saves. Admission predicts the wait in front of a new
request as the batches the queue will make (each paying the fixed part once) plus its tokens; a plain tokens-per-
second rate measured on small batches (light load) would charge every queued token the small batches' overhead and
refuse work that, queued, runs in bigger and cheaper batches.

The fit is least squares over the recent batches of the device serving now (the window restarts when the device
changes: GPU to CPU fallback and back). Until the batches vary enough in size to separate the two parts, or when
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


class CostModel:
    def __init__(self, window: int = 64) -> None:
        if window < 2:
            raise ValueError("window must be at least 2")
        self._window = window
        self._device = ""
        self._samples: deque[tuple[float, float]] = deque()  # (real tokens, busy ns)
        self._cost: Cost | None = None

    def record(self, device: str, tokens: int, busy_ns: int) -> None:
        if device != self._device:
            self._samples.clear()
            self._device = device
        self._samples.append((float(max(tokens, 1)), float(max(busy_ns, 1))))
        if len(self._samples) > self._window:
            self._samples.popleft()
        self._cost = _fit(self._samples)

    @property
    def device(self) -> str:
        return self._device

    @property
    def cost(self) -> Cost | None:
        """None before the first batch on this device."""
        return self._cost


def _fit(samples: deque[tuple[float, float]]) -> Cost:
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in samples)
    # The sizes must spread by more than a few tokens for the two parts to be told apart.
    if n >= 4 and var_x > n * 16.0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / var_x
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return Cost(intercept, slope)
    return Cost(0.0, mean_y / mean_x)
