"""An answer's header block and its body in one write.

uvicorn writes a response's header block and its body with two `transport.write` calls, and uvloop sends each at
once: two system calls and two TCP segments for every answer. On this project's VMs a small write to a loopback TCP
socket costs ~8.5 µs of CPU, and the client wakes for the first segment only to wait for the second. A request's cycle
writes through this object instead: a header block is held back until the next write (the body, which Starlette sends
in the same step) and goes out joined to it. The guard flushes what is held when a response completes (a HEAD answer
writes no body) and before the connection's own writes (its error replies) and a close, keeping the order of bytes on
the wire. A streamed response's headers would wait for its first chunk; glassbox streams none. (Flushing at the end
of the event loop's turn instead, with call_soon, cost an extra turn of the loop per answer: 0.05 ms more CPU per
request in a worker process, measured in docs/benchmarks/2026-12-03-one-write-per-answer.md.)
"""

from __future__ import annotations

import asyncio
from typing import Any

_HEADER_BLOCK = b"HTTP/1.1 "
_INTERIM = b"HTTP/1.1 1"  # 100 Continue: the client waits for it before sending the body, so it is never held


class OneWriteAnswers:
    """The transport as a connection's request cycles see it (one per connection)."""

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held = b""

    def write(self, data: bytes) -> None:
        held = self._held
        if held:
            self._held = b""
            self._transport.write(held + data)
        elif data.startswith(_HEADER_BLOCK) and not data.startswith(_INTERIM):
            self._held = data
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write what is held, if anything (a transport already closing drops it, as it would the write)."""
        held = self._held
        if held:
            self._held = b""
            if not self._transport.is_closing():
                self._transport.write(held)

    def discard(self) -> None:
        self._held = b""

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else a cycle may ask of its transport
        return getattr(self._transport, name)
