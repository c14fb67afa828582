"""A running estimate of how fast the engine clears work, per device, from the batches it actually ran."""

from __future__ import annotations

from collections import deque


class ThroughputMeter:
    """Rows and real tokens per second of engine busy time over the last `window` batches.

    Busy time, not wall time: an idle engine is not a slow one. The window restarts when the device
    changes (GPU -> CPU fallback and back), so the estimate always describes the device now in use.
    Not thread-safe; the batcher calls it under its lock.
    """

    def __init__(self, window: int = 32) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._window = window
        self._device = ""
        self._samples: deque[tuple[int, int, int]] = deque()  # (rows, real tokens, busy ns)
        self._rows = 0
        self._tokens = 0
        self._busy_ns = 0

    def record(self, device: str, rows: int, tokens: int, busy_ns: int) -> None:
        if device != self._device:
            self._samples.clear()
            self._rows = self._tokens = self._busy_ns = 0
            self._device = device
        busy_ns = max(busy_ns, 1)  # a zero-length run (coarse clocks, fakes) must not divide by zero later
        self._samples.append((rows, tokens, busy_ns))
        self._rows += rows
        self._tokens += tokens
        self._busy_ns += busy_ns
        if len(self._samples) > self._window:
            old_rows, old_tokens, old_ns = self._samples.popleft()
            self._rows -= old_rows
            self._tokens -= old_tokens
            self._busy_ns -= old_ns

    @property
    def device(self) -> str:
        """The device of the most recent batch; "" before the first."""
        return self._device

    @property
    def items_per_s(self) -> float:
        return self._rows * 1e9 / self._busy_ns if self._busy_ns else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self._tokens * 1e9 / self._busy_ns if self._busy_ns else 0.0

