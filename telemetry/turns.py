"""TurnHold: what an observer holds back during one turn of the event loop and writes once at the turn's end.

The server observes the requests answered in one turn together (glassbox.service.observer.TurnBuffered); an
observer with a TurnHold collects their log lines or metric increments in a plain list or dict meanwhile and writes
them in one go when the block ends. Only the thread that opened the block holds: another thread (the engine thread,
a bulk job) writes straight through, and a block opened inside another changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class TurnHold(Generic[_T]):
    """`make` gives an empty holding (a list, a dict), `flush` writes a non-empty one."""

    __slots__ = ("_flush", "_make", "held", "thread")

    def __init__(self, make: Callable[[], _T], flush: Callable[[_T], None]) -> None:
        self._make = make
        self._flush = flush
        self.held: _T | None = None  # what the open block holds, and the thread that opened it
        self.thread = 0

    def current(self) -> _T | None:
        """What this thread's open block holds, to add to; None when this thread has none open (write through)."""
        return self.held if self.thread == threading.get_ident() else None

    def block(self) -> _Block[_T]:
        return _Block(self)


class _Block(Generic[_T]):
    """One turn's block: a plain object rather than a generator context manager (one is opened every turn)."""

    __slots__ = ("_hold", "_mine")

    def __init__(self, hold: TurnHold[_T]) -> None:
        self._hold = hold
        self._mine: _T | None = None

    def __enter__(self) -> None:
        hold = self._hold
        if hold.held is not None:  # inside another block: that one writes
            return
        self._mine = hold.held = hold._make()
        hold.thread = threading.get_ident()

    def __exit__(self, *exc_info: object) -> None:
        mine = self._mine
        if mine is None:
            return
        hold = self._hold
        hold.held, hold.thread, self._mine = None, 0, None
        if mine:  # nothing held (a turn of fast answers writes no log line): nothing to write
            hold._flush(mine)
