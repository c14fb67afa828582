"""GPU memory pressure with hysteresis: above the high mark new batches should go to the CPU before an OOM happens;
they come back once usage falls below the low mark.

Readings come from an injected callable (on a GPU, `cuda_memory_reader`), taken at most once per `interval_s`:
a reading costs a driver call, and memory does not move on the scale of one batch often enough to pay for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger("glassbox.fallback")

CHECK_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class MemoryReading:
    used_bytes: int  # device-wide use, every process included (what NVML reports: total - free)
    reserved_bytes: int  # held by this process's caching allocator, in use or cached
    total_bytes: int

    @property
    def ratio(self) -> float:
        """The larger of used/total and reserved/total."""
        if self.total_bytes <= 0:
            return 0.0
        return max(self.used_bytes, self.reserved_bytes) / self.total_bytes


MemoryReader = Callable[[], MemoryReading]


def cuda_memory_reader(device: str) -> MemoryReader:
    """Reads `torch.cuda.mem_get_info` (cudaMemGetInfo: the device-wide figure NVML shows) and the allocator's
    reserved bytes. Never called on a machine without CUDA."""
    index = torch.device(device)

    def read() -> MemoryReading:
        free, total = torch.cuda.mem_get_info(index)
        return MemoryReading(int(total - free), int(torch.cuda.memory_reserved(index)), int(total))

    return read


@dataclass(frozen=True, slots=True)
class PressureState:
    high: bool  # True from a reading at or above the high mark until one below the low mark
    reading: MemoryReading | None  # the last successful reading
    checked_at_s: float  # clock reading of the last check; -inf before the first


class MemoryPressure:
    """Hysteresis over readings: turns on at `ratio >= high`, off at `ratio < low`. A failing reader keeps the
    last state (logged once per failure streak) rather than guessing in either direction."""

    def __init__(
        self,
        reader: MemoryReader,
        high: float,
        low: float,
        *,
        interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < low < high <= 1:
            raise ValueError("need 0 < low < high <= 1")
        self._reader = reader
        self._high_mark = high
        self._low_mark = low
        self._interval_s = interval_s
        self._clock = clock
        self._state = PressureState(False, None, float("-inf"))
        self._failing = False

    @property
    def state(self) -> PressureState:
        return self._state

    def high(self) -> bool:
        """Whether memory is under pressure, reading the device only when the last reading is `interval_s` old."""
        now = self._clock()
        state = self._state
        if now - state.checked_at_s < self._interval_s:
            return state.high
        try:
            reading = self._reader()
        except Exception as exc:  # a broken reader must not take batches down; the OOM path still guards
            if not self._failing:
                log.warning("GPU memory reading failed, keeping the last pressure state: %s", exc)
            self._failing = True
            self._state = PressureState(state.high, state.reading, now)
            return state.high
        self._failing = False
        ratio = reading.ratio
        high = ratio >= self._high_mark if not state.high else ratio >= self._low_mark
        self._state = PressureState(high, reading, now)
        return high
