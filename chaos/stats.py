"""Latency statistics for experiments: per-phase percentiles, bootstrap confidence intervals, error fractions,
and the recovery time after a rollback. Pure functions over Samples and Observations; no I/O.

Latency percentiles are over successful (2xx) requests only; failures are judged by the error budget, so a fast
5xx can never make a phase look quicker. A sample belongs to the phase its intended send time falls in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from glassbox.chaos.metrics_scrape import Observation
from glassbox.chaos.samples import ERROR_KINDS, ErrorKind, Sample

Array = npt.NDArray[np.float64]
MAX_CELLS = 4_000_000  # resampled values held at once (32 MB of float64): bounds memory for long runs


@dataclass(frozen=True, slots=True)
class PhaseWindow:
    name: str
    start_s: float  # on the load generator's clock
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class PhaseStats:
    name: str
    start_s: float
    end_s: float
    requests: int  # samples whose intended send time fell in the phase
    ok: int
    errors: dict[str, int]  # by ErrorKind, every kind present (zeros included)
    p50_s: float | None  # None: no successful request to measure
    p95_s: float | None
    p99_s: float | None
    p999_s: float | None

    @property
    def offered_rate(self) -> float:
        return self.requests / (self.end_s - self.start_s) if self.end_s > self.start_s else 0.0

    @property
    def ok_rate(self) -> float:
        return self.ok / (self.end_s - self.start_s) if self.end_s > self.start_s else 0.0

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "start_s": self.start_s, "end_s": self.end_s, "requests": self.requests,
                "ok": self.ok, "errors": self.errors, "offered_rate": self.offered_rate, "ok_rate": self.ok_rate,
                "latency_s": {"p50": self.p50_s, "p95": self.p95_s, "p99": self.p99_s, "p99.9": self.p999_s}}


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with a bootstrap percentile confidence interval."""

    point: float
    low: float
    high: float
    confidence: float
    resamples: int

    def to_json(self) -> dict[str, float | int]:
        return {"point": self.point, "ci_low": self.low, "ci_high": self.high, "confidence": self.confidence,
                "resamples": self.resamples}


@dataclass(frozen=True, slots=True)
class ErrorCount:
    counted: int  # samples ending in one of the counted kinds
    total: int
    by_kind: dict[str, int]

    @property
    def fraction(self) -> float:
        return self.counted / self.total if self.total else 0.0


def in_window(samples: Iterable[Sample], start_s: float, end_s: float) -> list[Sample]:
    return [s for s in samples if start_s <= s.intended_s < end_s]


def split_phases(samples: Sequence[Sample], windows: Sequence[PhaseWindow]) -> dict[str, list[Sample]]:
    """Samples by phase; the last phase also takes samples intended exactly at its end."""
    out: dict[str, list[Sample]] = {w.name: [] for w in windows}
    for sample in samples:
        for i, w in enumerate(windows):
            last = i == len(windows) - 1
            if w.start_s <= sample.intended_s < w.end_s or (last and sample.intended_s == w.end_s):
                out[w.name].append(sample)
                break
    return out


def ok_latencies(samples: Iterable[Sample]) -> Array:
    return np.fromiter((s.latency_s for s in samples if s.ok), dtype=np.float64)


def percentile(values: Array, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def phase_stats(window: PhaseWindow, samples: Sequence[Sample]) -> PhaseStats:
    latencies = ok_latencies(samples)
    kinds = Counter(s.error for s in samples if s.error is not None)
    return PhaseStats(window.name, window.start_s, window.end_s, len(samples), int(latencies.size),
                      {kind: kinds.get(kind, 0) for kind in ERROR_KINDS}, percentile(latencies, 50),
                      percentile(latencies, 95), percentile(latencies, 99), percentile(latencies, 99.9))


def errors(samples: Sequence[Sample], kinds: Sequence[ErrorKind]) -> ErrorCount:
    by_kind = Counter(s.error for s in samples if s.error is not None)
    counted = sum(by_kind.get(kind, 0) for kind in kinds)
    return ErrorCount(counted, len(samples), {kind: by_kind.get(kind, 0) for kind in ERROR_KINDS})


def resampled_percentiles(values: Array, q: float, resamples: int, rng: np.random.Generator) -> Array:
    """The q-th percentile of `resamples` bootstrap resamples (drawn with replacement, same size as `values`)."""
    n = values.size
    rows = max(1, MAX_CELLS // n)
    out = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        picks = rng.integers(0, n, size=(count, n))  # [count, n]
        out[start:start + count] = np.percentile(values[picks], q, axis=1)
    return out


def _interval(draws: Array, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_percentile(values: Array, q: float = 99.0, *, resamples: int = 2000, confidence: float = 0.95,
                         seed: int = 0) -> Estimate | None:
    if not values.size:
        return None
    draws = resampled_percentiles(values, q, resamples, np.random.default_rng(seed))
    low, high = _interval(draws, confidence)
    return Estimate(float(np.percentile(values, q)), low, high, confidence, resamples)


def bootstrap_ratio(numerator: Array, denominator: Array, q: float = 99.0, *, resamples: int = 2000,
                    confidence: float = 0.95, seed: int = 0) -> Estimate | None:
    """percentile(numerator) / percentile(denominator), each side resampled independently."""
    if not numerator.size or not denominator.size:
        return None
    rng = np.random.default_rng(seed)
    top = resampled_percentiles(numerator, q, resamples, rng)
    bottom = resampled_percentiles(denominator, q, resamples, rng)
    low, high = _interval(top / bottom, confidence)
    point = float(np.percentile(numerator, q) / np.percentile(denominator, q))
    return Estimate(point, low, high, confidence, resamples)


def window_starts(start_s: float, end_s: float, window_s: float) -> Array:
    """Starts of rolling windows over [start_s, end_s), a quarter window apart; at least one window."""
    step = window_s / 4.0
    return np.arange(start_s, max(start_s, end_s - window_s) + step / 2.0, step)


def rolling_p99(samples: Sequence[Sample], start_s: float, end_s: float, window_s: float) -> list[float]:
    """P99 of the successful requests in each rolling window that holds any."""
    values = []
    for t in window_starts(start_s, end_s, window_s):
        p99 = percentile(ok_latencies(in_window(samples, float(t), float(t) + window_s)), 99)
        if p99 is not None:
            values.append(p99)
    return values


def latency_recovered_at(samples: Sequence[Sample], start_s: float, end_s: float, threshold_s: float,
                         window_s: float, kinds: Sequence[ErrorKind], budget: float) -> float | None:
    """Start of the first rolling window from which every later window is back: P99 of its successful requests
    at most `threshold_s` and its counted errors within `budget`. Windows step by a quarter of their width; a
    window without samples says nothing and is skipped. None: still not back in the last window."""
    recovered: float | None = None
    for t in window_starts(start_s, end_s, window_s):
        chunk = in_window(samples, float(t), float(t) + window_s)
        if not chunk:
            continue
        p99 = percentile(ok_latencies(chunk), 99)
        good = p99 is not None and p99 <= threshold_s and errors(chunk, kinds).fraction <= budget
        if good and recovered is None:
            recovered = float(t)
        elif not good:
            recovered = None
    return recovered


def fallback_cleared_at(observations: Sequence[Observation], after_s: float) -> float | None:
    """Time of the first observation at or after `after_s` from which the target stays off the fallback and not
    degraded. None: still on it at the last observation, or nothing was observed."""
    cleared: float | None = None
    for obs in observations:
        if obs.t_s < after_s:
            continue
        clear = obs.fallback_active is False and obs.degraded is not True
        if clear and cleared is None:
            cleared = obs.t_s
        elif not clear:
            cleared = None
    return cleared


def fallback_seen(observations: Sequence[Observation], since_s: float) -> tuple[bool | None, float | None]:
    """Whether the target fell back at or after `since_s` (the gauge was on, or the switch counter rose above its
    last value before `since_s`), and when it was first seen. (None, None): no fallback series was readable."""
    before = [o for o in observations if o.t_s < since_s and o.metrics is not None]
    base = before[-1].metrics.fallback_entries if before and before[-1].metrics else None
    readable = False
    for obs in observations:
        if obs.t_s < since_s or obs.metrics is None or obs.metrics.fallback_active is None:
            continue
        readable = True
        entries = obs.metrics.fallback_entries
        rose = base is not None and entries is not None and entries > base
        if obs.fallback_active or rose:
            return True, obs.t_s
    return (False, None) if readable else (None, None)
