"""A minimal OTLP trace receiver for tests, built from `opentelemetry-proto`: OTLP/HTTP (POST /v1/traces with a
protobuf ExportTraceServiceRequest) and, where grpcio is installed, OTLP/gRPC (TraceService.Export).

Both bind 127.0.0.1 on a free port and decode every request into ReceivedSpan values. A span is stored before
the receiver answers, so once the exporter's force_flush returns the spans are here: no polling needed.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TRACES_PATH = "/v1/traces"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: str  # "SPAN_KIND_SERVER", ...
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[ReceivedLink, ...]
    resource: dict[str, Any]
    scope: str


def decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(), kind=Span.SpanKind.Name(span.kind),
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes=_attributes(span.attributes),
                    links=tuple(ReceivedLink(link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
                                for link in span.links),
                    resource=resource, scope=scope_spans.scope.name,
                ))
    return spans


class SpanStore:
    """Thread-safe list of what arrived, plus the transport details the tests check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.content_types: list[str] = []
        # Tests set `refuse` to the answers the next attempts get instead of success (HTTP status codes for the
        # HTTP receiver, grpc.StatusCode values for the gRPC one); `attempts` keeps each attempt's headers/metadata.
        self.refuse: list[Any] = []
        self.attempts: list[dict[str, str]] = []

    def attempt(self, headers: dict[str, str]) -> Any:
        """Record an attempt; the refusal it is to get, or None to accept it."""
        with self._lock:
            self.attempts.append(headers)
            return self.refuse.pop(0) if self.refuse else None

    def add(self, request: ExportTraceServiceRequest, content_type: str = "") -> None:
        with self._lock:
            self._spans.extend(decode(request))
            self.requests += 1
            self.content_types.append(content_type)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:  # the name BaseHTTPRequestHandler calls
        if self.path != TRACES_PATH:
            self._answer(404, b"")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        refusal = self.server.store.attempt({key.lower(): value for key, value in self.headers.items()})
        if refusal is not None:
            self._answer(refusal, b"")
            return
        encoding = self.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        content_type = self.headers.get("Content-Type", "")
        if content_type != "application/x-protobuf":
            self._answer(415, b"")
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.store.add(request, content_type)
        self._answer(200, ExportTraceServiceResponse().SerializeToString())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: SpanStore) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store


@dataclass
class Receiver:
    endpoint: str  # the base address to give glassbox's otlp_endpoint
    store: SpanStore

    def spans(self) -> list[ReceivedSpan]:
        return self.store.spans()


@contextmanager
def http_receiver() -> Iterator[Receiver]:
    store = SpanStore()
    server = _HttpServer(store)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http-receiver", daemon=True)
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}", store)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def grpc_available() -> bool:
    try:
        import grpc  # noqa: F401
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def grpc_receiver() -> Iterator[Receiver]:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    store = SpanStore()

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
            refusal = store.attempt(dict(context.invocation_metadata()))
            if refusal is not None:
                context.abort(refusal, "refused by the test")
            store.add(request, "application/grpc")
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield Receiver(f"http://127.0.0.1:{port}", store)
    finally:
        server.stop(grace=None).wait(10)


# The receivers by OTLP protocol name (the `otlp_protocol` setting's values).
RECEIVERS: dict[str, Callable[[], AbstractContextManager[Receiver]]] = {
    "http/protobuf": http_receiver, "grpc": grpc_receiver}
