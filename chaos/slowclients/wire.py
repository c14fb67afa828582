"""The bytes a slow client sends, and an incremental reader of the HTTP/1.1 answers it gets back.

The requests are built by hand on purpose: an HTTP library would finish the header block, send the body as fast as
the socket allows and read answers as they come, which is exactly what an attacker does not do. The answers are
read with llhttp, like the load generator's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import count

import httptools

from glassbox.chaos.slowclients.config import SlowClientConfig

USER_AGENT = "glassbox-chaos-slowclient"
_WORDS = "a slow client keeps this connection open for as long as the server lets it "


def _head(config: SlowClientConfig, extra: str = "") -> str:
    return (f"POST {config.request_path} HTTP/1.1\r\nHost: {config.host_header}\r\nUser-Agent: {USER_AGENT}\r\n"
            f"Content-Type: application/json\r\n{extra}")


class ByteStream:
    """An endless (or finite) byte source handed out a few bytes at a time."""

    def __init__(self, parts: Iterator[bytes]) -> None:
        self._parts = parts
        self._buffer = b""
        self.exhausted = False

    def take(self, n: int) -> bytes:
        while len(self._buffer) < n and not self.exhausted:
            part = next(self._parts, None)
            if part is None:
                self.exhausted = True
            else:
                self._buffer += part
        chunk, self._buffer = self._buffer[:n], self._buffer[n:]
        return chunk

    @property
    def done(self) -> bool:
        return self.exhausted and not self._buffer


def endless_header_block(config: SlowClientConfig) -> ByteStream:
    """A request line and header lines forever; the blank line that would end the block never comes."""

    def parts() -> Iterator[bytes]:
        yield _head(config).encode()
        for n in count():
            yield f"X-Slow-{n}: {'k' * 24}\r\n".encode()

    return ByteStream(parts())


def body_request_head(config: SlowClientConfig) -> bytes:
    """A complete header block promising `declared_body_bytes` of body (keep-alive: only the server may end it)."""
    return _head(config, f"Content-Length: {config.declared_body_bytes}\r\n\r\n").encode()


def padded_body(size: int) -> ByteStream:
    """A valid classify body of exactly `size` bytes, so a body the server does wait for gets a real answer."""
    opening, closing = b'{"text": "', b'"}'
    filler = size - len(opening) - len(closing)
    words = _WORDS.encode()
    text = (words * (filler // len(words) + 1))[:filler]
    return ByteStream(iter((opening, text, closing)))


def pipelined_request(config: SlowClientConfig) -> bytes:
    """One complete keep-alive request with several texts, so each answer is many bytes for the reader to stall on."""
    texts = [f"{_WORDS.strip()} {i}" for i in range(config.texts_per_request)]
    body = json.dumps({"texts": texts}).encode()
    return _head(config, f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class ResponseScanner:
    """Feeds on what the server sends and counts the answers in it, parsed by llhttp (httptools), the parser the load
    generator reads its answers with (chaos/loadgen/http1.py).

    A status is recorded as soon as its status code has been read (a 408 followed by a close is counted even if the
    rest of its head never arrives). Answers are followed across a pipelined stream, framed by Content-Length or
    chunked; an answer with neither (its body runs to the close), or bytes that are not HTTP, end the counting
    (`lost_framing`), since nothing after it can be told apart."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.completed = 0  # answers whose body has been fully received
        self.lost_framing = False
        self._parser = httptools.HttpResponseParser(self)
        self._counted = False  # the current answer's status is in `statuses`
        self._framed = False  # the current answer's head says how long its body is

    def feed(self, data: bytes) -> None:
        if self.lost_framing:
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.lost_framing = True

    # --- parser callbacks (llhttp calls them while feed_data runs) ---------------------------------------------------
    def on_message_begin(self) -> None:
        self._counted = self._framed = False

    def on_status(self, status: bytes) -> None:
        self._count()  # the code is parsed before its reason phrase; a phrase split across reads calls this again

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._count()  # a status line without a reason phrase
        status = self._parser.get_status_code()
        if not self._framed and status >= 200 and status not in (204, 304):
            self.lost_framing = True  # its body is everything until the server closes

    def on_message_complete(self) -> None:
        self.completed += 1

    def _count(self) -> None:
        if not self._counted:
            self._counted = True
            self.statuses.append(self._parser.get_status_code())
