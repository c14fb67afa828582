"""FrameProtocol over a real Unix socket pair: frames arrive whole and in order, and the frames of one turn of the
event loop leave in one write."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from glassbox.service.ipc.framing import FrameProtocol

BOUND_S = 10.0


class CountingTransport:
    """Passes everything to the real transport and counts the writes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def pair() -> tuple[FrameProtocol, CountingTransport, list[bytes], asyncio.Event]:
    """A sending protocol whose writes are counted, and what the other end received (set when `lost`)."""
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    received: list[bytes] = []
    lost = asyncio.Event()
    _, sender = await loop.create_unix_connection(lambda: FrameProtocol(lambda _f: None, lambda _e: None), sock=left)
    await loop.create_unix_connection(lambda: FrameProtocol(received.append, lambda _e: lost.set()), sock=right)
    counting = CountingTransport(sender.transport)
    sender.transport = counting  # type: ignore[assignment]
    return sender, counting, received, lost


async def wait_for(received: list[bytes], count: int) -> None:
    async with asyncio.timeout(BOUND_S):
        while len(received) < count:
            await asyncio.sleep(0.001)


def test_frames_of_one_turn_leave_in_one_write_and_arrive_in_order() -> None:
    asyncio.run(one_write_a_turn())


async def one_write_a_turn() -> None:
    sender, counting, received, _ = await pair()
    payloads = [b"first", b"", b"x" * 70_000, b"last"]  # an empty frame, and one larger than the receive buffer
    for payload in payloads:
        assert sender.send(payload)
    assert counting.writes == []  # nothing is written before the turn ends
    await wait_for(received, len(payloads))
    assert received == payloads
    assert len(counting.writes) == 1
    # A later turn writes its own frames.
    assert sender.send(b"again")
    await wait_for(received, len(payloads) + 1)
    assert received[-1] == b"again" and len(counting.writes) == 2
    sender.close()


def test_close_writes_what_was_sent_first() -> None:
    asyncio.run(close_writes_first())


async def close_writes_first() -> None:
    sender, _, received, lost = await pair()
    assert sender.send(b"before the close")
    sender.close()
    assert not sender.send(b"after the close")  # refused: the connection is closing
    async with asyncio.timeout(BOUND_S):
        await lost.wait()
    assert received == [b"before the close"]
