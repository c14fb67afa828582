"""Length-prefixed frames over a stream socket, as an asyncio Protocol: the byte pipe between processes.

A frame is a u32 little-endian payload length and the payload (one msgpack-encoded message). The protocol keeps
what it has received in one bytearray and hands every complete frame to `on_frame` as a memoryview-free `bytes`,
in order. Frames sent during one turn of the event loop leave together, in one write at the end of the turn: under
load a worker sends several requests' frames a turn and the engine answers a whole batch in one, and each write is
a system call. Both ends of the engine link use it: the engine process as the server, every HTTP worker as a
client.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

_HEADER = struct.Struct("<I")
MAX_FRAME = 256 * 1024 * 1024  # a frame larger than this is a broken peer, not a big request


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol; the connection is closed."""


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls `on_frame(payload)` for each complete frame and `on_lost(exc)` once when the connection ends.

    A BufferedProtocol: the event loop reads straight into our buffer, so a large frame is not copied chunk by chunk
    into an intermediate bytes object."""

    def __init__(self, on_frame: Callable[[bytes], None], on_lost: Callable[[Exception | None], None],
                 on_made: Callable[[FrameProtocol], None] | None = None) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._on_made = on_made
        self._buffer = bytearray(64 * 1024)
        self._view = memoryview(self._buffer)
        self._filled = 0  # bytes of _buffer holding received data
        self._outgoing: list[bytes] = []  # frames sent in this turn of the loop, headers and payloads, not yet written
        self._loop: asyncio.AbstractEventLoop | None = None
        self.transport: asyncio.Transport | None = None

    # -- asyncio.BufferedProtocol --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._loop = asyncio.get_running_loop()
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._filled < 4096:
            self._grow(self._filled + max(sizehint, 4096))
        return self._view[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        start = 0
        while self._filled - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer, start)
            if size > MAX_FRAME:
                self._fail(FrameError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit"))
                return
            end = start + _HEADER.size + size
            if end > self._filled:
                break
            self._on_frame(bytes(self._view[start + _HEADER.size:end]))
            start = end
        if start:  # keep the partial frame, if any, at the front
            remaining = self._filled - start
            self._buffer[:remaining] = self._view[start:self._filled]
            self._filled = remaining
        if self._filled >= _HEADER.size:  # make room for the whole frame being received
            self._grow(_HEADER.size + _HEADER.unpack_from(self._buffer, 0)[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    # -- sending ---------------------------------------------------------------------------------------------------
    def send(self, payload: bytes) -> bool:
        """Queue one frame, written with the others of this turn of the event loop; False when the connection is
        already gone. Called from the event loop's thread only."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        outgoing = self._outgoing
        if not outgoing:
            cast(asyncio.AbstractEventLoop, self._loop).call_soon(self._flush)
        outgoing.append(_HEADER.pack(len(payload)))
        outgoing.append(payload)
        return True

    def flush(self) -> None:
        """Write what was sent so far now, not at the end of this turn (a caller that already gathered a turn's
        frames saves the loop a turn)."""
        self._flush()

    def close(self) -> None:
        if self.transport is not None:
            self._flush()  # what was sent before the close still goes (the transport writes its buffer, then closes)
            self.transport.close()

    # -- internals -------------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        transport = self.transport
        if outgoing and transport is not None and not transport.is_closing():
            transport.write(b"".join(outgoing))  # one system call when the socket has room

    def _lost(self, exc: Exception | None) -> None:
        callback, self._on_lost = self._on_lost, _ignore
        self.transport = None
        callback(exc)

    def _fail(self, exc: FrameError) -> None:
        self._filled = 0
        if self.transport is not None:
            self.transport.abort()
        self._lost(exc)

    def _grow(self, size: int) -> None:
        if size <= len(self._buffer):
            return
        # A new buffer rather than a resize: the loop may still hold a view of the old one.
        bigger = bytearray(max(size, 2 * len(self._buffer)))
        bigger[:self._filled] = self._view[:self._filled]
        self._buffer, self._view = bigger, memoryview(bigger)


def _ignore(_exc: Exception | None) -> None:
    pass
