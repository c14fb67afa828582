"""Spans from records: a server span per request with its stage spans, and one span per engine batch linked to them.

Nothing here runs inside the request: spans are created after the fact from the perf_counter_ns times the records
carry, shifted to wall-clock time by the offset the request itself measured (`wall_start_ns - start_ns`).

Batch spans wait for their requests. The engine thread reports a batch (`on_batch`) around the time its requests'
futures resolve, so the request spans do not exist yet, and a request may even report first. A batch span is
therefore created once its BatchRecord has arrived and every request in it has reported, with one link per request
span. Pending batches live in a map bounded by count and by age, both checked on each event (no timer thread): a
batch whose request never reports (its client left, or another part of it failed later) is emitted when it
expires, with the links it has and `glassbox.batch.unlinked_requests` saying how many are missing.

Spans are written finished (SpanWriter), straight to the span processor, with the provider's sampler, id
generator and resource. A span that is over before it is made needs none of the SDK's live-span machinery
(locks, attribute cleaning, on_start hooks). On the shared 2-core dev machine a bare span cost ~3 us this way
against ~15-19 us through Tracer.start_span/end, and a request's seven spans (batch span included, exported to
memory) ~55 us against ~200-320 us. The OTLP tests decode what the real exporters send, so a change in the SDK's
span classes shows up there.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from service.observer import BatchRecord, FallbackEvent, RequestRecord

BATCH_SPAN = "engine.batch"
# RequestRecord.attributes key under which the app may put the request's text, and only when record_text is on.
# Observers drop it unless their own record_text is on too, so one mistake cannot leak text.
TEXT_KEY = "text"
TEXT_ATTRIBUTE = "glassbox.request.text"
TRACER_NAME = "glassbox"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)
Attributes = dict[str, AttributeValue]


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


def span_ids(context: SpanContext) -> SpanIds:
    return SpanIds(trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id),
                   context.trace_flags.sampled)


def clock_offset_ns() -> int:
    """wall-clock ns minus perf_counter ns, measured now (for records that do not carry their own)."""
    return time.time_ns() - time.perf_counter_ns()


class SpanWriter:
    """Finished spans, sampled and identified as the provider would, handed straight to `processor`."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._scope = InstrumentationScope(TRACER_NAME)
        self._processor = processor

    def start_trace(self, name: str, parent: Context, kind: SpanKind, attributes: Attributes,
                    links: list[Link] | None = None) -> SpanContext:
        """The context of a new top-level span (a child of a remote parent, or a root), with its sampling decision.
        Nothing is written yet: `write` it, and its children, once their attributes are complete."""
        remote = trace.get_current_span(parent).get_span_context()
        trace_id = remote.trace_id if remote.is_valid else self._ids.generate_trace_id()
        decision = self._sampler.should_sample(parent, trace_id, name, kind, attributes, links)
        flags = _SAMPLED if decision.decision is Decision.RECORD_AND_SAMPLE else _NOT_SAMPLED
        return SpanContext(trace_id, self._ids.generate_span_id(), False, flags, decision.trace_state)

    def child_of(self, parent: SpanContext) -> SpanContext:
        return SpanContext(parent.trace_id, self._ids.generate_span_id(), False, parent.trace_flags,
                           parent.trace_state)

    def write(self, name: str, context: SpanContext, parent: SpanContext | None, start_ns: int, end_ns: int, *,
              kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes | None = None,
              links: list[Link] | None = None, status: Status = _UNSET) -> None:
        if not context.trace_flags.sampled:
            return
        self._processor.on_end(ReadableSpan(
            name, context, parent, self._resource, attributes or {}, links=links or (), kind=kind, status=status,
            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope,
        ))


@dataclass(slots=True)
class _PendingBatch:
    created_ns: int  # on the observer's clock: what expiry compares against
    record: BatchRecord | None = None
    links: list[Link] = field(default_factory=list)
    reported: Counter[str] = field(default_factory=Counter)  # request ids that reported, with multiplicity
    offset_ns: int | None = None  # of the first request that reported: keeps the batch aligned with its spans

    def missing(self) -> int:
        if self.record is None:
            return 0
        return sum((Counter(self.record.request_ids) - self.reported).values())


class TracingObserver:
    """Implements service.observer.Observer with OpenTelemetry spans.

    `provider` (owned by the caller) gives the sampler, ids and resource; `processor` must be one of its span
    processors (the BatchSpanProcessor), so that the provider's force_flush and shutdown cover these spans."""

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
        self._spans = SpanWriter(provider, processor)
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
        context = self._request_spans(record, offset)
        self._last = (record, span_ids(context))
        sampled = context.trace_flags.sampled
        link = Link(context, {"glassbox.request_id": record.request_id}) if sampled and record.batch_ids else None
        ready: list[_PendingBatch] = []
        with self._lock:
            for batch_id in record.batch_ids:
                pending = self._entry(batch_id)
                if link is not None:
                    pending.links.append(link)
                pending.reported[record.request_id] += 1
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
            pending.record = record
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
    def _request_spans(self, record: RequestRecord, offset: int) -> SpanContext:
        attributes = self._server_attributes(record)
        name = f"{record.method} {record.route}"
        parent = remote_parent(record.traceparent)
        context = self._spans.start_trace(name, parent, SpanKind.SERVER, attributes)
        if not context.trace_flags.sampled:  # nothing of this trace is exported: skip building it
            return context
        for stage in record.stages:
            self._spans.write(stage.name, self._spans.child_of(context), context, stage.start_ns + offset,
                              stage.end_ns + offset, attributes=_stage_attributes(record, stage.name))
        status = Status(StatusCode.ERROR, record.error_code or "") if record.status >= 500 else _UNSET
        remote = trace.get_current_span(parent).get_span_context()
        self._spans.write(name, context, remote if remote.is_valid else None, record.start_ns + offset,
                          record.end_ns + offset, kind=SpanKind.SERVER, attributes=attributes, status=status)
        return context

    def _server_attributes(self, record: RequestRecord) -> Attributes:
        attributes: Attributes = {
            "http.request.method": record.method,
            "http.route": record.route,
            "http.response.status_code": record.status,
            "glassbox.request_id": record.request_id,
            "glassbox.texts": record.texts,
            "glassbox.tokens": record.tokens,
            "glassbox.max_tokens": record.max_tokens,
            "glassbox.truncated": record.truncated,
        }
        if record.error_code:
            attributes["error.type"] = record.error_code
        if record.device:
            attributes["glassbox.device"] = record.device
        if record.engine_mode:
            attributes["glassbox.engine.mode"] = record.engine_mode
        if record.batch_ids:
            attributes["glassbox.batch.ids"] = list(record.batch_ids)
        for key, value in record.attributes.items():
            if key == TEXT_KEY:
                if self._record_text:
                    attributes[TEXT_ATTRIBUTE] = value
            else:
                attributes[f"glassbox.{key}"] = value
        return attributes

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
            if pending.record is not None:  # an entry without its BatchRecord has nothing to show
                self._batch_span(pending.record, pending)

    def _batch_span(self, record: BatchRecord, pending: _PendingBatch) -> None:
        timing = record.timing
        offset = pending.offset_ns if pending.offset_ns is not None else clock_offset_ns()
        attributes: Attributes = {
            "glassbox.batch.id": record.batch_id,
            "glassbox.device": timing.device,
            "glassbox.engine.mode": timing.mode,
            "glassbox.batch.bucket": str(timing.bucket) if timing.bucket is not None else "none",
            "glassbox.batch.rows": timing.rows,
            "glassbox.batch.tokens": timing.real_tokens,
            "glassbox.batch.padded_tokens": timing.padded_tokens,
            "glassbox.batch.padding_ratio": timing.padding_ratio,
            "glassbox.batch.requests": len(record.request_ids),
            "glassbox.queue.depth_after": record.queue_depth_after,
        }
        missing = pending.missing()
        if missing:
            attributes["glassbox.batch.unlinked_requests"] = missing
        context = self._spans.start_trace(BATCH_SPAN, Context(), SpanKind.INTERNAL, attributes, pending.links)
        self._spans.write(BATCH_SPAN, context, None, timing.start_ns + offset, timing.end_ns + offset,
                          attributes=attributes, links=pending.links)


def _stage_attributes(record: RequestRecord, stage: str) -> Attributes | None:
    if stage != "infer" or not record.device:
        return None
    return {"glassbox.device": record.device, "glassbox.engine.mode": record.engine_mode,
            "glassbox.batch.ids": list(record.batch_ids)}
