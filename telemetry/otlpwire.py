"""Span shapes to an OTLP ExportTraceServiceRequest, built with opentelemetry-proto's message classes.

The SDK's encoder (opentelemetry-exporter-otlp-proto-common) is not used on the hot path: it goes through a
ReadableSpan per span, builds a protobuf object per attribute and value on top of the span's own, and hashes the
resource (a JSON dump) once per span to group spans by resource and scope. Here the resource and scope are built
once per encoder, each request holds one ResourceSpans with one ScopeSpans, and spans are filled in place from the
shapes; protobuf (the upb C runtime) does all the wire encoding. tests/telemetry/test_otlpwire.py checks that the
message equals the SDK encoder's for the same spans, field for field.

Only what glassbox's spans use is filled in: ids, parent (with the SDK's is-remote flags), trace state, name, kind,
times, attributes (str, bool, int, float and lists of them; anything else as its str()), links, status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, SpanFlags, Status
from opentelemetry.trace import Link, SpanKind

from glassbox.telemetry.spans import TRACER_NAME, SpanShape

# The SDK always says whether the parent's (or a link's) is-remote bit is known, and sets the second bit when it is.
_FLAGS_LOCAL = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_KIND = {SpanKind.INTERNAL: Span.SpanKind.SPAN_KIND_INTERNAL, SpanKind.SERVER: Span.SpanKind.SPAN_KIND_SERVER,
         SpanKind.CLIENT: Span.SpanKind.SPAN_KIND_CLIENT, SpanKind.PRODUCER: Span.SpanKind.SPAN_KIND_PRODUCER,
         SpanKind.CONSUMER: Span.SpanKind.SPAN_KIND_CONSUMER}


def set_value(target: AnyValue, value: Any) -> None:
    """Fill `target` (an empty AnyValue, usually one inside a KeyValue) with `value`, as the SDK's encoder would."""
    kind = value.__class__  # the exact classes first: they are nearly all glassbox uses
    if kind is str:
        target.string_value = value
    elif kind is int:
        target.int_value = value
    elif kind is float:
        target.double_value = value
    elif isinstance(value, bool):  # before int: bool is an int
        target.bool_value = value
    elif isinstance(value, str):  # a str Enum, ...: protobuf takes its text
        target.string_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, list | tuple):
        array = target.array_value
        array.SetInParent()  # an empty list is still an (empty) array, as the SDK writes it
        add = array.values.add
        for item in value:
            set_value(add(), item)
    else:
        target.string_value = str(value)


def any_value(value: Any) -> AnyValue:
    message = AnyValue()
    set_value(message, value)
    return message


class WireEncoder:
    """ExportTraceServiceRequests for span shapes from one resource, under the glassbox scope.

    The resource and scope messages are built once here and copied into each request. One encoder may serve one
    export thread."""

    def __init__(self, resource_attributes: Mapping[str, Any], schema_url: str = "") -> None:
        self._resource = Resource(attributes=[KeyValue(key=key, value=any_value(value))
                                              for key, value in resource_attributes.items()])
        self._schema_url = schema_url
        self._scope = InstrumentationScope(name=TRACER_NAME)

    def message(self, shapes: Iterable[SpanShape]) -> ExportTraceServiceRequest:
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add(resource=self._resource, schema_url=self._schema_url)
        add = resource_spans.scope_spans.add(scope=self._scope).spans.add
        for shape in shapes:
            _fill_span(add(), shape)
        return request

    def request(self, shapes: Iterable[SpanShape]) -> bytes:
        data: bytes = self.message(shapes).SerializeToString()
        return data


def _fill_span(span: Span, shape: SpanShape) -> None:
    span.trace_id = shape.trace_id.to_bytes(16, "big")
    span.span_id = shape.span_id.to_bytes(8, "big")
    if shape.trace_state:
        span.trace_state = shape.trace_state.to_header()
    if shape.parent_id:
        span.parent_span_id = shape.parent_id.to_bytes(8, "big")
    span.name = shape.name
    span.kind = _KIND[shape.kind]
    span.start_time_unix_nano = shape.start_ns
    span.end_time_unix_nano = shape.end_ns
    if shape.attributes:
        add = span.attributes.add
        for key, value in shape.attributes.items():
            set_value(add(key=key).value, value)
    if shape.links:
        _fill_links(span, shape.links)
    status = span.status
    if shape.error is None:
        status.SetInParent()  # unset, but present: the SDK always writes a Status
    else:
        status.code = Status.STATUS_CODE_ERROR
        status.message = shape.error
    span.flags = _FLAGS_REMOTE if shape.parent_remote else _FLAGS_LOCAL


def _fill_links(span: Span, links: Sequence[Link]) -> None:
    add = span.links.add
    for link in links:
        context = link.context
        message = add(trace_id=context.trace_id.to_bytes(16, "big"), span_id=context.span_id.to_bytes(8, "big"),
                      flags=_FLAGS_REMOTE if context.is_remote else _FLAGS_LOCAL)
        if link.attributes:
            add_attribute = message.attributes.add
            for key, value in link.attributes.items():
                set_value(add_attribute(key=key).value, value)


def encode_items(encoder: WireEncoder, items: Sequence[Any]) -> bytes:
    """The request's bytes for a batch of span items (see telemetry/spans.py)."""
    return encoder.request(shape for item in items for shape in item.shapes())
