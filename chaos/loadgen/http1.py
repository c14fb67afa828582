"""A lean HTTP/1.1 keep-alive client connection: one request at a time, requests pre-rendered to bytes.

Why not httpx: measured on the 2-core development machine against a glassbox server, an httpx.AsyncClient POST
cost 1.3 ms of client CPU per request, against 0.08 ms for the same request over asyncio streams. A load
generator shares the machine with what it measures, and under the httpx version the server's throughput came out
26% and 39% below wrk's. See docs/benchmarks.md, "Load generator vs wrk and hey".

What it speaks: requests with Content-Length, responses framed by Content-Length, chunked encoding or the end
of the connection; `Connection: close` and HTTP/1.0 end the connection after the response; 1xx interim
responses are skipped. No redirects, no proxies, no compression, no retries: a load generator should see the
server's answers as they are, and retrying a request would hide exactly the failures chaos runs look for.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024  # the longest response head accepted
IDLE_RECONNECT_S = 4.0  # reconnect before reusing a connection idle this long (uvicorn closes idle ones at 5 s)


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
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._idle_since = 0.0
        self.opened = 0  # connections opened so far, for tests and diagnostics

    @property
    def peer_closed(self) -> bool:
        """The server has closed the open connection (the next request will open a new one)."""
        return self._reader is not None and self._reader.at_eof()

    async def request(self, raw: bytes) -> int:
        reader, writer = await self._ready()
        try:
            writer.write(raw)
            await writer.drain()
            status, keep_alive = await _read_response(reader)
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError | asyncio.IncompleteReadError | asyncio.LimitOverrunError | ValueError):
                raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
            raise
        if keep_alive:
            self._idle_since = time.monotonic()
        else:
            self.close()
        return status

    async def _ready(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = self._reader, self._writer
        if reader is not None and writer is not None:
            # A connection the server already closed (its FIN has arrived) or is about to close for idleness
            # would fail the request through no fault of the server's: open a fresh one instead.
            if not reader.at_eof() and not writer.is_closing() and \
                    time.monotonic() - self._idle_since < IDLE_RECONNECT_S:
                return reader, writer
            self.close()
        e = self.endpoint
        try:
            reader, writer = await asyncio.open_connection(
                e.host, e.port, ssl=self._tls, server_hostname=e.host if self._tls else None, limit=HEAD_LIMIT)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{e.host}:{e.port}: {exc}") from exc
        self._reader, self._writer = reader, writer
        self.opened += 1
        return reader, writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns (status, whether the connection may carry another request)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(rest[:3])
        if status >= 200 or status == 101:
            break  # 1xx interim answers (100 Continue, 103 Early Hints) precede the real one
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    connection = headers.get(b"connection", b"")
    keep_alive = b"close" not in connection and (version != b"HTTP/1.0" or b"keep-alive" in connection)
    if status in (204, 304) or 100 <= status < 200:
        return status, keep_alive
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the blank line
                    pass
                return status, keep_alive
            await reader.readexactly(size + 2)
    length = headers.get(b"content-length")
    if length is not None:
        await reader.readexactly(int(length))
        return status, keep_alive
    await reader.read()  # no framing: the body runs to the end of the connection
    return status, False
