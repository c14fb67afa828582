"""Hands due requests to worker coroutines: the most recently idle worker first, a FIFO line when none is idle.

Most-recently-idle first keeps the work on a few hot keep-alive connections at low rates, instead of rotating
through every connection until each one sits idle long enough for the server to close it. The line itself is
FIFO, so requests are sent in the order they fell due.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Dispatcher(Generic[T]):
    def __init__(self) -> None:
        self._line: deque[T] = deque()
        self._idle: list[asyncio.Future[T | None]] = []
        self._closed = False

    def __len__(self) -> int:
        """Items waiting for a worker."""
        return len(self._line)

    def put(self, item: T) -> None:
        while self._idle:
            waiter = self._idle.pop()
            if not waiter.done():  # a worker cancelled while idle leaves a cancelled future behind
                waiter.set_result(item)
                return
        self._line.append(item)

    def close(self) -> None:
        """No more items: workers finish the line, then get None."""
        self._closed = True
        while self._idle:
            waiter = self._idle.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> T | None:
        if self._line:
            return self._line.popleft()
        if self._closed:
            return None
        waiter: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        return await waiter
