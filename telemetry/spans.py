"""What a trace says about a request or a batch, decided once and rendered twice.

The event loop only decides (sampling, ids, links) and queues one small frozen item per request (RequestSpans) or
engine batch (BatchSpans). The span processor's export thread turns an item into span shapes (SpanShape: name, ids,
times, attributes; one per span) and those into what the exporter wants: the OTLP wire format straight away
(telemetry/otlpwire.py) or, for any other SpanExporter, the SDK's ReadableSpans (ItemSpanExporter). Both read the
same shapes, so the names, parents, attributes and links cannot differ between the two.

Items travel through the SDK's BatchSpanProcessor in place of ReadableSpans: it only reads `.context` to check the
sampled flag, and hands whole lists to the exporter, which is ours. That keeps its queue, batching, flush and
shutdown, and a request's six spans cost the event loop one queue append.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import AttributeValue

from glassbox.service.observer import UNMATCHED_ROUTE, BatchRecord, HttpInfo, RequestRecord

BATCH_SPAN = "engine.batch"
# RequestRecord.attributes key under which the app may put the request's text, and only when record_text is on.
# Observers drop it unless their own record_text is on too, so one mistake cannot leak text.
TEXT_KEY = "text"
TEXT_ATTRIBUTE = "glassbox.request.text"
TRACER_NAME = "glassbox"
Attributes = dict[str, AttributeValue]
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NO_STATE = TraceState()


class SpanShape(NamedTuple):
    """One finished span, as plain data."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root span
    parent_remote: bool  # the parent came in a traceparent header
    trace_state: TraceState
    kind: SpanKind
    start_ns: int  # wall clock (unix epoch ns)
    end_ns: int
    attributes: Attributes | None
    links: tuple[Link, ...]
    error: str | None  # None: status unset; else status ERROR with this description


# What the BatchSpanProcessor reads of an item: only that it is sampled (so it queues it). A request item carries its
# own ids as plain ints; its parent and trace state are parsed from the headers in the export thread.
_KEPT = SpanContext(1, 1, False, _SAMPLED)


@dataclass(frozen=True, slots=True)
class RequestSpans:
    """A kept request's server span and its stage spans, ids decided on the event loop, built later."""

    record: RequestRecord
    trace_id: int  # the server span's
    span_id: int
    offset_ns: int  # wall clock minus perf_counter for this request
    stage_ids: tuple[int, ...]  # one span id per record.stages entry
    record_text: bool

    @property
    def context(self) -> SpanContext:
        return _KEPT

    def shapes(self) -> Iterator[SpanShape]:
        record, offset = self.record, self.offset_ns
        trace_id, server_id = self.trace_id, self.span_id
        parent = _remote_parent(record.traceparent, record.tracestate, trace_id)
        state = parent.trace_state if parent is not None else _NO_STATE
        for stage, span_id in zip(record.stages, self.stage_ids, strict=True):
            infer = stage.name == "infer"
            yield SpanShape(stage.name, trace_id, span_id, server_id, False, state, SpanKind.INTERNAL,
                            stage.start_ns + offset, stage.end_ns + offset, stage_attributes(record, stage.name),
                            batch_links(record) if infer else (), None)
        yield SpanShape(
            server_span_name(record), trace_id, server_id, parent.span_id if parent is not None else 0,
            parent is not None, state, SpanKind.SERVER, record.start_ns + offset, record.end_ns + offset,
            server_attributes(record, self.record_text), (),
            (record.error_code or "") if record.status >= 500 else None,
        )


def _remote_parent(traceparent: str | None, tracestate: str | None, trace_id: int) -> SpanContext | None:
    """The valid remote parent the headers name, when it is of this trace (the one the span was named in)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent} if tracestate is None else {"traceparent": traceparent,
                                                                        "tracestate": tracestate}
    parent = get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    return parent if parent.is_valid and parent.trace_id == trace_id else None


def batch_links(record: RequestRecord) -> tuple[Link, ...]:
    """From a request's `infer` span to the span of each batch it rode in (those are kept whenever it is)."""
    spans = record.batch_spans
    if len(spans) == len(record.batch_ids):
        return tuple(Link(SpanContext(int(span.trace_id, 16), int(span.span_id, 16), False, _SAMPLED),
                          {"glassbox.batch.id": batch_id})
                     for batch_id, span in zip(record.batch_ids, spans, strict=True))
    return tuple(Link(SpanContext(int(span.trace_id, 16), int(span.span_id, 16), False, _SAMPLED))
                 for span in spans)


@dataclass(frozen=True, slots=True)
class BatchSpans:
    """One engine batch's span: a root linked to the server spans of the requests in it."""

    record: BatchRecord
    context: SpanContext
    missing: int  # requests of the batch whose server span was never named (not opened): no link for them
    offset_ns: int
    links: tuple[Link, ...] | None = None  # None: request_links(record), made when the span is written

    def shapes(self) -> Iterator[SpanShape]:
        # The links are made here, for a batch span that is written, not for every batch on the event loop.
        timing, context = self.record.timing, self.context
        links = self.links if self.links is not None else request_links(self.record)
        yield SpanShape(BATCH_SPAN, context.trace_id, context.span_id, 0, False, context.trace_state,
                        SpanKind.INTERNAL, timing.start_ns + self.offset_ns, timing.end_ns + self.offset_ns,
                        batch_attributes(self.record, self.missing), links, None)


def request_links(record: BatchRecord) -> tuple[Link, ...]:
    """A batch span's links: one to the server span of each request in it whose span was named."""
    return tuple(
        Link(SpanContext(int(span.trace_id, 16), int(span.span_id, 16), False,
                         TraceFlags(TraceFlags.SAMPLED if span.sampled else TraceFlags.DEFAULT)),
             {"glassbox.request_id": request_id})
        for request_id, span in zip(record.request_ids, record.spans, strict=False)
        if span is not None
    )


def linked(record: BatchRecord) -> int:
    """How many of the batch's requests its span links to (request_links' length, without making them)."""
    spans = record.spans[: len(record.request_ids)]
    return len(spans) - spans.count(None)


def server_span_name(record: RequestRecord) -> str:
    """`{method} {route}`; the method alone for a request no route took (the HTTP conventions name a span by its
    route template only where there is one)."""
    return record.method if record.route == UNMATCHED_ROUTE else f"{record.method} {record.route}"


def server_attributes(record: RequestRecord, record_text: bool) -> Attributes:
    attributes: Attributes = {
        "http.request.method": record.method,
        "http.response.status_code": record.status,
        "glassbox.request_id": record.request_id,
        "glassbox.texts": record.texts,
        "glassbox.tokens": record.tokens,
        "glassbox.max_tokens": record.max_tokens,
        "glassbox.truncated": record.truncated,
    }
    if record.route != UNMATCHED_ROUTE:
        attributes["http.route"] = record.route
    if record.http is not None:
        attributes.update(http_attributes(record.http))
    if record.error_code:
        attributes["glassbox.error.code"] = record.error_code
    if record.status >= 500:  # the HTTP conventions: a server span's error.type for a 5xx only (4xx is the client's)
        attributes["error.type"] = record.error_code or str(record.status)
    if record.device:
        attributes["glassbox.device"] = record.device
    if record.engine_mode:
        attributes["glassbox.engine.mode"] = record.engine_mode
    if record.batch_ids:
        attributes["glassbox.batch.ids"] = list(record.batch_ids)
    for key, value in record.attributes.items():
        if key == TEXT_KEY:
            if record_text:
                attributes[TEXT_ATTRIBUTE] = value
        else:
            attributes[f"glassbox.{key}"] = value
    return attributes


def http_attributes(http: HttpInfo) -> Attributes:
    """The OpenTelemetry HTTP server span attributes the conventions require (url.path, url.scheme) and recommend."""
    attributes: Attributes = {"url.path": http.path, "url.scheme": http.scheme,
                              "network.protocol.version": http.version}
    if http.query:
        attributes["url.query"] = http.query
    if http.client is not None:
        attributes["client.address"] = http.client[0]
    peer = http.peer or http.client
    if peer is not None:  # behind a trusted proxy, the proxy: the client is only what it forwarded
        attributes["network.peer.address"] = peer[0]
        attributes["network.peer.port"] = peer[1]
    address, port = _authority(http.host)
    if address is None and http.server is not None:
        address, port = http.server
    if address:
        attributes["server.address"] = address
    if port is not None:
        attributes["server.port"] = port
    elif address and http.host:  # a Host header without a port: the scheme's
        attributes["server.port"] = 443 if http.scheme == "https" else 80
    if http.user_agent:
        attributes["user_agent.original"] = http.user_agent
    return attributes


def _authority(host: str | None) -> tuple[str | None, int | None]:
    """(address, port) of a Host header value: `name`, `name:port`, `[v6]`, `[v6]:port`."""
    if not host:
        return None, None
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return host, None
        name, rest = host[1:end], host[end + 1:]
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, port = host.split(":")
    else:
        name, port = host, ""
    return name, int(port) if port.isdigit() else None


def stage_attributes(record: RequestRecord, stage: str) -> Attributes | None:
    if stage != "infer" or not record.device:
        return None
    return {"glassbox.device": record.device, "glassbox.engine.mode": record.engine_mode,
            "glassbox.batch.ids": list(record.batch_ids)}


def batch_attributes(record: BatchRecord, missing: int) -> Attributes:
    timing = record.timing
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
    if missing:
        attributes["glassbox.batch.unlinked_requests"] = missing
    return attributes


def readable_spans(items: Sequence[Any], resource: Resource,
                   scope: InstrumentationScope | None = None) -> list[ReadableSpan]:
    """The SDK's finished spans for `items` (ReadableSpans among them pass through as they are)."""
    scope = scope or InstrumentationScope(TRACER_NAME)
    spans: list[ReadableSpan] = []
    for item in items:
        if not isinstance(item, RequestSpans | BatchSpans):
            spans.append(item)
            continue
        for shape in item.shapes():
            context = SpanContext(shape.trace_id, shape.span_id, False, _SAMPLED, shape.trace_state)
            parent = (SpanContext(shape.trace_id, shape.parent_id, shape.parent_remote, _SAMPLED, shape.trace_state)
                      if shape.parent_id else None)
            status = Status(StatusCode.ERROR, shape.error) if shape.error is not None else Status(StatusCode.UNSET)
            spans.append(ReadableSpan(
                shape.name, context, parent, resource, shape.attributes or {}, links=shape.links, kind=shape.kind,
                status=status, start_time=shape.start_ns, end_time=shape.end_ns, instrumentation_scope=scope,
            ))
    return spans


class ItemSpanExporter(SpanExporter):
    """Wraps any SpanExporter (an in-memory one in tests, a vendor's): items in, ReadableSpans out to `inner`."""

    takes_items = True

    def __init__(self, inner: SpanExporter, resource: Resource) -> None:
        self.inner = inner
        self._resource = resource
        self._scope = InstrumentationScope(TRACER_NAME)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export(readable_spans(spans, self._resource, self._scope))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
