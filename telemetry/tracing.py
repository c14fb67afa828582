"""Spans from records: a server span per request with its stage spans, and one span per engine batch linked to them.

Nothing here runs inside the request: spans are made after the fact from the perf_counter_ns times the records
carry, shifted to wall-clock time by the offset the request itself measured (`wall_start_ns - start_ns`).

The event loop only decides. For each request it takes the sampling decision and the server span's ids (the
exemplars and the log line carry them), draws the stage spans' ids, and queues one RequestSpans item on the span
processor; the processor's export thread builds the spans from it and writes them (telemetry/spans.py). On the
shared 2-core dev machine that is ~9 us of event-loop time a request, against ~50 us when the six SDK spans (and a
share of the batch span) were built on the loop (`python -m benchmarks.telemetry_overhead --micro`).

Batch spans wait for their requests. The engine thread reports a batch (`on_batch`) around the time its requests'
futures resolve, so the request spans do not exist yet, and a request may even report first. A batch span is
therefore made once its BatchRecord has arrived and every request in it has reported, with one link per request
span. Pending batches live in a map bounded by count and by age, both checked on each event (no timer thread): a
batch whose request never reports (its client left, or another part of it failed later) is emitted when it
expires, with the links it has and `glassbox.batch.unlinked_requests` saying how many are missing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from service.observer import BatchRecord, FallbackEvent, RequestRecord
from telemetry.spans import (  # re-exported: the names other modules and the tests know these by
    BATCH_SPAN,
    TEXT_ATTRIBUTE,
    TEXT_KEY,
    BatchSpans,
    RequestSpans,
)

__all__ = ["BATCH_SPAN", "TEXT_ATTRIBUTE", "TEXT_KEY", "SpanIds", "TracingObserver", "remote_parent"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


@dataclass(frozen=True, slots=True)
class SpanIds:
    """The server span of one request, as W3C hex ids (what exemplars and log lines carry)."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    sampled: bool  # False: the span was not recorded, so no backend will ever have it


def remote_parent(traceparent: str | None) -> Context:
    """The context of a W3C `traceparent` header value; an empty context (so: a new trace) when absent or invalid."""
    if not traceparent:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent}, Context())


def clock_offset_ns() -> int:
    """wall-clock ns minus perf_counter ns, measured now (for records that do not carry their own)."""
    return time.time_ns() - time.perf_counter_ns()


class _Decider:
    """Sampling decisions and ids, as the provider would make them for a new top-level span."""

    def __init__(self, provider: TracerProvider) -> None:
        self._sampler = provider.sampler
        self.new_span_id = provider.id_generator.generate_span_id
        self._new_trace_id = provider.id_generator.generate_trace_id

    def start(self, name: str, parent: Context, kind: SpanKind, links: list[Link] | None = None
              ) -> tuple[SpanContext, SpanContext | None]:
        """The new span's context and its valid remote parent (None for a root)."""
        remote = trace.get_current_span(parent).get_span_context()
        trace_id = remote.trace_id if remote.is_valid else self._new_trace_id()
        decision = self._sampler.should_sample(parent, trace_id, name, kind, None, links)
        flags = _SAMPLED if decision.decision is Decision.RECORD_AND_SAMPLE else _NOT_SAMPLED
        context = SpanContext(trace_id, self.new_span_id(), False, flags, decision.trace_state)
        return context, remote if remote.is_valid else None


@dataclass(slots=True)
class _PendingBatch:
    created_ns: int  # on the observer's clock: what expiry compares against
    record: BatchRecord | None = None
    links: list[Link] = field(default_factory=list)
    reported: Counter[str] = field(default_factory=Counter)  # request ids that reported, with multiplicity
    offset_ns: int | None = None  # wall minus perf clock, from the first request that reported
    expected: Counter[str] | None = None  # the record's request ids, once it arrived
    outstanding: int = 0  # expected reports not yet in (kept up to date: counting again per event was costly)

    def arrived(self, record: BatchRecord) -> None:
        self.record = record
        self.expected = Counter(record.request_ids)
        self.outstanding = sum((self.expected - self.reported).values())

    def report(self, request_id: str) -> None:
        self.reported[request_id] += 1
        if self.expected is not None and self.reported[request_id] <= self.expected[request_id]:
            self.outstanding -= 1

    def missing(self) -> int:
        return self.outstanding if self.record is not None else 0


class TracingObserver:
    """Implements service.observer.Observer with OpenTelemetry spans.

    `provider` (owned by the caller) gives the sampler, ids and resource; `processor` must be one of its span
    processors, a BatchSpanProcessor whose exporter takes span items (telemetry/otlp.py builds both), so that the
    provider's force_flush and shutdown cover these spans."""

    def __init__(
        self,
        provider: TracerProvider,
        processor: SpanProcessor,
        *,
        record_text: bool = False,
        max_pending_batches: int = 4096,
        batch_max_age_s: float = 60.0,
        clock: Callable[[], int] = time.perf_counter_ns,  # for batch expiry; tests pass a fake
    ) -> None:
        self._decide = _Decider(provider)
        self._processor = processor
        self._record_text = record_text
        self._max_pending = max(1, max_pending_batches)
        # The age must outlast the longest wait between a batch finishing and the last of its requests reporting:
        # a request split over several batches reports after its last one, within its deadline.
        self._max_age_ns = int(batch_max_age_s * 1e9)
        self._clock = clock
        self._lock = threading.Lock()  # on_batch runs on the engine thread, on_request on the event loop
        self._pending: OrderedDict[int, _PendingBatch] = OrderedDict()
        self._last: tuple[RequestRecord, SpanIds] | None = None

    # -- Observer ---------------------------------------------------------------------------------------------------
    def on_request(self, record: RequestRecord) -> None:
        offset = record.wall_start_ns - record.start_ns if record.wall_start_ns else clock_offset_ns()
        context, parent = self._decide.start(f"{record.method} {record.route}", remote_parent(record.traceparent),
                                             SpanKind.SERVER)
        sampled = context.trace_flags.sampled
        self._last = (record, SpanIds(f"{context.trace_id:032x}", f"{context.span_id:016x}", sampled))
        if sampled:  # nothing of an unsampled trace is exported: nothing to build
            new_id = self._decide.new_span_id
            self._write(RequestSpans(record, context, parent, offset, tuple(new_id() for _ in record.stages),
                                     self._record_text))
        link = Link(context, {"glassbox.request_id": record.request_id}) if sampled and record.batch_ids else None
        ready: list[_PendingBatch] = []
        with self._lock:
            for batch_id in record.batch_ids:
                pending = self._entry(batch_id)
                if link is not None:
                    pending.links.append(link)
                pending.report(record.request_id)
                if pending.offset_ns is None:
                    pending.offset_ns = offset
                if pending.record is not None and pending.missing() == 0:
                    ready.append(self._pending.pop(batch_id))
            ready.extend(self._expire_locked())
        self._emit(ready)

    def on_batch(self, record: BatchRecord) -> None:
        ready: list[_PendingBatch] = []
        with self._lock:
            pending = self._entry(record.batch_id)
            pending.arrived(record)
            if pending.missing() == 0:
                ready.append(self._pending.pop(record.batch_id))
            ready.extend(self._expire_locked())
        self._emit(ready)

    def on_rejected(self, reason: str) -> None:
        pass  # the refused request still reaches on_request, with its 429

    def on_dropped(self, reason: str, items: int) -> None:
        pass

    def on_aborted(self, reason: str) -> None:
        pass  # aborted before the app saw a request: there is nothing to hang a span on

    def on_fallback(self, event: FallbackEvent) -> None:
        pass

    # -- for the other observers and for shutdown ------------------------------------------------------------------
    def ids_for(self, record: RequestRecord) -> SpanIds | None:
        """The server span's ids of `record`, if `record` is the request this observer handled last.

        Observers that run after this one in the same on_request call (metrics exemplars, the request log line)
        use it; the identity check means a caller out of order gets None, never another request's ids."""
        last = self._last
        return last[1] if last is not None and last[0] is record else None

    def flush_pending(self) -> int:
        """Emit every pending batch span now, with the links it has (at shutdown, before the provider flushes)."""
        with self._lock:
            ready = list(self._pending.values())
            self._pending.clear()
        self._emit(ready)
        return sum(1 for pending in ready if pending.record is not None)

    @property
    def pending_batches(self) -> int:
        return len(self._pending)

    # -- internals --------------------------------------------------------------------------------------------------
    def _write(self, item: Any) -> None:
        # The BatchSpanProcessor reads only `.context` of what it queues; its exporter builds the spans.
        self._processor.on_end(cast(ReadableSpan, item))

    def _entry(self, batch_id: int) -> _PendingBatch:
        # Under the lock.
        pending = self._pending.get(batch_id)
        if pending is None:
            pending = self._pending[batch_id] = _PendingBatch(created_ns=self._clock())
        return pending

    def _expire_locked(self) -> list[_PendingBatch]:
        # Oldest first: the map is in creation order, so the scan stops at the first young entry.
        expired: list[_PendingBatch] = []
        now = self._clock()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if len(self._pending) <= self._max_pending and now - oldest.created_ns <= self._max_age_ns:
                break
            expired.append(self._pending.popitem(last=False)[1])
        return expired

    def _emit(self, batches: list[_PendingBatch]) -> None:
        for pending in batches:
            record = pending.record
            if record is None:  # an entry without its BatchRecord has nothing to show
                continue
            links = tuple(pending.links)
            # The sampler sees the links (LinkedOrRatio keeps a batch that links to a sampled request); the
            # attributes it would also see are made in the export thread, and glassbox's samplers do not read them.
            context, _ = self._decide.start(BATCH_SPAN, Context(), SpanKind.INTERNAL, list(links))
            if context.trace_flags.sampled:
                offset = pending.offset_ns if pending.offset_ns is not None else clock_offset_ns()
                self._write(BatchSpans(record, context, links, pending.missing(), offset))

