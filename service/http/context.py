"""Per-request helpers of the HTTP layer: request ids, deadlines, disconnect watching, error bodies, Server-Timing."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from glassbox.service.errors import GlassboxError, InvalidRequestError, RetryableError, UnauthorizedError, status_for
from glassbox.service.http.guard import ABORTED, PEER, WATCH_DISCONNECT
from glassbox.service.observer import HttpInfo, Observer, RequestRecord, SpanOpener, milliseconds

T = TypeVar("T")
log = logging.getLogger("glassbox")

FRAMES_CONTENT_TYPE = "application/x-glassbox-frames"
MAX_REQUEST_ID = 128
KSERVE_PREFIX = "/v2"


class ClientDisconnected(Exception):
    """The client went away while its request waited for the engine."""


def speaks_kserve(path: str) -> bool:
    """Whether `path` belongs to the KServe v2 / Open Inference Protocol routes, whose clients (tritonclient, KServe)
    read errors as the protocol defines them."""
    return path == KSERVE_PREFIX or path.startswith(KSERVE_PREFIX + "/")


def error_body(error: GlassboxError, path: str = "") -> dict[str, object]:
    """glassbox's own `{"error": {"code", "message"}}`; on the /v2 routes the protocol's `{"error": "message"}`."""
    if speaks_kserve(path):
        return {"error": error.message}
    return {"error": {"code": error.code, "message": error.message}}


def error_response(error: GlassboxError, request_id: str = "", path: str = "") -> JSONResponse:
    """The answer to `error` on the route at `path` (which picks the body's shape: see error_body)."""
    headers = {"X-Request-Id": request_id} if request_id else {}
    if isinstance(error, RetryableError):
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    elif isinstance(error, UnauthorizedError):
        headers["WWW-Authenticate"] = error.challenge  # RFC 9110: a 401 names the scheme it wants
    return JSONResponse(error_body(error, path), status_for(error), headers)


def http_info(request: Request) -> HttpInfo:
    """The connection and headers of `request` that the server span's HTTP attributes come from, as the ASGI scope
    has them; read when the span is built, not here."""
    scope, headers = request.scope, request.headers
    client = scope.get("client")
    return HttpInfo(scope["path"], scope.get("query_string", b"").decode("latin-1"), scope.get("scheme", "http"),
                    scope.get("http_version", "1.1"), client, scope.get("server"), headers.get("host"),
                    headers.get("user-agent"), scope.get("extensions", {}).get(PEER, client))


def request_id_of(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    # ASCII only: headers arrive decoded as Latin-1, so a UTF-8 id would go on, garbled, into logs, spans and exemplars.
    if given and len(given) <= MAX_REQUEST_ID and given.isascii() and given.isprintable():
        return given
    # 128 random bits from the `random` module, as OpenTelemetry's id generator draws trace ids: an id must be
    # unique, not unguessable, and uuid4 reads the kernel's random source on every call (a system call that took
    # ~5% of the event loop's samples under load on this project's VM).
    return f"{random.getrandbits(128):032x}"


def deadline_of(request: Request, default_ms: int, start_ns: int) -> int:
    raw = request.headers.get("x-request-timeout-ms")
    if raw is None:
        return start_ns + default_ms * 1_000_000
    try:
        timeout_ms = float(raw)
    except ValueError:
        raise InvalidRequestError(f"X-Request-Timeout-Ms must be a number of milliseconds, got {raw[:40]!r}") from None
    if not 0 < timeout_ms <= 3_600_000:
        raise InvalidRequestError(
            f"X-Request-Timeout-Ms must be more than 0 and at most 3600000 (ms), got {raw[:40]!r}")
    return start_ns + int(timeout_ms * 1_000_000)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but stop waiting (cancelling it, so queued items are dropped) if the client disconnects first.

    The work runs in the caller's own task. Under the guard's protocol (service/http/guard.py, how glassbox always
    serves) the connection itself cancels the caller when the client leaves; under another ASGI server a small
    watcher task waits for `http.disconnect` on receive() instead."""
    current = asyncio.current_task()
    assert current is not None
    watch = request.scope.get("extensions", {}).get(WATCH_DISCONNECT)
    if watch is None:
        return await _until_disconnect_received(request, work, current)
    gone: list[bool] = []

    def left() -> None:
        gone.append(True)
        current.cancel()

    unwatch = watch(left)
    if unwatch is None:  # the client has left already: the work is not started
        if asyncio.iscoroutine(work):
            work.close()
        raise ClientDisconnected()
    try:
        return await work
    except asyncio.CancelledError:
        # Ours, and no other cancellation pending (uncancel() counts what is left): the client left.
        if gone and current.uncancel() == 0:
            raise ClientDisconnected() from None
        raise
    finally:
        unwatch()


async def _until_disconnect_received(request: Request, work: Awaitable[T], current: asyncio.Task[Any]) -> T:
    """until_disconnect by a watcher task. (Wrapping the work in a second task and racing the two with asyncio.wait
    cost ~10% of a request's CPU.)"""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        # Cancelled by the watcher, and no other cancellation pending: the client left.
        if watcher.done() and not watcher.cancelled() and current.uncancel() == 0:
            raise ClientDisconnected() from None
        raise
    finally:
        watcher.cancel()


def server_timing(record: RequestRecord) -> str:
    return ", ".join(f"{span.name};dur={milliseconds(span.end_ns - span.start_ns):.3f}" for span in record.stages)


def observe_answer(observer: Observer, request: Request, response: Response, *, route: str, code: str,
                   start_ns: int, wall_ns: int, request_id: str, timed: bool = False) -> Response:
    """`response`, an answer given outside the classify path (no route, a refused API key, a bug), with its request
    recorded as classify records one: its HTTP attributes and tracestate for the server span, and, when it was
    traced, the `traceresponse` header that names that span (made in on_request, so asked for after it). `timed`
    adds X-Latency-ms, as every answer of an inference route carries (a 401 of one included)."""
    headers = request.headers
    traceparent = headers.get("traceparent")
    record = RequestRecord(request_id=request_id, route=route, method=request.method, status=response.status_code,
                           error_code=code, start_ns=start_ns, end_ns=time.perf_counter_ns(),
                           traceparent=traceparent, wall_start_ns=wall_ns,
                           tracestate=headers.get("tracestate") if traceparent is not None else None,
                           http=http_info(request))
    if timed:
        response.headers["X-Latency-ms"] = latency_ms(record)
    try:
        observer.on_request(record)
        if isinstance(observer, SpanOpener):
            value = observer.trace_response(record)
            if value:
                response.headers["traceresponse"] = value
    except Exception:  # telemetry must never turn an answer into a 500
        log.exception("observer on_request failed")
    return response


def latency_ms(record: RequestRecord) -> str:
    """The X-Latency-ms value: the request's duration as its log line gives it."""
    return f"{milliseconds(record.end_ns - record.start_ns):.3f}"


def disconnected_answer(request: Request) -> tuple[int, str]:
    """(status, error code) to record for a request whose client, as the app sees it, went away: the protocol guard's
    own answer when the guard cut the request short (408 for a body past its deadline, 413 for one over the cap),
    else 499 `client_disconnected`."""
    aborted = request.scope.get("extensions", {}).get(ABORTED)
    return aborted if aborted is not None else (499, "client_disconnected")
