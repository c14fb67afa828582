"""OTLP/gRPC export of span items: TraceService.Export through opentelemetry-proto's generated stub on a grpcio
channel. Imported only when the gRPC protocol is asked for (grpcio is heavy). See telemetry/exporters.py for why
this is not the SDK's exporter and which settings it reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource

from glassbox.telemetry.exporters import Attempt, ExportConfig, ItemExporter
from glassbox.telemetry.otlpwire import WireEncoder

# The codes the OTLP specification says a client may retry.
RETRYABLE = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS,
                       grpc.StatusCode.RESOURCE_EXHAUSTED})
_COMPRESSION = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                "deflate": grpc.Compression.Deflate}


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


class GrpcItemExporter(ItemExporter):
    """`endpoint` is `http://host:port` (plaintext) or `https://host:port` (TLS, verified against
    OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE when set, else the system roots)."""

    protocol = "grpc"

    def __init__(self, wire: WireEncoder, resource: Resource, *, endpoint: str, timeout_s: float,
                 config: ExportConfig | None = None, on_failure: Callable[[str], None] | None = None) -> None:
        super().__init__(wire, resource, timeout_s=timeout_s, on_failure=on_failure)
        config = config or ExportConfig.from_environ()
        parts = urlsplit(endpoint)
        target = parts.netloc or parts.path
        compression = _COMPRESSION[config.compression]
        if parts.scheme == "https":
            credentials = grpc.ssl_channel_credentials(_read(config.certificate), _read(config.client_key),
                                                       _read(config.client_certificate))
            self._channel = grpc.secure_channel(target, credentials, compression=compression)
        else:
            self._channel = grpc.insecure_channel(target, compression=compression)
        self._stub = TraceServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = tuple(config.headers.items())

    def _payload(self, message: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
        return message

    def _attempt(self, payload: Any, timeout_s: float) -> Attempt:
        request: ExportTraceServiceRequest = payload
        try:
            self._stub.Export(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
            return Attempt(False, retryable=code in RETRYABLE, reason=f"gRPC {code.name}")
        return Attempt(True)

    def _close(self) -> None:
        self._channel.close()
