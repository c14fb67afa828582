"""Observers: records in, Prometheus samples out (MetricsObserver), and a fan-out that keeps one broken observer
from hurting the others or the request (CompositeObserver).

Both are called from the event loop (requests, rejections) and from the batcher's engine thread (batches, drops,
fallbacks) at the same time; prometheus_client's metrics take their own locks, and the only state kept here is
either immutable or changed under a lock.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from service.observer import STAGES, BatchRecord, FallbackEvent, Observer, RequestRecord
from telemetry.metrics import (
    UNMATCHED,
    Metrics,
    device_label,
    enum_label,
    length_bucket,
    stage_label,
    status_class,
    status_label,
)

HOOKS = ("on_request", "on_batch", "on_rejected", "on_dropped", "on_aborted", "on_fallback")

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C traceparent header when it is valid and sampled, else None.

    An unsampled trace is never exported, so an exemplar pointing at it would be a dead link."""
    if not traceparent:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    if not int(flags, 16) & 0x01:
        return None
    return trace_id


class MetricsObserver:
    """Turns each record into counter increments and histogram observations (with a trace-id exemplar)."""

    def __init__(self, metrics: Metrics, routes: Iterable[str] = (), *,
                 trace_ids: Callable[[RequestRecord], str | None] | None = None) -> None:
        """`trace_ids` gives the sampled trace id of a request for exemplars (default: from its traceparent)."""
        self._m = metrics
        self._routes = frozenset(routes)
        self._trace_ids = trace_ids or (lambda record: trace_id_of(record.traceparent))
        # Stage children looked up once: five label lookups per request saved on the hot path.
        self._stages = {name: metrics.stage_duration.labels(name) for name in STAGES}

    def allow_routes(self, routes: Iterable[str]) -> None:
        """The route templates the app declares; any other route is counted as "unmatched"."""
        self._routes = frozenset(routes)  # one reference swap: readers see the old set or the new one

    def on_request(self, record: RequestRecord) -> None:
        m = self._m
        route = record.route if record.route in self._routes else UNMATCHED
        trace_id = self._trace_ids(record)
        exemplar = {"trace_id": trace_id} if trace_id else None
        duration = record.duration_s
        m.requests.labels(route, status_label(record.status), enum_label(record.error_code, "ok")).inc()
        m.request_duration.labels(route, status_class(record.status)).observe(duration, exemplar)
        ok = record.status < 400
        if ok and record.max_tokens > 0:
            m.request_duration_by_length.labels(length_bucket(record.max_tokens)).observe(duration, exemplar)
        if ok and record.device:
            m.requests_by_device.labels(device_label(record.device)).inc()
        if record.texts:
            m.texts.labels(route).inc(record.texts)
            m.tokens.labels(route).inc(record.tokens)
        if record.truncated:
            m.truncated_texts.labels(route).inc(record.truncated)
        for span in record.stages:
            child = self._stages.get(span.name)
            if child is None:
                child = m.stage_duration.labels(stage_label(span.name))
            child.observe(span.duration_s, exemplar)

    def on_batch(self, record: BatchRecord) -> None:
        m, timing = self._m, record.timing
        device, mode = device_label(timing.device), enum_label(timing.mode)
        bucket = str(timing.bucket) if timing.bucket is not None else "none"
        m.batch_size.observe(timing.rows)
        m.batch_tokens.observe(timing.padded_tokens)
        m.batch_padding_ratio.observe(timing.padding_ratio)
        m.engine_runs.labels(device, mode, bucket).inc()
        m.engine_run_duration.labels(device, mode).observe(timing.duration_s)

    def on_rejected(self, reason: str) -> None:
        self._m.rejected.labels(enum_label(reason)).inc()

    def on_dropped(self, reason: str, items: int) -> None:
        if items > 0:
            self._m.dropped.labels(enum_label(reason)).inc(items)

    def on_aborted(self, reason: str) -> None:
        self._m.http_aborted.labels(enum_label(reason)).inc()

    def on_fallback(self, event: FallbackEvent) -> None:
        # glassbox_gpu_oom_total is not counted here: a probe that fails with an OOM arrives as "probe_failed", so
        # it is read from the fallback engine's own tally at scrape time (telemetry/setup.py).
        self._m.fallback_active.set(1.0 if event.active else 0.0)
        self._m.fallback_events.labels(enum_label(event.reason)).inc()


class CompositeObserver:
    """Hands every record to each observer in turn. An observer that raises is logged (the 1st, 10th, 100th...
    failure of each hook, so a broken exporter cannot flood the log) and reported to `on_error`; the others still
    run and the caller never sees the exception."""

    def __init__(
        self,
        observers: Sequence[Observer],
        *,
        on_error: Callable[[str], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._on_error = on_error
        self._log = logger or logging.getLogger("glassbox.telemetry")
        self._lock = threading.Lock()
        self._failures: dict[tuple[int, str], int] = {}
        # Bound methods resolved once; an observer without a hook simply does not take part in it.
        self._hooks: dict[str, tuple[tuple[int, Callable[..., None]], ...]] = {
            hook: tuple((i, getattr(o, hook)) for i, o in enumerate(observers) if callable(getattr(o, hook, None)))
            for hook in HOOKS
        }
        self.observers = tuple(observers)

    def on_request(self, record: RequestRecord) -> None:
        self._each("on_request", record)

    def on_batch(self, record: BatchRecord) -> None:
        self._each("on_batch", record)

    def on_rejected(self, reason: str) -> None:
        self._each("on_rejected", reason)

    def on_dropped(self, reason: str, items: int) -> None:
        self._each("on_dropped", reason, items)

    def on_aborted(self, reason: str) -> None:
        self._each("on_aborted", reason)

    def on_fallback(self, event: FallbackEvent) -> None:
        self._each("on_fallback", event)

    def failures(self) -> dict[tuple[int, str], int]:
        """(observer index, hook) -> failures so far."""
        with self._lock:
            return dict(self._failures)

    def _each(self, hook: str, *args: Any) -> None:
        for index, method in self._hooks[hook]:
            try:
                method(*args)
            except Exception:
                self._failed(index, hook)

    def _failed(self, index: int, hook: str) -> None:
        with self._lock:
            count = self._failures.get((index, hook), 0) + 1
            self._failures[(index, hook)] = count
        if _is_power_of_ten(count):
            name = type(self.observers[index]).__name__
            self._log.exception("observer %s.%s failed (%d failures so far)", name, hook, count)
        if self._on_error is not None:
            try:
                self._on_error(hook)
            except Exception:  # the error counter itself must not break the fan-out
                self._log.debug("on_error callback failed", exc_info=True)


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
