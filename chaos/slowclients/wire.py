"""The bytes a slow client sends, and a small incremental reader of the HTTP/1.1 answers it gets back.

Built by hand on purpose: an HTTP library would finish the header block, send the body as fast as the socket allows
and read answers as they come, which is exactly what an attacker does not do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import count

from chaos.slowclients.config import SlowClientConfig

USER_AGENT = "glassbox-chaos-slowclient"
_MAX_HEAD_BYTES = 64 * 1024  # an answer head longer than this is not something we can frame; stop counting there
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
    """Feeds on what the server sends and counts the answers in it.

    A status is recorded as soon as its status line is complete (a 408 followed by a close is counted even if the
    rest of its head never arrives). Answers framed by Content-Length are followed across a pipelined stream; a
    chunked or unframed answer ends the counting (`lost_framing`), since nothing after it can be told apart."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.completed = 0  # answers whose body has been fully received
        self.lost_framing = False
        self._buffer = bytearray()
        self._state = "status"  # status -> head -> body -> status ...
        self._remaining = 0
        self._no_body = False

    def feed(self, data: bytes) -> None:
        if self.lost_framing:
            return
        self._buffer += data
        while self._step():
            pass

    def _step(self) -> bool:
        if self._state == "status":
            end = self._buffer.find(b"\r\n")
            if end < 0:
                return self._overflowed()
            line = bytes(self._buffer[:end])
            status = _status_of(line)
            if status is None:
                self.lost_framing = True
                return False
            self.statuses.append(status)
            self._no_body = status < 200 or status in (204, 304)
            del self._buffer[: end + 2]
            self._state = "head"
            return True
        if self._state == "head":
            end = self._buffer.find(b"\r\n\r\n")
            if self._buffer.startswith(b"\r\n"):  # a head with no header lines at all
                end = -2
            elif end < 0:
                return self._overflowed()
            fields = bytes(self._buffer[: max(end, 0)]).decode("latin-1").split("\r\n")
            del self._buffer[: end + 4]
            length = _content_length(fields)
            if self._no_body:
                length = 0
            if length is None:
                self.lost_framing = True
                return False
            self._remaining, self._state = length, "body"
            return True
        take = min(self._remaining, len(self._buffer))
        del self._buffer[:take]
        self._remaining -= take
        if self._remaining:
            return False
        self.completed += 1
        self._state = "status"
        return bool(self._buffer)

    def _overflowed(self) -> bool:
        if len(self._buffer) > _MAX_HEAD_BYTES:
            self.lost_framing = True
        return False


def _status_of(line: bytes) -> int | None:
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        return None
    return int(parts[1])


def _content_length(fields: list[str]) -> int | None:
    length: int | None = None
    for field in fields:
        name, _, value = field.partition(":")
        name = name.strip().lower()
        if name == "transfer-encoding":
            return None
        if name == "content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
    return length
