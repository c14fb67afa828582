"""A lean HTTP/1.1 keep-alive client connection: one request at a time, requests pre-rendered to bytes.

Why not httpx: measured on the 2-core development machine against a glassbox server, an httpx.AsyncClient POST
cost 1.3 ms of client CPU per request, against 0.08 ms for the same request over asyncio streams. A load
generator shares the machine with what it measures, and under the httpx version the server's throughput came out
26% and 39% below wrk's. See docs/benchmarks/2026-11-30-loadgen-vs-wrk-hey.md, "Load generator vs wrk and hey".

So the request side is ours (rendering a POST is one f-string) and the response side is llhttp, through httptools
(the parser uvicorn serves with): bytes go from an asyncio.Protocol straight into it, and its callbacks settle the
waiting request. What llhttp decides: the status line, header syntax, and where the body ends (Content-Length,
chunked with extensions and trailers, or the end of the connection). What this module adds: 1xx interim answers
are skipped, `Connection: close` and HTTP/1.0 end the connection after the response, and a connection the server
closed, that broke, or that carries bytes nobody asked for is replaced before the next request. No redirects, no
proxies, no compression, no retries: a load generator should see the server's answers as they are, and retrying a
request would hide exactly the failures chaos runs look for.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

HEAD_LIMIT = 64 * 1024  # the longest response head accepted
IDLE_RECONNECT_S = 4.0  # reconnect before reusing a connection idle this long (uvicorn closes idle ones at 5 s)
VERSIONS = ("1.1", "1.0")  # llhttp also takes HTTP/0.9 and HTTP/2.0 status lines (and RTSP/ICE ones, not told apart)


class ConnectFailed(Exception):
    """The connection could not be opened (refused, unreachable, name not resolved, TLS handshake failed)."""


class TransportFailed(Exception):
    """The connection broke, or the answer was not HTTP/1.x, while a request was being sent or read."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    host_header: str
    base_path: str  # "" or a prefix such as "/glassbox", prepended to request paths

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"target must be an http:// or https:// URL with a host, got {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"))

    def render_post(self, path: str, content_type: str, body: bytes) -> bytes:
        """A whole POST request, head and body, ready to write."""
        head = (f"POST {self.base_path}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nUser-Agent: glassbox-bench\r\n\r\n")
        return head.encode("latin-1") + body


class Http1Connection:
    """Opens on first use and again after the server closed it; `request` returns the status once the whole
    response has been read. Any failure, cancellation included, closes the connection: its state is unknown."""

    def __init__(self, endpoint: Endpoint, tls_context: ssl.SSLContext | None = None) -> None:
        self.endpoint = endpoint
        self._tls = tls_context if tls_context is not None else (
            ssl.create_default_context() if endpoint.tls else None)
        self._wire: _Wire | None = None
        self._idle_since = 0.0
        self.opened = 0  # connections opened so far, for tests and diagnostics
        self.retry_after_s: float | None = None  # the last response's Retry-After in seconds (None: none sent)

    @property
    def peer_closed(self) -> bool:
        """The server has closed the open connection (the next request will open a new one)."""
        return self._wire is not None and self._wire.closed

    async def request(self, raw: bytes) -> int:
        self.retry_after_s = None
        wire = await self._ready()
        try:
            status = await wire.send(raw)
        except BaseException:
            self.close()
            raise
        if wire.retry_after:
            self.retry_after_s = retry_after_seconds(wire.retry_after)
        if wire.reusable:
            self._idle_since = time.monotonic()
        else:
            self.close()
        return status

    async def _ready(self) -> _Wire:
        wire = self._wire
        if wire is not None:
            # A connection the server already closed (its FIN has arrived) or is about to close for idleness
            # would fail the request through no fault of the server's: open a fresh one instead.
            if wire.reusable and time.monotonic() - self._idle_since < IDLE_RECONNECT_S:
                return wire
            self.close()
        e = self.endpoint
        try:
            _transport, wire = await asyncio.get_running_loop().create_connection(
                _Wire, e.host, e.port, ssl=self._tls, server_hostname=e.host if self._tls else None)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{e.host}:{e.port}: {exc}") from exc
        self._wire = wire
        self.opened += 1
        return wire

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
        self._wire = None


def retry_after_seconds(value: bytes) -> float | None:
    """A Retry-After header's delay in seconds; None for the HTTP-date form or anything unreadable."""
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class _Wire(asyncio.Protocol):
    """One open connection. Received bytes are fed to llhttp as they arrive; its callbacks (the on_* methods,
    which must not raise: llhttp would replace the error with its own) settle the future `send` returned."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[int] | None = None
        self.closed = False  # the server closed the connection, or it broke
        self._spent = False  # the stream can carry no further exchange: Connection: close, 101, bytes out of turn
        self._head_done = False  # of the response being read (a 1xx answer's head counts until the next begins)
        self._framed = False  # it has Content-Length or chunked, so the end of the connection is not its end
        self._received = 0  # bytes since the request was sent, checked against HEAD_LIMIT until a head ends
        self.retry_after = b""  # the last response's Retry-After header, as sent

    @property
    def reusable(self) -> bool:
        return not (self.closed or self._spent) and self._transport is not None and not self._transport.is_closing()

    def send(self, raw: bytes) -> asyncio.Future[int]:
        transport = self._transport
        assert transport is not None, "create_connection returns after connection_made"
        assert self._waiter is None or self._waiter.done(), "one request at a time"
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        self._head_done = self._framed = False
        self._received = 0
        self.retry_after = b""
        # No drain: with one request in flight at a time the write buffer never holds more than one request.
        transport.write(raw)
        return waiter

    def close(self) -> None:
        self._spent = True
        if self._transport is not None:
            self._transport.close()

    def _fail(self, why: str) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TransportFailed(why))
        self.close()

    # --- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._fail("bytes arrived with no request outstanding")  # e.g. a 408 sent before closing an idle one
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._spent = True  # after a 101 the stream speaks another protocol; on_message_complete settled it
        except httptools.HttpParserError as exc:
            self._fail(f"not a valid HTTP/1.x response: {exc}")
            return
        if not self._head_done and not waiter.done():
            self._received += len(data)
            if self._received > HEAD_LIMIT:
                self._fail(f"no end of the response head within {HEAD_LIMIT} bytes")

    def eof_received(self) -> bool | None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._head_done and not self._framed:
                waiter.set_result(self._parser.get_status_code())  # the body ran to the end of the connection
            else:
                self._fail("the server closed the connection " + (
                    "mid-body" if self._head_done else "before a whole response head"))
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"connection lost: {exc}" if exc else "connection lost")

    # --- llhttp callbacks ------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._waiter is None or self._waiter.done():
            self._spent = True  # a second response behind the one asked for: the stream is out of step

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:
            return  # a chunked body's trailer
        name = name.lower()
        if name == b"content-length":
            self._framed = True
        elif name == b"retry-after":
            self.retry_after = value
        elif name == b"transfer-encoding":
            # Only a final chunked coding frames the body; llhttp reads any other to the end of the connection.
            self._framed = value.rstrip().lower().endswith(b"chunked")

    def on_headers_complete(self) -> None:
        self._head_done = True
        if self._parser.get_http_version() not in VERSIONS:
            self._fail(f"not an HTTP/1.x response (version {self._parser.get_http_version()})")

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._head_done = self._framed = False  # an interim answer; the real one follows
            return
        if not self._parser.should_keep_alive():
            self._spent = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(status)
