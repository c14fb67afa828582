"""MetricsObserver: records in, Prometheus samples out (the fan-out to every observer is telemetry/fanout.py).

It is called from the event loop (requests, rejections, batches: the batcher hands each batch's record to the loop
with its answers) and from the batcher's engine thread (drops, fallbacks) at the same time; prometheus_client's
metrics take their own locks. The state kept here is immutable, changed under a lock, or a cache whose races are
harmless (two threads storing the same child; two requests both taking a bucket's exemplar).
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, TypeVar

from glassbox.service.observer import (
    STAGES,
    BatchRecord,
    FallbackEvent,
    RequestRecord,
)
from glassbox.telemetry.metrics import (
    ENGINE_BUCKETS_S,
    REQUEST_BUCKETS_S,
    STAGE_BUCKETS_S,
    UNMATCHED,
    Metrics,
    device_label,
    enum_label,
    length_bucket,
    stage_label,
    status_class,
    status_label,
)
from glassbox.telemetry.multiproc import ExemplarBook
from glassbox.telemetry.turns import TurnHold

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


_CACHE_LIMIT = 4096  # label combinations remembered per cache; beyond it, children are looked up every time


class ExemplarGate:
    """Which observations of one histogram child carry their exemplar: the first to land in a bucket, then the
    first after `interval_ns` has passed since that bucket last took one.

    A bucket keeps only its latest exemplar and Prometheus reads it once per scrape, so an exemplar on every
    observation (seven a request) mostly overwrote itself; prometheus_client validates and stamps each one, which
    was ~40% of this observer's cost. Gated, every bucket that gets traced observations still has an exemplar, at
    most the interval (1 s by default, against scrapes every 15-60 s) older than its newest observation."""

    __slots__ = ("_bounds", "_due", "_interval")

    def __init__(self, bounds: tuple[float, ...], interval_ns: int) -> None:
        self._bounds = bounds  # the histogram's upper bounds, +Inf excluded
        self._due = [0] * (len(bounds) + 1)  # per bucket: the clock reading from which it takes an exemplar again
        self._interval = interval_ns

    def __call__(self, value: float, now_ns: int) -> bool:
        # The bucket prometheus_client puts `value` in: the first bound >= value.
        bucket = bisect_left(self._bounds, value)
        if now_ns < self._due[bucket]:
            return False
        self._due[bucket] = now_ns + self._interval  # a race between threads only shifts which one takes it
        return True


class _Gated(NamedTuple):
    histogram: Any  # a labelled histogram child
    gate: ExemplarGate
    name: str  # the histogram's name, and the child's label pairs: where a multiprocess exemplar is filed
    labels: tuple[tuple[str, str], ...]
    bounds: tuple[float, ...]
    total: Any  # the child's sum and per-bucket values (prometheus_client's own, see _observe)
    buckets: list[Any]


class _RequestChildren(NamedTuple):
    """The metric children one (route, status, error code) combination writes to: the counters' values (see
    counter_value) and the duration histogram."""

    requests: Any
    requests_labels: tuple[tuple[str, str], ...]  # the counter child's label pairs (its 5xx exemplars are filed so)
    duration: _Gated
    texts: Any
    tokens: Any
    truncated: Any
    requests_child: Any  # the counter child itself, for an observation with an exemplar


class _Plain(NamedTuple):
    """An unlabelled histogram's sum, bucket values and bounds (see histogram_values)."""

    total: Any
    buckets: list[Any]
    bounds: tuple[float, ...]


class MetricsObserver:
    """Turns each record into counter increments and histogram observations (with a trace-id exemplar).

    Label children are looked up once per label combination and kept: `labels()` converts, validates and takes a
    lock on every call, which was a third of this observer's cost per request. The combinations are bounded (route
    templates, status codes, error codes, devices), and the caches stop growing at _CACHE_LIMIT regardless.

    Inside a `buffered` block (the server opens one for the requests answered in one turn of its event loop) the
    increments are added up per metric value and written when the block ends: one lock, or with --workers one
    write to the metric file, per value and turn instead of per request and value. Observations that carry an
    exemplar are written at once."""

    def __init__(self, metrics: Metrics, routes: Iterable[str] = (), *,
                 trace_ids: Callable[[RequestRecord], str | None] | None = None,
                 exemplar_interval_s: float = 1.0, clock: Callable[[], int] = time.monotonic_ns,
                 exemplar_book: ExemplarBook | None = None) -> None:
        """`trace_ids` gives the sampled trace id of a request for exemplars (default: from its traceparent);
        `exemplar_interval_s` is how often each histogram bucket takes a new exemplar (0: on every observation).
        With `exemplar_book` (multiprocess mode, where metric values cannot hold exemplars) exemplars go there."""
        self._book = exemplar_book
        self._m = metrics
        self._routes = frozenset(routes)
        self._trace_ids = trace_ids or (lambda record: trace_id_of(record.traceparent))
        self._interval_ns = int(exemplar_interval_s * 1e9)
        self._clock = clock
        self._stages = {name: self._stage(name) for name in STAGES if name != "infer"}
        self._infer: dict[str, _Gated] = {}  # by the request's device(s)
        self._per_request: dict[tuple[str, int, str | None], _RequestChildren] = {}
        self._by_length: dict[str, _Gated] = {}
        self._by_device: dict[str, Any] = {}
        self._engine: dict[tuple[str, str, object], tuple[Any, _Gated]] = {}
        self._busy: dict[str, Any] = {}  # glassbox_engine_busy_seconds_total by device
        self._requests_sample = next(iter(metrics.requests.describe())).name + "_total"
        self._batch_histograms = tuple(_plain(h) for h in (metrics.batch_size, metrics.batch_tokens,
                                                           metrics.batch_padding_ratio))
        self._turn: TurnHold[dict[Any, float]] = TurnHold(dict, _write_held)

    def buffered(self) -> AbstractContextManager[None]:
        """Holds this thread's increments until the block ends (see the class)."""
        return self._turn.block()

    def allow_routes(self, routes: Iterable[str]) -> None:
        """The route templates the app declares; any other route is counted as "unmatched"."""
        self._routes = frozenset(routes)  # one reference swap: readers see the old set or the new one

    def on_request(self, record: RequestRecord) -> None:
        route = record.route if record.route in self._routes else UNMATCHED
        trace_id = self._trace_ids(record)
        exemplar = {"trace_id": trace_id} if trace_id else None
        now = self._clock() if exemplar is not None else 0
        duration = record.duration_s
        key = (route, record.status, record.error_code)
        children = self._per_request.get(key)
        if children is None:
            children = self._request_children(key)
        book = self._book
        held = self._turn.current()
        if exemplar is not None and record.status >= 500:  # every 5xx leads to its trace (tracing keeps them all)
            if book is None:
                children.requests_child.inc(1, exemplar)
            else:
                children.requests.inc(1.0)
                book.record_sample(self._requests_sample, children.requests_labels, 1.0, exemplar)
        else:
            _add(children.requests, 1.0, held)
        _observe(children.duration, duration, exemplar, now, book, held)
        if record.status < 400:
            if record.max_tokens > 0:
                bucket = length_bucket(record.max_tokens)
                gated = self._by_length.get(bucket)
                if gated is None:
                    gated = _remember(self._by_length, bucket, self._gated(
                        self._m.request_duration_by_length, (("length_bucket", bucket),), REQUEST_BUCKETS_S))
                _observe(gated, duration, exemplar, now, book, held)
            if record.device:
                value = self._by_device.get(record.device)
                if value is None:
                    value = _remember(self._by_device, record.device,
                                      counter_value(self._m.requests_by_device.labels(device_label(record.device))))
                _add(value, 1.0, held)
        if record.texts:
            _add(children.texts, record.texts, held)
            _add(children.tokens, record.tokens, held)
        if record.truncated:
            _add(children.truncated, record.truncated, held)
        stages = self._stages
        for span in record.stages:
            if span.name == "infer":  # by device: time on the CPU fallback must not blur time on the GPU
                gated = self._infer.get(record.device)
                if gated is None:
                    gated = _remember(self._infer, record.device,
                                      self._stage("infer", device_label(record.device) if record.device else ""))
            else:
                gated = stages.get(span.name)
                if gated is None:
                    gated = self._stage(stage_label(span.name))
            _observe(gated, (span.end_ns - span.start_ns) / 1e9, exemplar, now, book, held)

    def _stage(self, name: str, device: str = "") -> _Gated:
        return self._gated(self._m.stage_duration, (("stage", name), ("device", device)), STAGE_BUCKETS_S)

    def _gated(self, histogram: Any, labels: tuple[tuple[str, str], ...], bounds: tuple[float, ...]) -> _Gated:
        child = histogram.labels(*(value for _, value in labels))
        name = next(iter(histogram.describe())).name
        total, buckets, upper = histogram_values(child)
        if upper != bounds:  # the buckets the histogram was made with are the ones counted into
            raise ValueError(f"{name}: bounds {bounds} are not the histogram's {upper}")
        return _Gated(child, ExemplarGate(bounds, self._interval_ns), name, labels, bounds, total, buckets)

    def _request_children(self, key: tuple[str, int, str | None]) -> _RequestChildren:
        m = self._m
        route, status, code = key
        labels = (("route", route), ("status", status_label(status)), ("code", enum_label(code, "ok")))
        requests = m.requests.labels(*(value for _, value in labels))
        children = _RequestChildren(
            counter_value(requests), labels,
            self._gated(m.request_duration, (("route", route), ("status_class", status_class(status))),
                        REQUEST_BUCKETS_S),
            counter_value(m.texts.labels(route)), counter_value(m.tokens.labels(route)),
            counter_value(m.truncated_texts.labels(route)), requests,
        )
        return _remember(self._per_request, key, children)

    def on_batch(self, record: BatchRecord) -> None:
        m, timing = self._m, record.timing
        held = self._turn.current()
        size, tokens, padding = self._batch_histograms
        _count(size, timing.rows, held)
        _count(tokens, timing.padded_tokens, held)
        _count(padding, timing.padding_ratio, held)
        key = (timing.device, timing.mode, timing.bucket)
        children = self._engine.get(key)
        if children is None:
            device, mode = device_label(timing.device), enum_label(timing.mode)
            bucket = str(timing.bucket) if timing.bucket is not None else "none"
            children = _remember(self._engine, key, (
                counter_value(m.engine_runs.labels(device, mode, bucket)),
                self._gated(m.engine_run_duration, (("device", device), ("mode", mode)), ENGINE_BUCKETS_S)))
        _add(children[0], 1.0, held)
        span = record.span  # the batch's trace, when it is kept (its exemplar must not be a dead link)
        exemplar = {"trace_id": span.trace_id} if span is not None and span.sampled else None
        _observe(children[1], timing.duration_s, exemplar, self._clock() if exemplar else 0, self._book, held)
        busy = self._busy.get(timing.device)
        if busy is None:
            busy = _remember(self._busy, timing.device,
                             counter_value(m.engine_busy.labels(device_label(timing.device))))
        _add(busy, timing.duration_s, held)

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


def histogram_values(child: Any) -> tuple[Any, list[Any], tuple[float, ...]]:
    """A histogram child's sum and bucket values, and its upper bounds without +Inf (prometheus_client's `_sum`,
    `_buckets` and `_upper_bounds`): what Histogram.observe adds to. tests/telemetry/test_observer.py fails if these
    change meaning."""
    return child._sum, child._buckets, tuple(child._upper_bounds[:-1])


def counter_value(child: Any) -> Any:
    """A counter child's value (prometheus_client's `_value`): what Counter.inc adds to, after checking that the
    amount is not negative (every amount added here is a count or a duration). tests/telemetry/test_observer.py fails
    if it changes meaning."""
    return child._value


def _plain(histogram: Any) -> _Plain:
    total, buckets, bounds = histogram_values(histogram)
    return _Plain(total, buckets, bounds)


def _add(value: Any, amount: float, held: dict[Any, float] | None) -> None:
    """Adds `amount` to a metric value now, or to the open block's tally of it."""
    if held is None:
        value.inc(amount)
    else:
        held[value] = held.get(value, 0.0) + amount


def _write_held(held: dict[Any, float]) -> None:
    for value, amount in held.items():
        value.inc(amount)


def _count(histogram: _Gated | _Plain, value: float, held: dict[Any, float] | None) -> None:
    # What Histogram.observe does without an exemplar, with a binary search for the bucket instead of its walk over
    # every bound (39 of them for the stages): the first bound >= value, +Inf past the last.
    _add(histogram.total, value, held)
    _add(histogram.buckets[bisect_left(histogram.bounds, value)], 1.0, held)


def _observe(gated: _Gated, value: float, exemplar: dict[str, str] | None, now_ns: int,
             book: ExemplarBook | None, held: dict[Any, float] | None) -> None:
    if exemplar is not None and gated.gate(value, now_ns):
        if book is None:
            gated.histogram.observe(value, exemplar)
            return
        book.record(gated.name, gated.labels, gated.bounds, value, exemplar)
    _count(gated, value, held)


_V = TypeVar("_V")


def _remember(cache: dict[Any, _V], key: Any, value: _V) -> _V:
    # Two threads may both miss and both store: labels() hands both the same child, so either store is right.
    if len(cache) < _CACHE_LIMIT:
        cache[key] = value
    return value
