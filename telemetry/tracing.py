"""Spans from records: a server span per request with its stage spans, and one span per engine batch linked to them.

Nothing here runs inside the request: spans are made after the fact from the perf_counter_ns times the records
carry, shifted to wall-clock time by the offset the request itself measured (`wall_start_ns - start_ns`).

The server span is named when the request starts (`open_request`: the sampling decision and its ids, from the
traceparent header or a new trace), and the name travels with the request's rows to the batcher, in this process or
in the engine process. So a batch span is made the moment its BatchRecord arrives, with one link per request in it
that has a sampled span, wherever that request is answered. When the request ends, `on_request` builds the server
span under the name it was given (or decides one then, for a request that was never opened).

The event loop only decides. For each request it queues one RequestSpans item on the span processor; the
processor's export thread builds the spans from it and writes them (telemetry/spans.py). On the shared 2-core dev
machine that is ~9 us of event-loop time a request, against ~50 us when the six SDK spans (and a share of the batch
span) were built on the loop (`python -m benchmarks.telemetry_overhead --micro`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from service.observer import BatchRecord, FallbackEvent, RequestRecord, SpanRef
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


class TracingObserver:
    """Implements service.observer.Observer (and SpanOpener) with OpenTelemetry spans.

    `provider` (owned by the caller) gives the sampler, ids and resource; `processor` must be one of its span
    processors, a BatchSpanProcessor whose exporter takes span items (telemetry/otlp.py builds both), so that the
    provider's force_flush and shutdown cover these spans."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor, *, record_text: bool = False) -> None:
        self._decide = _Decider(provider)
        self._processor = processor
        self._record_text = record_text
        self._last: tuple[RequestRecord, SpanIds] | None = None

    # -- SpanOpener ---------------------------------------------------------------------------------------------------
    def open_request(self, traceparent: str | None) -> SpanRef:
        context, _ = self._decide.start("request", remote_parent(traceparent), SpanKind.SERVER)
        return SpanRef(f"{context.trace_id:032x}", f"{context.span_id:016x}", context.trace_flags.sampled)

    # -- Observer ---------------------------------------------------------------------------------------------------
    def on_request(self, record: RequestRecord) -> None:
        offset = record.wall_start_ns - record.start_ns if record.wall_start_ns else clock_offset_ns()
        parent_context = remote_parent(record.traceparent)
        if record.span is not None:
            context = _context_of(record.span)
            remote = trace.get_current_span(parent_context).get_span_context()
            parent = remote if remote.is_valid else None
        else:
            context, parent = self._decide.start(f"{record.method} {record.route}", parent_context, SpanKind.SERVER)
        sampled = context.trace_flags.sampled
        self._last = (record, SpanIds(f"{context.trace_id:032x}", f"{context.span_id:016x}", sampled))
        if sampled:  # nothing of an unsampled trace is exported: nothing to build
            new_id = self._decide.new_span_id
            self._write(RequestSpans(record, context, parent, offset, tuple(new_id() for _ in record.stages),
                                     self._record_text))

    def on_batch(self, record: BatchRecord) -> None:
        links = tuple(
            Link(_context_of(span), {"glassbox.request_id": request_id})
            for request_id, span in zip(record.request_ids, record.spans, strict=False)
            if span is not None and span.sampled
        )
        unnamed = len(record.request_ids) - sum(1 for span in record.spans if span is not None)
        # The sampler sees the links (LinkedOrRatio keeps a batch that links to a sampled request); the
        # attributes it would also see are made in the export thread, and glassbox's samplers do not read them.
        context, _ = self._decide.start(BATCH_SPAN, Context(), SpanKind.INTERNAL, list(links))
        if context.trace_flags.sampled:
            self._write(BatchSpans(record, context, links, unnamed, clock_offset_ns()))

    def on_rejected(self, reason: str) -> None:
        pass  # the refused request still reaches on_request, with its 429

    def on_dropped(self, reason: str, items: int) -> None:
        pass

    def on_aborted(self, reason: str) -> None:
        pass  # aborted before the app saw a request: there is nothing to hang a span on

    def on_fallback(self, event: FallbackEvent) -> None:
        pass

    # -- for the other observers ------------------------------------------------------------------------------------
    def ids_for(self, record: RequestRecord) -> SpanIds | None:
        """The server span's ids of `record`, if `record` is the request this observer handled last.

        Observers that run after this one in the same on_request call (metrics exemplars, the request log line)
        use it; the identity check means a caller out of order gets None, never another request's ids."""
        last = self._last
        return last[1] if last is not None and last[0] is record else None

    # -- internals --------------------------------------------------------------------------------------------------
    def _write(self, item: Any) -> None:
        # The BatchSpanProcessor reads only `.context` of what it queues; its exporter builds the spans.
        self._processor.on_end(cast(ReadableSpan, item))


def _context_of(span: SpanRef) -> SpanContext:
    return SpanContext(int(span.trace_id, 16), int(span.span_id, 16), False,
                       _SAMPLED if span.sampled else _NOT_SAMPLED)
