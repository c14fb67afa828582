"""The SDK's OTLP/gRPC exporter fed span items; imported only when the gRPC protocol is asked for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from telemetry.exporters import all_items
from telemetry.otlpwire import WireEncoder
from telemetry.spans import readable_spans


class GrpcItemExporter(GrpcExporter):
    """The SDK's OTLP/gRPC exporter, with WireEncoder's request in place of its own encoding (through the
    `_translate_data` hook; on an SDK without it, `fast` is False and the SDK's encoder runs)."""

    takes_items = True

    def __init__(self, wire: WireEncoder, resource: Resource, **options: Any) -> None:
        super().__init__(**options)
        self._wire = wire
        self._resource = resource
        self.fast = callable(getattr(GrpcExporter, "_translate_data", None))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return super().export(spans if self.fast else readable_spans(spans, self._resource))

    def _translate_data(self, data: Sequence[Any]) -> ExportTraceServiceRequest:
        if not all_items(data):
            return encode_spans(readable_spans(data, self._resource))
        request: ExportTraceServiceRequest = self._wire.message(shape for item in data for shape in item.shapes())
        return request
