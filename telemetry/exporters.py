"""The SDK's OTLP exporters, fed span items (telemetry/spans.py) and sending the bytes WireEncoder writes.

Everything else about the export (endpoint, headers, TLS, compression, retries, the OTEL_EXPORTER_OTLP_* variables)
stays the SDK's. Where an SDK version lacks the hook used here, `fast` is False and each batch is turned into
ReadableSpans and encoded by the SDK: slower, and the same on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from telemetry.otlpwire import WireEncoder, encode_items
from telemetry.spans import BatchSpans, RequestSpans, readable_spans


def all_items(items: Sequence[Any]) -> bool:
    """Only glassbox's span items (nothing made through the provider's tracer, which glassbox does not use)."""
    return all(isinstance(item, RequestSpans | BatchSpans) for item in items)


class HttpItemExporter(HttpExporter):
    """The SDK's OTLP/HTTP exporter (its endpoint, headers, TLS, compression and retries, OTEL_EXPORTER_OTLP_*
    variables included) sending requests written by WireEncoder instead of its own encoder.

    The bytes go through the exporter's client object, which is not public API: on an SDK without it (`fast` is
    False) every batch takes the SDK's own encoder instead, slower but the same on the wire. The fast path skips
    the exporter's request-size guard (64 MiB; a batch of 512 requests' spans is ~0.5 MB) and its self-metrics
    (off unless OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED is set)."""

    takes_items = True

    def __init__(self, wire: WireEncoder, resource: Resource, **options: Any) -> None:
        super().__init__(**options)
        self._wire = wire
        self._resource = resource
        self.fast = callable(getattr(getattr(self, "_client", None), "export", None))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.fast or getattr(self, "_shutdown", False) or not all_items(spans):
            return super().export(readable_spans(spans, self._resource))
        result = self._client.export(encode_items(self._wire, spans))
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE
