"""Shared pieces for the tracing and log tests: in-memory tracing from Settings, hand-made records, a fan-out
observer (the real CompositeObserver lives in telemetry/fanout.py; these tests only need the call order)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from glassbox.service.observer import (
    STAGES,
    BatchRecord,
    FallbackEvent,
    HttpInfo,
    Observer,
    RequestRecord,
    SpanRef,
    StageSpan,
)
from glassbox.service.settings import Settings, load_settings
from glassbox.service.types import Bucket, EngineTiming
from glassbox.telemetry.otlp import Tracing, build_tracing

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"


def traceparent(sampled: bool = True, trace_id: str = TRACE_ID, parent: str = PARENT_SPAN_ID) -> str:
    return f"00-{trace_id}-{parent}-{'01' if sampled else '00'}"


def settings(**overrides: Any) -> Settings:
    return load_settings(overrides, environ={})


@dataclass
class MemoryTracing:
    tracing: Tracing
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        assert self.tracing.flush(10.0), "the span export did not finish"
        return list(self.exporter.get_finished_spans())


@contextmanager
def memory_tracing(decisions: Any = None, **overrides: Any) -> Iterator[MemoryTracing]:
    """Tracing into memory. Every trace is kept unless the test says otherwise (`trace_sample_ratio`): these tests
    look at what spans hold; test_trace_sampling.py checks the defaults' keep rule."""
    overrides.setdefault("trace_sample_ratio", 1.0)
    exporter = InMemorySpanExporter()
    tracing = build_tracing(settings(**overrides), exporter=exporter, decisions=decisions)
    assert tracing is not None
    try:
        yield MemoryTracing(tracing, exporter)
    finally:
        tracing.shutdown()


def request_record(
    request_id: str = "r1", *, status: int = 200, error_code: str | None = None, batch_ids: tuple[int, ...] = (1,),
    traceparent: str | None = None, attributes: dict[str, str] | None = None, stage_us: int = 100,
    start_ns: int | None = None, span: SpanRef | None = None, tracestate: str | None = None,
    http: HttpInfo | None = None, batch_spans: tuple[SpanRef, ...] = (),
) -> RequestRecord:
    """A request that took `stage_us` microseconds per stage, back to back, starting at `start_ns` (perf clock)."""
    start = time.perf_counter_ns() if start_ns is None else start_ns
    step = stage_us * 1000
    stages = tuple(StageSpan(name, start + i * step, start + (i + 1) * step) for i, name in enumerate(STAGES))
    return RequestRecord(
        request_id=request_id, route="/v1/classify", method="POST", status=status, error_code=error_code,
        start_ns=start, end_ns=start + len(STAGES) * step + 1000, stages=stages, texts=2, tokens=9, max_tokens=6,
        device="cpu", engine_mode="eager", batch_ids=batch_ids, traceparent=traceparent,
        wall_start_ns=1_700_000_000_000_000_000, attributes=attributes or {}, span=span, tracestate=tracestate,
        http=http, batch_spans=batch_spans,
    )


HTTP = HttpInfo("/v1/classify", "", "http", "1.1", ("10.1.2.3", 51234), ("0.0.0.0", 8000), "glassbox.example:8443",
                "curl/8.5.0")


def slow_record(request_id: str = "slow", slo_ms: float = 250.0, **fields: Any) -> RequestRecord:
    """A request whose stages add up to just over `slo_ms`."""
    return request_record(request_id, stage_us=int(slo_ms * 1000 / len(STAGES)) + 1, **fields)


def batch_record(batch_id: int, request_ids: tuple[str, ...], *, start_ns: int | None = None,
                 spans: tuple[SpanRef | None, ...] = (), span: SpanRef | None = None) -> BatchRecord:
    """A batch of the given requests; `spans` are their server spans, named when they started (open_request), and
    `span` the batch's own (open_batch)."""
    start = time.perf_counter_ns() if start_ns is None else start_ns
    timing = EngineTiming(start, start + 50_000, "cpu", "eager", rows=len(request_ids) * 2, real_tokens=17,
                          padded_tokens=24, bucket=Bucket(4, 8))
    return BatchRecord(batch_id, timing, request_ids, queue_depth_after=0, spans=spans, span=span)


class Fanout:
    """Calls each observer in order, like a composite would."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    def on_request(self, record: RequestRecord) -> None:
        for observer in self.observers:
            observer.on_request(record)

    def on_batch(self, record: BatchRecord) -> None:
        for observer in self.observers:
            observer.on_batch(record)

    def on_rejected(self, reason: str) -> None:
        for observer in self.observers:
            observer.on_rejected(reason)

    def on_dropped(self, reason: str, items: int) -> None:
        for observer in self.observers:
            observer.on_dropped(reason, items)

    def on_aborted(self, reason: str) -> None:
        for observer in self.observers:
            observer.on_aborted(reason)

    def on_fallback(self, event: FallbackEvent) -> None:
        for observer in self.observers:
            observer.on_fallback(event)


def every_string(span: ReadableSpan) -> list[str]:
    """Every text a span carries: its name, attribute keys and values, event and link attributes, status."""
    found = [span.name, span.status.description or ""]
    groups = [span.attributes or {}]
    groups += [event.attributes or {} for event in span.events]
    groups += [link.attributes or {} for link in span.links]
    for attributes in groups:
        for key, value in attributes.items():
            found.append(key)
            found.extend(str(v) for v in value) if isinstance(value, tuple | list) else found.append(str(value))
    return found
