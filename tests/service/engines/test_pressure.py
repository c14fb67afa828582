"""The memory-pressure switch over injected readings: thresholds, hysteresis, the reading interval, broken readers."""

from __future__ import annotations

import logging

import pytest

from glassbox.service.engines.pressure import MemoryPressure, MemoryReading
from tests.service.engines.doubles import ManualClock

GIB = 2**30


class Readings:
    """Hands out used/total ratios of a 10 GiB device, counting calls; an exception in the list is raised."""

    def __init__(self, *ratios: float | Exception) -> None:
        self.queue = list(ratios)
        self.calls = 0

    def __call__(self) -> MemoryReading:
        self.calls += 1
        value = self.queue.pop(0)
        if isinstance(value, Exception):
            raise value
        return MemoryReading(int(value * 10 * GIB), 0, 10 * GIB)


def monitor(readings: Readings, clock: ManualClock, interval_s: float = 0.0) -> MemoryPressure:
    return MemoryPressure(readings, 0.95, 0.85, interval_s=interval_s, clock=clock)


def test_on_at_the_high_mark_off_only_below_the_low_mark() -> None:
    ratios = [0.5, 0.9499, 0.95, 0.99, 0.90, 0.85, 0.8499, 0.90, 0.94, 0.951]
    readings, clock = Readings(*ratios), ManualClock()
    pressure = monitor(readings, clock)
    seen = []
    for _ in ratios:
        clock.advance(1.0)
        seen.append(pressure.high())
    assert seen == [False, False, True, True, True, True, False, False, False, True]


def test_the_device_is_read_at_most_once_per_interval() -> None:
    readings, clock = Readings(0.96, 0.5), ManualClock()
    pressure = monitor(readings, clock, interval_s=0.1)
    assert pressure.high()
    for _ in range(5):
        clock.advance(0.019)
        assert pressure.high()  # the cached answer: 0.095 s after the reading
    assert readings.calls == 1
    clock.advance(0.005)
    assert not pressure.high()
    assert readings.calls == 2


def test_the_larger_of_device_use_and_allocator_reserve_counts() -> None:
    assert MemoryReading(used_bytes=50, reserved_bytes=96, total_bytes=100).ratio == 0.96
    assert MemoryReading(used_bytes=97, reserved_bytes=10, total_bytes=100).ratio == 0.97
    assert MemoryReading(0, 0, 0).ratio == 0.0
    pressure = MemoryPressure(lambda: MemoryReading(10, 96, 100), 0.95, 0.85, interval_s=0.0, clock=ManualClock())
    assert pressure.high()
    assert pressure.state.reading == MemoryReading(10, 96, 100)


def test_a_failing_reader_keeps_the_last_state_and_logs_once_per_streak(caplog: pytest.LogCaptureFixture) -> None:
    readings = Readings(0.97, RuntimeError("NVML gone"), RuntimeError("NVML gone"), 0.5, RuntimeError("again"))
    clock = ManualClock()
    pressure = monitor(readings, clock)
    with caplog.at_level(logging.WARNING, logger="glassbox.fallback"):
        answers = []
        for _ in range(5):
            clock.advance(1.0)
            answers.append(pressure.high())
    assert answers == [True, True, True, False, False]
    assert [r.getMessage().count("NVML gone") + r.getMessage().count("again") for r in caplog.records] == [1, 1]


@pytest.mark.parametrize(("high", "low"), [(0.85, 0.95), (0.9, 0.9), (1.1, 0.5), (0.9, 0.0)])
def test_marks_out_of_order_are_refused(high: float, low: float) -> None:
    with pytest.raises(ValueError):
        MemoryPressure(Readings(), high, low)
