"""telemetry/otlpwire.py: the OTLP request built from span shapes must be the very message the SDK's encoder makes
from the same spans (telemetry/spans.py renders both from one set of shapes), and the exporters must use it."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState

from glassbox.service.observer import RequestRecord, SpanRef
from glassbox.telemetry.otlp import span_exporter
from glassbox.telemetry.otlpwire import WireEncoder, any_value, encode_items
from glassbox.telemetry.spans import BatchSpans, ItemSpanExporter, RequestSpans, readable_spans
from tests.telemetry.otlp_receiver import RECEIVERS, ReceivedSpan, Receiver, grpc_available
from tests.telemetry.tracetools import (
    HTTP,
    PARENT_SPAN_ID,
    TRACE_ID,
    batch_record,
    request_record,
    settings,
    traceparent,
)

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
STAGE_NAMES = ("parse", "tokenize", "queue", "infer", "postprocess")
RESOURCE = Resource.create({"service.name": "glassbox-test", "service.version": "1.2.3", "host.cores": 2})


def context(span_id: int, trace_id: int = 0x1234, state: TraceState | None = None,
            remote: bool = False) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, SAMPLED, state or TraceState())


def request_item(record: RequestRecord, span_id: int, *, record_text: bool = False) -> RequestSpans:
    trace_id = int(TRACE_ID, 16) if record.traceparent else 0xABC0 + span_id
    return RequestSpans(record, trace_id, span_id, 1_700_000_000_000_000_000 - record.start_ns,
                        tuple(span_id * 100 + i for i in range(len(record.stages))), record_text)


BATCH_7 = SpanRef(f"{0x7777:032x}", f"{77:016x}", True)
BATCH_8 = SpanRef(f"{0x8888:032x}", f"{88:016x}", False)


def items() -> list[Any]:
    """The same spans on every call: all times fixed."""
    t = 5_000_000_000
    plain = request_item(request_record("plain", batch_ids=(7, 8), attributes={"tenant": "t-1"}, start_ns=t,
                                        http=HTTP, batch_spans=(BATCH_7, BATCH_8)), 1)
    continued = request_item(request_record("remote", batch_ids=(7,), start_ns=t + 1, traceparent=traceparent(),
                                            tracestate="vendor=x1,b=2", batch_spans=(BATCH_7,)), 2)
    failed = request_item(request_record("failed", status=503, error_code="engine_unavailable", batch_ids=(),
                                         start_ns=t + 2, http=HTTP), 3)
    failed_no_code = request_item(request_record("bare", status=500, batch_ids=(), start_ns=t + 3), 4)
    texted = request_item(request_record("texted", attributes={"text": "tekst ü ✓"}, start_ns=t + 4), 5,
                          record_text=True)
    links = (Link(context(1, 0xABC1), {"glassbox.request_id": "plain"}),
             Link(context(2, int(TRACE_ID, 16)), {"n": -3, "f": 0.25}))
    batch = BatchSpans(batch_record(7, ("plain", "remote", "gone"), start_ns=t + 5), context(77, 0x7777), 1, 10,
                       links=links)
    return [plain, continued, failed, failed_no_code, texted, batch]


def test_the_wire_request_is_the_sdk_encoders_message() -> None:
    batch = items()
    ours = ExportTraceServiceRequest.FromString(encode_items(WireEncoder(RESOURCE.attributes), batch))
    sdk = encode_spans(readable_spans(batch, RESOURCE))
    assert len(ours.resource_spans[0].scope_spans[0].spans) == 6 * 5 + 1
    assert ours == sdk
    # Field for field as well, so a failure says which span differs.
    for mine, theirs in zip(ours.resource_spans[0].scope_spans[0].spans, sdk.resource_spans[0].scope_spans[0].spans,
                            strict=True):
        assert mine == theirs, mine.name


def test_remote_parents_error_status_links_and_text_are_written() -> None:
    request = ExportTraceServiceRequest.FromString(encode_items(WireEncoder(RESOURCE.attributes), items()))
    spans = {span.name if span.name != "POST /v1/classify" else dict((a.key, a.value.string_value) for a in
             span.attributes)["glassbox.request_id"]: span for span in request.resource_spans[0].scope_spans[0].spans}
    assert spans["remote"].parent_span_id.hex() == PARENT_SPAN_ID
    assert spans["remote"].trace_state == "vendor=x1,b=2"
    assert spans["remote"].flags == 0x300 and spans["plain"].flags == 0x100
    assert (spans["failed"].status.code, spans["failed"].status.message) == (2, "engine_unavailable")
    assert (spans["bare"].status.code, spans["bare"].status.message) == (2, "")
    assert spans["plain"].status.code == 0 and spans["plain"].HasField("status")
    texts = [a.value.string_value for a in spans["texted"].attributes if a.key == "glassbox.request.text"]
    assert texts == ["tekst ü ✓"]
    batch = spans["engine.batch"]
    assert [link.span_id.hex() for link in batch.links] == [f"{1:016x}", f"{2:016x}"]
    assert [a.value.int_value for a in batch.links[1].attributes if a.key == "n"] == [-3]
    # the other way: the infer span of a request links to every batch it rode in
    [infer] = [span for span in request.resource_spans[0].scope_spans[0].spans
               if span.name == "infer" and span.parent_span_id.hex() == f"{1:016x}"]
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in infer.links] == [
        (BATCH_7.trace_id, BATCH_7.span_id), (BATCH_8.trace_id, BATCH_8.span_id)]
    assert [[a.value.int_value for a in link.attributes if a.key == "glassbox.batch.id"] for link in infer.links] == [
        [7], [8]]


class Colour(enum.IntEnum):
    RED = 3


class Shade(enum.StrEnum):
    DARK = "dark"


@pytest.mark.parametrize("value", ["", "ü", 0, 1, -1, 2**63 - 1, -(2**63), 0.5, -0.0, True, False, [1, 2], ("a", "b"),
                                   [True, 1.5, "x"], Colour.RED, Shade.DARK])
def test_any_value_matches_protobuf(value: Any) -> None:
    parsed = any_value(value)
    if isinstance(value, list | tuple):
        assert [getattr(v, v.WhichOneof("value")) for v in parsed.array_value.values] == list(value)
    elif isinstance(value, bool):
        assert parsed.WhichOneof("value") == "bool_value" and parsed.bool_value is value
    elif isinstance(value, str):
        assert parsed.string_value == (value.value if isinstance(value, enum.Enum) else value)
    elif isinstance(value, int):
        assert parsed.WhichOneof("value") == "int_value" and parsed.int_value == value
    else:
        assert parsed.WhichOneof("value") == "double_value" and parsed.double_value == value


def test_other_values_are_written_as_their_text() -> None:
    assert any_value({"a": 1}).string_value == "{'a': 1}"


def test_an_empty_list_is_an_empty_array() -> None:
    assert any_value([]).WhichOneof("value") == "array_value"


def test_the_bytes_are_the_message() -> None:
    encoder = WireEncoder(RESOURCE.attributes, "https://example.com/schema")
    shapes = [shape for item in items() for shape in item.shapes()]
    request = encoder.message(shapes)
    assert request.resource_spans[0].schema_url == "https://example.com/schema"
    assert ExportTraceServiceRequest.FromString(encoder.request(shapes)) == request
    # Each request starts afresh: nothing of the previous one is carried over.
    assert len(encoder.message(shapes[:2]).resource_spans[0].scope_spans[0].spans) == 2


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_glassbox_items_take_the_wire_encoder_not_the_sdks(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if protocol == "grpc" and not grpc_available():
        pytest.skip("grpcio is not installed")
    import glassbox.telemetry.exporters

    def refuse(spans: Any) -> None:
        raise AssertionError("a batch of glassbox span items went through the SDK's encoder")

    monkeypatch.setattr(glassbox.telemetry.exporters, "encode_spans", refuse)
    with RECEIVERS[protocol]() as running:
        exporter = span_exporter(settings(otlp_endpoint=running.endpoint, otlp_protocol=protocol), resource=RESOURCE)
        assert exporter is not None
        try:
            assert exporter.export(items()).name == "SUCCESS"
        finally:
            exporter.shutdown()
        assert len(running.spans()) == 31


def summary(spans: list[ReceivedSpan]) -> list[tuple[str, str, str, str, int, int, int]]:
    return sorted((s.name, s.trace_id, s.span_id, s.parent_span_id, s.start_ns, len(s.attributes), len(s.links))
                  for s in spans)


@pytest.mark.parametrize("given", ["items", "readable-spans"])
def test_both_encoders_deliver_the_same_spans(receiver: tuple[str, Receiver], given: str) -> None:
    # Span items take WireEncoder; ReadableSpans (what an SDK tracer makes) take the SDK's encoder.
    protocol, running = receiver
    exporter = span_exporter(settings(otlp_endpoint=running.endpoint, otlp_protocol=protocol), resource=RESOURCE)
    assert exporter is not None
    batch = items() if given == "items" else readable_spans(items(), RESOURCE)
    try:
        assert exporter.export(batch).name == "SUCCESS"  # type: ignore[arg-type]
    finally:
        exporter.shutdown()
    expected = readable_spans(items(), RESOURCE)
    received = running.spans()
    assert len(received) == len(expected) == 31
    assert {s.resource["service.name"] for s in received} == {"glassbox-test"}
    assert summary(received) == sorted(
        (s.name, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
         f"{s.parent.span_id:016x}" if s.parent else "", s.start_time or 0, len(s.attributes or {}), len(s.links))
        for s in expected)


def test_spans_made_through_the_providers_tracer_still_export(receiver: tuple[str, Receiver]) -> None:
    # glassbox does not use the provider's tracer, but a span made through it must not break a batch.
    protocol, running = receiver
    exporter = span_exporter(settings(otlp_endpoint=running.endpoint, otlp_protocol=protocol), resource=RESOURCE)
    assert exporter is not None
    tracer_span = TracerProvider(resource=RESOURCE, shutdown_on_exit=False).get_tracer("other").start_span("other")
    tracer_span.end()
    try:
        assert exporter.export([*items()[:1], tracer_span]).name == "SUCCESS"  # type: ignore[list-item]
    finally:
        exporter.shutdown()
    assert sorted(s.name for s in running.spans()) == sorted(["POST /v1/classify", "other", *STAGE_NAMES])


def test_any_span_exporter_gets_readable_spans_built_from_items() -> None:
    inner = InMemorySpanExporter()
    wrapper = ItemSpanExporter(inner, RESOURCE)
    tracer_span = TracerProvider(resource=RESOURCE, shutdown_on_exit=False).get_tracer("other").start_span("other")
    tracer_span.end()
    wrapper.export([*items(), tracer_span])  # type: ignore[list-item]
    finished = inner.get_finished_spans()
    assert len(finished) == 32 and finished[-1].context == tracer_span.get_span_context()
    assert {span.resource for span in finished[:-1]} == {RESOURCE}
