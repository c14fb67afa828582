"""What a load run measured: every sample (optionally), an HdrHistogram of successful latencies, counts by outcome.

Latency is recorded in microseconds into an HdrHistogram (3 significant digits, 1 us to 1 h). Only successful
(2xx) requests go into the histogram; failures are counted by kind, because a 429 answered in 0.2 ms or a
request that was never sent would otherwise pull the percentiles down and flatter an overloaded server.

Rates: `offered_rate` is what the schedule released per second; `achieved_rate` counts requests answered (any
HTTP status) within the schedule's window, per second of that window, the way wrk reports Requests/sec;
`ok_rate` counts only the 2xx ones.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from glassbox.chaos.samples import ERROR_KINDS, ErrorKind, Sample

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_DIGITS = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9, 99.99)
SPECTRUM_TICKS = 4  # spectrum rows per halving of the distance to 100%


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def _micros(seconds: float) -> int:
    return min(HIGHEST_US, max(LOWEST_US, round(seconds * 1e6)))


def _label(p: float) -> str:
    return "p" + (f"{p:.0f}" if p == int(p) else f"{p:g}")


@dataclass(slots=True)
class Recorder:
    """Collects samples as they finish. Used by the generator on its event loop only, so it needs no lock."""

    window_s: float  # completions at or before this offset count toward the achieved rate
    keep_samples: bool = True
    on_sample: Callable[[Sample], None] | None = None
    samples: list[Sample] = field(default_factory=list)
    histogram: HdrHistogram = field(default_factory=new_histogram)
    lags: HdrHistogram = field(default_factory=new_histogram)  # how late the scheduler released each request
    errors: dict[ErrorKind, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    recorded: int = 0
    ok: int = 0
    answered: int = 0  # got an HTTP status, 2xx or not
    answered_in_window: int = 0
    ok_in_window: int = 0

    def __call__(self, sample: Sample) -> None:
        self.recorded += 1
        if self.keep_samples:
            self.samples.append(sample)
        in_window = sample.done_s <= self.window_s
        if sample.status:
            self.answered += 1
            self.answered_in_window += in_window
        if sample.error is None:
            self.ok += 1
            self.ok_in_window += in_window
            self.histogram.record_value(_micros(sample.latency_s))
        else:
            self.errors[sample.error] += 1
        if self.on_sample is not None:
            self.on_sample(sample)

    def lag(self, late_s: float) -> None:
        self.lags.record_value(_micros(late_s))


@dataclass(frozen=True, slots=True)
class LoadResult:
    samples: list[Sample]  # in completion order; empty when the run was asked not to keep them
    duration_s: float  # the schedule's window: the plan's duration, or less when stop() ended the run
    elapsed_s: float  # from the start to the end of the last request (the window plus the drain)
    planned: int  # requests the plan holds
    scheduled: int  # requests whose send time came before the run ended (sent, or refused as backlog)
    recorded: int  # samples taken: every scheduled request except those cancelled by stop()
    cancelled: int  # queued or in flight when stop() ended the run: no sample
    ok: int
    answered: int
    answered_in_window: int
    ok_in_window: int
    errors: dict[ErrorKind, int]
    histogram: HdrHistogram = field(repr=False)
    lags: HdrHistogram = field(repr=False)  # scheduler lag: release time minus intended send time
    stopped: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    cpu_s: float = 0.0  # CPU time (user + system) of the generator's whole process during the run
    slice_ns: int | None = None  # the generator thread's scheduler slice during the run; None where none is known

    @property
    def offered_rate(self) -> float:
        return self.scheduled / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def achieved_rate(self) -> float:
        """Requests answered (any status) within the window, per second."""
        return self.answered_in_window / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def ok_rate(self) -> float:
        return self.ok_in_window / self.duration_s if self.duration_s > 0 else 0.0

    def percentiles(self, points: Sequence[float] = PERCENTILES) -> dict[str, float]:
        """Latency of successful requests in milliseconds at each percentile, plus min, mean and max."""
        h = self.histogram
        if h.get_total_count() == 0:
            return {}
        values = {_label(p): h.get_value_at_percentile(p) / 1e3 for p in points}
        values.update(min=h.get_min_value() / 1e3, mean=h.get_mean_value() / 1e3, max=h.get_max_value() / 1e3,
                      stddev=h.get_stddev() / 1e3)
        return values

    def spectrum(self, ticks: int = SPECTRUM_TICKS) -> list[dict[str, float]]:
        """HdrHistogram's percentile spectrum: rows at 0%, then `ticks` rows per halving of the distance to
        100% (50%, 75%, 87.5%, ... when ticks is 1), until the last sample; then 100% (the max)."""
        h = self.histogram
        total = h.get_total_count()
        if total == 0:
            return []
        # Cumulative counts by value, walked once: the histogram only answers "how many at exactly this value".
        values, totals = [], []
        for item in h.get_recorded_iterator():
            values.append(item.value_iterated_to)
            totals.append(item.total_count_to_this_value)
        rows: list[dict[str, float]] = []
        step = 0
        while (p := 100.0 * (1.0 - 0.5 ** (step / ticks))) < 100.0 * (1.0 - 1.0 / total):
            value = h.get_value_at_percentile(p)
            below = bisect.bisect_right(values, value)
            count = totals[below - 1] if below else 0
            rows.append({"percentile": round(p, 6), "latency_ms": value / 1e3, "count": count})
            step += 1
        rows.append({"percentile": 100.0, "latency_ms": h.get_max_value() / 1e3, "count": total})
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "duration_s": self.duration_s,
            "elapsed_s": self.elapsed_s,
            "stopped": self.stopped,
            # On a machine shared with the server, this is CPU the server did not get.
            "generator_cpu_s": self.cpu_s,
            "generator_cpu_ms_per_request": self.cpu_s / self.recorded * 1e3 if self.recorded else None,
            "offered_rate": self.offered_rate,
            "achieved_rate": self.achieved_rate,
            "ok_rate": self.ok_rate,
            "counts": {"planned": self.planned, "scheduled": self.scheduled, "recorded": self.recorded,
                       "cancelled": self.cancelled, "ok": self.ok, "answered": self.answered,
                       "answered_in_window": self.answered_in_window, "ok_in_window": self.ok_in_window,
                       "errors": sum(self.errors.values())},
            "errors": dict(self.errors),
            "latency_ms": self.percentiles(),
            # The generator's own lateness in releasing requests (its event loop was busy or its timer coarse):
            # already inside latency_ms; large values mean the generator, not the server, is the bottleneck.
            "scheduler_lag_ms": _summary(self.lags),
            # 0.1 ms where the kernel took the generator's request (chaos/loadgen/slice.py); else the kernel's own.
            "scheduler_slice_ms": self.slice_ns / 1e6 if self.slice_ns is not None else None,
            "spectrum": self.spectrum(),
        }


def _summary(h: HdrHistogram) -> dict[str, float]:
    if h.get_total_count() == 0:
        return {}
    return {"p50": h.get_value_at_percentile(50) / 1e3, "p99": h.get_value_at_percentile(99) / 1e3,
            "max": h.get_max_value() / 1e3}
