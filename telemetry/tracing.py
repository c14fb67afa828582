"""Spans from records: a server span per request with its stage spans, and one span per engine batch linked to them
both ways.

Nothing here runs inside the request: spans are made after the fact from the perf_counter_ns times the records
carry, shifted to wall-clock time by the offset the request itself measured (`wall_start_ns - start_ns`).

Ids are named up front, the keep decision is taken on the outcome. A request's server span is named when it starts
(`open_request`: its ids, from the traceparent header or a new trace, and the up-front half of the decision: a
sampled parent or the ratio); a batch's span is named before its answers go out (`open_batch`). The names travel with
the request's rows to the batcher and back, in this process or in the engine process, so a batch span links to its
requests and a request's `infer` span links to its batches. When the request ends, `on_request` keeps it when the
up-front decision did, or when it failed (5xx) or was slower than the latency SLO (`slow_s`), whatever its parent
said: an unsampled parent cannot turn that off.

A batch span whose requests were none kept up front is held back (HeldBatches, bounded) until a request that rode in
it is kept for its outcome; then it is written too. In the multi-process layout batches are observed in the engine
process and requests in the workers: a worker's observer hands the batch ids of such a request to
`forward_kept` (the engine link's Keep message), and the engine process's observer releases them (`keep_batches`).

The event loop only decides. For each kept request it queues one RequestSpans item on the span processor; the
processor's export thread builds the spans from it (parsing the parent's headers there too) and writes them
(telemetry/spans.py). On the shared 2-core dev machine that is ~9 us of event-loop time a request, against ~50 us
when the six SDK spans (and a share of the batch span) were built on the loop
(`python -m benchmarks.telemetry_overhead --micro`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter

from glassbox.service.observer import BatchRecord, FallbackEvent, RequestRecord, SpanRef
from glassbox.telemetry.spans import (  # re-exported: the names other modules and the tests know these by
    BATCH_SPAN,
    TEXT_ATTRIBUTE,
    TEXT_KEY,
    BatchSpans,
    RequestSpans,
    linked,
    request_links,
    server_span_name,
)

__all__ = ["BATCH_SPAN", "TEXT_ATTRIBUTE", "TEXT_KEY", "HeldBatches", "SpanIds", "TracingObserver", "remote_parent"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
HELD_BATCHES = 4096  # batch spans held back for a request kept on its outcome: ~1 s of batches at a high rate
REFUSAL_DECISIONS = 1024  # 429s decided by a traceresponse and not yet observed: the decision is taken once
# Why a request's trace is kept or dropped: the values of glassbox_traces_total{decision, reason}.
KEPT_REASONS = ("sampled", "error", "slow", "refused")
DROPPED_REASONS = ("unsampled", "refusals_capped")
TRACE_DECISIONS = (*(("kept", r) for r in KEPT_REASONS), *(("dropped", r) for r in DROPPED_REASONS))


def decision_counter(traces: Counter) -> Callable[[str, str], None]:
    """glassbox_traces_total's series, all created at 0 (so the first drop or keep shows in rate()), bound once."""
    children = {key: traces.labels(*key) for key in TRACE_DECISIONS}
    return lambda decision, reason: children[(decision, reason)].inc()


class RefusalBudget:
    """How many 429s a second get their traces kept: a token bucket, `per_s` a second and a burst of as many (at
    least one). An overload then shows in traces (which requests were refused, how late) without exporting its
    flood: at 3x capacity a 2-core server refuses ~1 000 requests a second."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = per_s
        self._burst = max(1.0, per_s)
        self._tokens = self._burst
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        if self._rate <= 0:
            return False
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class SpanIds:
    """The server span of one request, as W3C hex ids (what exemplars and log lines carry)."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    sampled: bool  # False: the span was not kept, so no backend will ever have it


def remote_parent(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The context of W3C `traceparent` (and `tracestate`) header values; an empty context (so: a new trace) when
    traceparent is absent or invalid."""
    if not traceparent:
        return Context()
    carrier = {"traceparent": traceparent} if tracestate is None else {"traceparent": traceparent,
                                                                        "tracestate": tracestate}
    return TraceContextTextMapPropagator().extract(carrier, Context())


def clock_offset_ns() -> int:
    """wall-clock ns minus perf_counter ns, measured now (for records that do not carry their own)."""
    return time.time_ns() - time.perf_counter_ns()


class _Decider:
    """Up-front sampling decisions and ids, as the provider would make them for a new top-level span."""

    def __init__(self, provider: TracerProvider) -> None:
        self._sampler = provider.sampler
        self.new_span_id = provider.id_generator.generate_span_id
        self.new_trace_id = provider.id_generator.generate_trace_id
        # The sampler's rule for a root with no links, where it has one (glassbox's own, telemetry/otlp.py); another
        # sampler is asked through should_sample every time.
        roots = getattr(self._sampler, "roots", None)
        self._keeps_root: Callable[[int], bool] | None = getattr(roots, "keeps_root", None)

    def root(self, name: str, kind: SpanKind) -> SpanRef:
        """A new trace's root span with no links (the request span of a client that sent no traceparent, the batch
        span of unsampled requests), `sampled` if kept up front. The same decision as `start`, at a fraction of its
        cost (no contexts, no SamplingResult, no SpanContext)."""
        trace_id = self.new_trace_id()
        keeps = self._keeps_root
        if keeps is None:
            kept = self._sampler.should_sample(Context(), trace_id, name, kind, None, None).decision \
                is Decision.RECORD_AND_SAMPLE
        else:
            kept = keeps(trace_id)
        return SpanRef(f"{trace_id:032x}", f"{self.new_span_id():016x}", kept)

    def start(self, name: str, parent: Context, kind: SpanKind, links: list[Link] | None = None) -> SpanContext:
        """The new span's context: a child of `parent`'s span when that is valid, else a new trace's root."""
        remote = trace.get_current_span(parent).get_span_context()
        trace_id = remote.trace_id if remote.is_valid else self.new_trace_id()
        decision = self._sampler.should_sample(parent, trace_id, name, kind, None, links)
        flags = _SAMPLED if decision.decision is Decision.RECORD_AND_SAMPLE else _NOT_SAMPLED
        return SpanContext(trace_id, self.new_span_id(), False, flags, decision.trace_state)


class HeldBatches:
    """Batch spans not written when their batch ran (none of its requests was kept up front), by batch id, until a
    request that rode in them is kept for its outcome; and the batch ids asked for before their batch was recorded
    (in the engine process of the worker layout a worker's Keep can arrive before its batch is recorded). Both
    bounded: the oldest go first.

    Called from the event loops that record batches (hold) and keep requests (release): one lock, tiny critical
    sections."""

    def __init__(self, limit: int = HELD_BATCHES) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._held: dict[int, BatchSpans] = {}
        self._wanted: dict[int, None] = {}

    def hold(self, batch_id: int, item: BatchSpans) -> bool:
        """Hold `item`; True when it was asked for already, so it is to be written now instead."""
        with self._lock:
            if self._wanted.pop(batch_id, False) is None:
                return True
            held = self._held
            held[batch_id] = item
            if len(held) > self._limit:
                del held[next(iter(held))]
        return False

    def release(self, batch_ids: tuple[int, ...]) -> list[BatchSpans]:
        """The held items of `batch_ids`; the others are remembered as wanted, for when they are recorded (a batch
        already written is remembered too, harmlessly, until the bound pushes it out)."""
        found: list[BatchSpans] = []
        with self._lock:
            for batch_id in batch_ids:
                item = self._held.pop(batch_id, None)
                if item is not None:
                    found.append(item)
                    continue
                wanted = self._wanted
                wanted[batch_id] = None
                if len(wanted) > self._limit:
                    del wanted[next(iter(wanted))]
        return found

    def __len__(self) -> int:
        return len(self._held)


class TracingObserver:
    """Implements glassbox.service.observer.Observer (and SpanOpener) with OpenTelemetry spans.

    `provider` (owned by the caller) gives the sampler, ids and resource; `processor` must be one of its span
    processors, a BatchSpanProcessor whose exporter takes span items (telemetry/otlp.py builds both), so that the
    provider's force_flush and shutdown cover these spans. A request slower than `slow_s` (the latency SLO), or
    answered with a 5xx, is kept whatever the sample ratio and its parent said; a 429 while `refusals` (a
    RefusalBudget) allows. `count(decision, reason)` is told each request's decision (glassbox_traces_total)."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor, *, record_text: bool = False,
                 slow_s: float = 0.25, held_batches: int = HELD_BATCHES, refusals: RefusalBudget | None = None,
                 count: Callable[[str, str], None] | None = None) -> None:
        self._decide = _Decider(provider)
        self._processor = processor
        self._record_text = record_text
        self._slow_ns = int(slow_s * 1e9)
        self._held = HeldBatches(held_batches)
        self._last: tuple[RequestRecord, SpanIds] | None = None
        self._refusals = refusals or RefusalBudget(0.0)
        self._refusal_decisions: dict[str, bool] = {}  # span id -> kept, for a 429 whose traceresponse went first
        self._count = count
        # Where the batch ids of a request kept for its outcome go when batches are observed in another process
        # (an HTTP worker's link to the engine process); None: this observer holds them itself.
        self.forward_kept: Callable[[tuple[int, ...]], None] | None = None

    # -- SpanOpener ---------------------------------------------------------------------------------------------------
    def open_request(self, traceparent: str | None, tracestate: str | None = None) -> SpanRef:
        if not traceparent:  # most requests: a new trace
            return self._decide.root("request", SpanKind.SERVER)
        return _ref(self._decide.start("request", remote_parent(traceparent, tracestate), SpanKind.SERVER))

    def open_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef:
        """A batch's span, named before its answers go out: kept up front when one of its requests is (the
        provider's sampler, LinkedOrRatio, decides the others by the ratio)."""
        decide = self._decide
        if any(span is not None and span.sampled for span in spans):
            return SpanRef(f"{decide.new_trace_id():032x}", f"{decide.new_span_id():016x}", True)
        return decide.root(BATCH_SPAN, SpanKind.INTERNAL)

    def trace_response(self, record: RequestRecord) -> str | None:
        """The W3C traceresponse header value of `record`'s server span: its ids, and whether it is kept. For a span
        opened up front the outcome decides, so the answer needs no on_request first (the server sends it before
        its record is observed); a span made in on_request is answered right after on_request handled it."""
        span = record.span
        if span is not None:
            kept = self._reason(record, span.sampled, span.span_id)[0] == "kept"
            if record.status == 429 and not span.sampled:  # the budget was spent on it: on_request reads this
                decisions = self._refusal_decisions
                decisions[span.span_id] = kept
                if len(decisions) > REFUSAL_DECISIONS:
                    del decisions[next(iter(decisions))]
            ids: SpanIds | None = SpanIds(span.trace_id, span.span_id, kept)
        else:
            ids = self.ids_for(record)
        if ids is None:
            return None
        return f"00-{ids.trace_id}-{ids.span_id}-{'01' if ids.sampled else '00'}"

    def _reason(self, record: RequestRecord, up_front: bool, span_id: str) -> tuple[str, str]:
        """(kept or dropped, why): kept up front (a sampled parent or the ratio), or for its outcome: a 5xx, slower
        than the latency SLO, or a 429 within the refusal budget (decided once per request)."""
        if up_front:
            return "kept", "sampled"
        status = record.status
        if status >= 500:
            return "kept", "error"
        if record.end_ns - record.start_ns > self._slow_ns:
            return "kept", "slow"
        if status == 429:
            decided = self._refusal_decisions.pop(span_id, None)
            kept = self._refusals.take() if decided is None else decided
            return ("kept", "refused") if kept else ("dropped", "refusals_capped")
        return "dropped", "unsampled"

    # -- Observer ---------------------------------------------------------------------------------------------------
    def on_request(self, record: RequestRecord) -> None:
        span = record.span
        if span is None:  # never opened: decide now, as open_request would have
            name = server_span_name(record)
            if not record.traceparent:
                span = self._decide.root(name, SpanKind.SERVER)
            else:
                parent = remote_parent(record.traceparent, record.tracestate)
                span = _ref(self._decide.start(name, parent, SpanKind.SERVER))
        trace_id, span_id, up_front = span.trace_id, span.span_id, span.sampled
        decision, reason = self._reason(record, up_front, span_id)
        if self._count is not None:
            self._count(decision, reason)
        kept = decision == "kept"
        self._last = (record, SpanIds(trace_id, span_id, kept))
        if not kept:  # nothing of a dropped trace is exported: nothing to build
            return
        offset = record.wall_start_ns - record.start_ns if record.wall_start_ns else clock_offset_ns()
        new_id = self._decide.new_span_id
        self._write(RequestSpans(record, int(trace_id, 16), int(span_id, 16), offset,
                                 tuple(new_id() for _ in record.stages), self._record_text))
        if not up_front and record.batch_ids:  # its batches were held back: they go too
            forward = self.forward_kept
            if forward is not None:
                forward(record.batch_ids)
            else:
                self.keep_batches(record.batch_ids)

    def on_batch(self, record: BatchRecord) -> None:
        unnamed = len(record.request_ids) - linked(record)
        span = record.span
        if span is not None:
            context = _context_of(span)
        else:  # never named (a batcher without an opener): decide now, from the requests' up-front decisions
            sampled = [link for link in request_links(record) if link.context.trace_flags.sampled]
            context = self._decide.start(BATCH_SPAN, Context(), SpanKind.INTERNAL, sampled)
        item = BatchSpans(record, context, unnamed, clock_offset_ns())
        if context.trace_flags.sampled:
            self._write(item)
        elif self._held.hold(record.batch_id, item):
            self._write(_kept(item))

    def keep_batches(self, batch_ids: tuple[int, ...]) -> None:
        """Write the held spans of these batches (a request that rode in them was kept for its outcome); any not
        recorded yet are written when they are."""
        for item in self._held.release(batch_ids):
            self._write(_kept(item))

    @property
    def held_batches(self) -> int:
        """Batch spans held back now, waiting for a request of theirs to be kept."""
        return len(self._held)

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
        """The server span's ids of `record`, if `record` is the request this observer handled last; `sampled` says
        whether it is kept.

        Observers that run after this one in the same on_request call (metrics exemplars, the request log line)
        use it; the identity check means a caller out of order gets None, never another request's ids."""
        last = self._last
        return last[1] if last is not None and last[0] is record else None

    # -- internals --------------------------------------------------------------------------------------------------
    def _write(self, item: Any) -> None:
        # The BatchSpanProcessor reads only `.context` of what it queues; its exporter builds the spans.
        self._processor.on_end(cast(ReadableSpan, item))


def _kept(item: BatchSpans) -> BatchSpans:
    """`item`, kept after all: sampled, so that the span processor queues it."""
    context = item.context
    return replace(item, context=SpanContext(context.trace_id, context.span_id, False, _SAMPLED, context.trace_state))


def _ref(context: SpanContext) -> SpanRef:
    return SpanRef(f"{context.trace_id:032x}", f"{context.span_id:016x}", context.trace_flags.sampled)


def _context_of(span: SpanRef) -> SpanContext:
    return SpanContext(int(span.trace_id, 16), int(span.span_id, 16), False,
                       _SAMPLED if span.sampled else _NOT_SAMPLED)
