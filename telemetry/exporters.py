"""OTLP export of span items (telemetry/spans.py): the request WireEncoder writes, sent over OTLP/HTTP with httpx
(here) or OTLP/gRPC with grpcio (telemetry/exporters_grpc.py), through public interfaces only.

Why not the SDK's OTLP exporters: their public `export()` takes ReadableSpans and encodes them with the SDK's
encoder, which costs about six times the CPU of WireEncoder for glassbox's spans (on the 2-core dev machine, 395
against 61 us a request, building the ReadableSpans included; `docs/benchmarks/2026-12-01-telemetry-export.md`), and
their transport is not public API. So these exporters do what the OTLP specification asks of an exporter
themselves, which is little:

- the same settings as the SDK's: `OTEL_EXPORTER_OTLP_TRACES_{HEADERS,COMPRESSION,CERTIFICATE,CLIENT_KEY,
  CLIENT_CERTIFICATE}`, each falling back to its `OTEL_EXPORTER_OTLP_*` form; the endpoint and the timeout come
  from glassbox's own settings;
- retries of what the specification calls retryable (HTTP 429/502/503/504 and connection errors; gRPC
  UNAVAILABLE, RESOURCE_EXHAUSTED, ...), with exponential back-off and `Retry-After` honoured, until the export's
  timeout, and never once shutdown has begun;
- a batch that holds anything but glassbox's span items (spans made through an SDK tracer) goes through the SDK's
  public encoder instead, so nothing is lost.

`on_failure` (the telemetry setup passes the metrics' export-failure counter) is called once per batch that could
not be delivered, with a short reason.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_CERTIFICATE,
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
    OTEL_EXPORTER_OTLP_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_COMPRESSION,
    OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from glassbox.telemetry.otlpwire import WireEncoder
from glassbox.telemetry.spans import BatchSpans, RequestSpans, readable_spans

log = logging.getLogger("glassbox.telemetry")

COMPRESSIONS = ("none", "gzip", "deflate")
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 32.0
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


def all_items(items: Sequence[Any]) -> bool:
    """Only glassbox's span items (nothing made through an SDK tracer, which glassbox itself does not use)."""
    return all(isinstance(item, RequestSpans | BatchSpans) for item in items)


@dataclass(frozen=True)
class ExportConfig:
    """What the OTEL_EXPORTER_OTLP_[TRACES_]* variables say, read once when the exporter is built."""

    headers: dict[str, str]
    compression: str  # one of COMPRESSIONS
    certificate: str | None  # CA bundle to verify the collector with
    client_key: str | None
    client_certificate: str | None

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> ExportConfig:
        env = os.environ if environ is None else environ

        def pick(signal: str, general: str) -> str | None:
            return env.get(signal) or env.get(general) or None

        headers = {key.lower(): value for key, value in parse_env_headers(
            pick(OTEL_EXPORTER_OTLP_TRACES_HEADERS, OTEL_EXPORTER_OTLP_HEADERS) or "", liberal=True).items()}
        compression = (pick(OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, OTEL_EXPORTER_OTLP_COMPRESSION) or "none")
        compression = compression.strip().lower()
        if compression not in COMPRESSIONS:
            log.warning("unsupported OTLP compression %r: sending uncompressed", compression)
            compression = "none"
        return cls(headers, compression,
                   pick(OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, OTEL_EXPORTER_OTLP_CERTIFICATE),
                   pick(OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, OTEL_EXPORTER_OTLP_CLIENT_KEY),
                   pick(OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE))


@dataclass(frozen=True)
class Attempt:
    """One try at sending a request."""

    ok: bool
    retryable: bool = False
    retry_after_s: float | None = None  # the server's own wait, when it named one
    reason: str = ""


class ItemExporter(SpanExporter):
    """Base of the OTLP exporters of span items: encoding, the retry loop, shutdown. Subclasses send one attempt.

    Called by one BatchSpanProcessor export thread at a time, as the SDK's exporters are."""

    takes_items = True
    protocol = ""

    def __init__(self, wire: WireEncoder, resource: Resource, *, timeout_s: float,
                 on_failure: Callable[[str], None] | None = None) -> None:
        self._wire = wire
        self._resource = resource
        self._timeout_s = timeout_s
        self._on_failure = on_failure
        self._stopping = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopping.is_set():
            log.warning("span export after shutdown: %d items dropped", len(spans))
            return SpanExportResult.FAILURE
        if all_items(spans):
            items: Sequence[Any] = spans
            message = self._wire.message(shape for item in items for shape in item.shapes())
        else:
            message = encode_spans(readable_spans(spans, self._resource))
        reason = self._deliver(self._payload(message))
        if reason is None:
            return SpanExportResult.SUCCESS
        log.warning("OTLP %s span export failed (%d items dropped): %s", self.protocol, len(spans), reason)
        if self._on_failure is not None:
            self._on_failure(reason)
        return SpanExportResult.FAILURE

    def _deliver(self, payload: Any) -> str | None:
        """None once the collector took `payload`, else why it never will."""
        deadline = time.monotonic() + self._timeout_s
        backoff = FIRST_BACKOFF_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timed out"
            attempt = self._attempt(payload, remaining)
            if attempt.ok:
                return None
            if not attempt.retryable or self._stopping.is_set():
                return attempt.reason
            wait = attempt.retry_after_s if attempt.retry_after_s is not None else backoff * random.uniform(0.8, 1.2)
            if time.monotonic() + wait >= deadline:
                return f"{attempt.reason}; no time left to retry"
            if self._stopping.wait(wait):
                return f"{attempt.reason}; shutting down"
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _payload(self, message: ExportTraceServiceRequest) -> Any:
        """What `_attempt` sends, made once per batch whatever the retries."""
        raise NotImplementedError

    def _attempt(self, payload: Any, timeout_s: float) -> Attempt:
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def shutdown(self) -> None:
        self._stopping.set()
        self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is held here: the processor's queue is flushed by the processor


class HttpItemExporter(ItemExporter):
    """OTLP/HTTP with protobuf bodies: POST to `endpoint` (the full /v1/traces URL), one keep-alive connection."""

    protocol = "http/protobuf"

    def __init__(self, wire: WireEncoder, resource: Resource, *, endpoint: str, timeout_s: float,
                 config: ExportConfig | None = None, on_failure: Callable[[str], None] | None = None) -> None:
        import httpx  # here: only processes that export spans pay for the import

        super().__init__(wire, resource, timeout_s=timeout_s, on_failure=on_failure)
        quiet = logging.getLogger("httpx")  # it logs every request at INFO: one line per span export is noise
        if quiet.level == logging.NOTSET:
            quiet.setLevel(logging.WARNING)
        config = config or ExportConfig.from_environ()
        self.endpoint = endpoint
        self.compression = config.compression
        headers = {**config.headers, "content-type": "application/x-protobuf"}
        if config.compression != "none":
            headers["content-encoding"] = config.compression
        cert = ((config.client_certificate, config.client_key) if config.client_certificate and config.client_key
                else config.client_certificate)
        self._httpx = httpx
        self._client = httpx.Client(headers=headers, verify=config.certificate or True, cert=cert,
                                    timeout=timeout_s, follow_redirects=False)

    def _payload(self, message: ExportTraceServiceRequest) -> bytes:
        body: bytes = message.SerializeToString()
        if self.compression == "gzip":
            return gzip.compress(body, compresslevel=6)
        if self.compression == "deflate":
            return zlib.compress(body)
        return body

    def _attempt(self, payload: Any, timeout_s: float) -> Attempt:
        body: bytes = payload
        try:
            response = self._client.post(self.endpoint, content=body, timeout=timeout_s)
        except self._httpx.TransportError as error:
            return Attempt(False, retryable=True, reason=f"{type(error).__name__}: {error}")
        if response.is_success:
            return Attempt(True)
        return Attempt(False, retryable=response.status_code in RETRYABLE_HTTP,
                       retry_after_s=retry_after(response.headers.get("retry-after")),
                       reason=f"HTTP {response.status_code}")

    def _close(self) -> None:
        self._client.close()


def retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header that gives them as a number (the form collectors send)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
