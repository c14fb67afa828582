"""What happened, as data: the records stage code hands to an Observer, and the do-nothing default.

`telemetry/` implements Observer with Prometheus, OpenTelemetry and logs; `service/` never imports it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from glassbox.service.types import EngineTiming, FloatArray, IntArray

STAGES = ("parse", "tokenize", "queue", "infer", "postprocess")
UNMATCHED_ROUTE = "unmatched"  # the route of a request no route took (404, 405): recorded, so every request shows


def milliseconds(ns: int) -> float:
    """`ns` in milliseconds to the microsecond, truncated (integer arithmetic, cheaper than round() on floats): the
    one conversion behind every duration a request's answer and its log line print (Server-Timing, X-Latency-ms,
    `duration_ms`, `stages_ms`), so that they show the same digits for the same interval."""
    return ns // 1000 / 1000


@dataclass(frozen=True, slots=True)
class StageSpan:
    name: str  # one of STAGES
    start_ns: int  # perf_counter_ns
    end_ns: int

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class SpanRef:
    """A request's server span, named when the request starts: its batch spans link to it, in whatever process
    the batch runs. W3C hex ids."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    sampled: bool  # True: kept whatever the outcome (a sampled parent, the ratio); False: kept only for its outcome


@dataclass(frozen=True, slots=True)
class HttpInfo:
    """What the connection and headers say about a request, as the ASGI scope had it (for the server span's HTTP
    attributes): copied by reference, interpreted only when the span is built."""

    path: str  # the request's path, as received (url.path)
    query: str  # its query string, "" without one
    scheme: str  # "http" | "https"
    version: str  # the HTTP version: "1.1", "2"
    client: tuple[str, int] | None  # the client's (address, port): behind a trusted proxy, the one it forwarded
    server: tuple[str, int | None] | None  # the listening (address, port)
    host: str | None = None  # the Host header
    user_agent: str | None = None
    peer: tuple[str, int] | None = None  # the connection's own peer (the proxy, behind one); None: the client


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    route: str  # the route template, never the raw path
    method: str
    status: int
    error_code: str | None
    start_ns: int  # perf_counter_ns when the request reached the app
    end_ns: int
    stages: tuple[StageSpan, ...] = ()
    texts: int = 0
    tokens: int = 0
    max_tokens: int = 0  # longest text, in tokens: the input-length bucket
    truncated: int = 0
    device: str = ""
    engine_mode: str = ""  # graph | eager | mixed | ""
    batch_ids: tuple[int, ...] = ()
    traceparent: str | None = None
    wall_start_ns: int = 0  # time.time_ns() at start, for exporters that need wall-clock times
    attributes: dict[str, str] = field(default_factory=dict)
    span: SpanRef | None = None  # the server span named at the start (SpanOpener), None when none was
    tracestate: str | None = None  # the W3C tracestate header, passed on with traceparent
    http: HttpInfo | None = None
    batch_spans: tuple[SpanRef, ...] = ()  # the span of each batch it rode in, where one was named (by batch id)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class BatchRecord:
    batch_id: int
    timing: EngineTiming
    request_ids: tuple[str, ...]
    queue_depth_after: int
    spans: tuple[SpanRef | None, ...] = ()  # the server span of each request in request_ids, where one was named
    span: SpanRef | None = None  # the batch's own span, named before its answers went out (SpanOpener.open_batch)
    logits: FloatArray | None = None  # [rows, labels] what the model answered, the batcher's own copy (read only)
    lengths: IntArray | None = None  # [rows] each row's tokens, special tokens included


@dataclass(frozen=True, slots=True)
class FallbackEvent:
    """A change of the device that serves: to the CPU fallback (active=True) or back to the primary."""

    active: bool
    reason: str  # "oom" | "memory_pressure" | "cuda_error" | "probe_failed" | "recovered" | ...
    device: str  # the device serving from now on
    wall_time_ns: int = 0


class Observer(Protocol):
    def on_request(self, record: RequestRecord) -> None: ...

    def on_batch(self, record: BatchRecord) -> None: ...

    def on_rejected(self, reason: str) -> None: ...

    def on_dropped(self, reason: str, items: int) -> None: ...

    def on_aborted(self, reason: str) -> None: ...

    def on_fallback(self, event: FallbackEvent) -> None: ...


@runtime_checkable
class SpanOpener(Protocol):
    """An observer that names spans before what they describe is recorded (tracing does): a request's server span
    when the request starts, so the batches it rides in can link to it; a batch's span before its answers go out,
    so the requests in it can link back; and, once the request has its outcome, the W3C `traceresponse` header
    value of its server span (the server asks before on_request for a span it opened, after it for one it did not)."""

    def open_request(self, traceparent: str | None, tracestate: str | None = None) -> SpanRef | None: ...

    def open_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef | None: ...

    def trace_response(self, record: RequestRecord) -> str | None: ...


@runtime_checkable
class TurnBuffered(Protocol):
    """An observer that can hold what it writes for the records of one turn of the event loop and write it at once
    when the turn's records are all observed (the request log: one write for the lines of a batch's answers)."""

    def buffered(self) -> AbstractContextManager[None]: ...


class NullObserver:
    """The default: records go nowhere, so the service runs and is tested without telemetry."""

    def on_request(self, record: RequestRecord) -> None:
        pass

    def on_batch(self, record: BatchRecord) -> None:
        pass

    def on_rejected(self, reason: str) -> None:
        pass

    def on_dropped(self, reason: str, items: int) -> None:
        pass

    def on_aborted(self, reason: str) -> None:
        pass

    def on_fallback(self, event: FallbackEvent) -> None:
        pass
