"""CompositeObserver: the fan-out that hands each record to every observer and keeps one broken observer from hurting
the others or the request (a failure is logged sparingly and counted, never raised to the caller)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from glassbox.service.observer import (
    BatchRecord,
    FallbackEvent,
    Observer,
    RequestRecord,
    SpanOpener,
    SpanRef,
    TurnBuffered,
)

HOOKS = ("on_request", "on_batch", "on_rejected", "on_dropped", "on_aborted", "on_fallback", "open_request",
         "open_batch", "trace_response")


class CompositeObserver:
    """Hands every record to each observer in turn. An observer that raises is logged (the 1st, 10th, 100th...
    failure of each hook, so a broken exporter cannot flood the log) and reported to `on_error`; the others still
    run and the caller never sees the exception."""

    def __init__(
        self,
        observers: Sequence[Observer],
        *,
        on_error: Callable[[str], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._on_error = on_error
        self._log = logger or logging.getLogger("glassbox.telemetry")
        self._lock = threading.Lock()
        self._failures: dict[tuple[int, str], int] = {}
        # Bound methods resolved once; an observer without a hook simply does not take part in it.
        self._hooks: dict[str, tuple[tuple[int, Callable[..., None]], ...]] = {
            hook: tuple((i, getattr(o, hook)) for i, o in enumerate(observers) if callable(getattr(o, hook, None)))
            for hook in HOOKS
        }
        self.observers = tuple(observers)
        openers = [(i, o) for i, o in enumerate(observers) if isinstance(o, SpanOpener)]
        # The openers' hooks, bound once: asked for every request and every batch.
        self._opener_hooks: dict[str, tuple[tuple[int, Callable[..., Any]], ...]] = {
            hook: tuple((i, getattr(o, hook)) for i, o in openers)
            for hook in ("open_request", "open_batch", "trace_response")
        }
        self._buffering = tuple((i, o) for i, o in enumerate(observers) if isinstance(o, TurnBuffered))

    def open_request(self, traceparent: str | None, tracestate: str | None = None) -> SpanRef | None:
        """The server span the first opener (tracing) names; None without one, or when it fails."""
        span: SpanRef | None = self._first_opener("open_request", traceparent, tracestate)
        return span

    def open_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef | None:
        """The batch span the first opener names; None without one, or when it fails."""
        span: SpanRef | None = self._first_opener("open_batch", spans)
        return span

    def trace_response(self, record: RequestRecord) -> str | None:
        """The traceresponse header value the first opener gives for `record` (after on_request)."""
        value: str | None = self._first_opener("trace_response", record)
        return value

    def _first_opener(self, hook: str, *args: Any) -> Any:
        """What the first opener whose `hook` does not raise answers; None when there is none."""
        for index, call in self._opener_hooks[hook]:
            try:
                return call(*args)
            except Exception:
                self._failed(index, hook)
        return None

    def on_request(self, record: RequestRecord) -> None:
        self._each("on_request", record)

    def buffered(self) -> AbstractContextManager[None]:
        """Opens, for as long as this block lasts, the block of every observer that holds its writes for a turn
        (glassbox.service.observer.TurnBuffered). A block that fails as it opens or ends counts as a failed on_request
        of its observer; the others open and end theirs all the same."""
        return _Turn(self)

    def on_batch(self, record: BatchRecord) -> None:
        self._each("on_batch", record)

    def on_rejected(self, reason: str) -> None:
        self._each("on_rejected", reason)

    def on_dropped(self, reason: str, items: int) -> None:
        self._each("on_dropped", reason, items)

    def on_aborted(self, reason: str) -> None:
        self._each("on_aborted", reason)

    def on_fallback(self, event: FallbackEvent) -> None:
        self._each("on_fallback", event)

    def failures(self) -> dict[tuple[int, str], int]:
        """(observer index, hook) -> failures so far."""
        with self._lock:
            return dict(self._failures)

    def _each(self, hook: str, *args: Any) -> None:
        for index, method in self._hooks[hook]:
            try:
                method(*args)
            except Exception:
                self._failed(index, hook)

    def _failed(self, index: int, hook: str) -> None:
        with self._lock:
            count = self._failures.get((index, hook), 0) + 1
            self._failures[(index, hook)] = count
        if _is_power_of_ten(count):
            name = type(self.observers[index]).__name__
            self._log.exception("observer %s.%s failed (%d failures so far)", name, hook, count)
        if self._on_error is not None:
            try:
                self._on_error(hook)
            except Exception:  # the error counter itself must not break the fan-out
                self._log.debug("on_error callback failed", exc_info=True)


class _Turn:
    """The blocks of a fan-out's turn-buffered observers, opened in order and ended in reverse. A plain object rather
    than a generator and an ExitStack: the serving loop opens one every turn."""

    __slots__ = ("_fanout", "_open")

    def __init__(self, fanout: CompositeObserver) -> None:
        self._fanout = fanout
        self._open: list[tuple[int, AbstractContextManager[None]]] = []

    def __enter__(self) -> None:
        for index, observer in self._fanout._buffering:
            try:
                block = observer.buffered()
                block.__enter__()
            except Exception:
                self._fanout._failed(index, "on_request")
                continue
            self._open.append((index, block))

    def __exit__(self, *exc_info: object) -> None:
        # Every block that opened ends, the body's exception or not (which goes on to the caller).
        for index, block in reversed(self._open):
            try:
                block.__exit__(None, None, None)
            except Exception:
                self._fanout._failed(index, "on_request")
        self._open.clear()


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
