"""HandBack: what goes from an engine thread back to the event loops once a batch has run, failed or expired.

A finished batch's rows are grouped by request and posted with `loop.call_soon_threadsafe`, one call per loop and
batch: every such call wakes the loop, which then contends with the engine thread for the interpreter lock while
that thread posts the next one. The loop splits the logits between its requests (service/batching/waiter.py); the
batch's telemetry (`on_batch`) rides with the first loop's answers, so that it runs there after them and not on the
engine thread between two runs (on a GPU that thread's Python between replays is what the device waits for). An
engine thread never touches an asyncio object."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from glassbox.service.batching.queue import Item, Ticket, by_ticket
from glassbox.service.batching.waiter import Collector, deliver_all
from glassbox.service.errors import EngineError, GlassboxError
from glassbox.service.observer import BatchRecord, Observer, SpanOpener, SpanRef
from glassbox.service.types import EngineResult, EngineTiming, FloatArray, TokenBatch


class HandBack:
    """Posts answers, failures and telemetry from an engine thread to the requests' event loops."""

    def __init__(self, observer: Observer, log: logging.Logger) -> None:
        self._observer = observer
        # Tracing names each batch's span before its answers go out, so the requests in it can link to it.
        self._open_batch = observer.open_batch if isinstance(observer, SpanOpener) else None
        self._log = log

    def answers(self, items: Sequence[Item[Collector]], batch_id: int, batch: TokenBatch, result: EngineResult,
                depth_after: int) -> None:
        """A batch's logits to its requests, and its record to the observers (on the first loop, after them)."""
        timing = result.timing
        groups = by_ticket(items)
        spans = tuple(ticket.owner.span for ticket, _, _ in groups)
        batch_span = self._name_batch(spans)
        # This thread copies the logits once (an engine may reuse its output buffer) and does nothing per request
        # but group the rows.
        logits = np.array(result.logits, dtype=np.float32)  # [n, labels]
        deliveries: dict[asyncio.AbstractEventLoop, list[tuple[Collector, list[int], list[int]]]] = {}
        for ticket, rows, positions in groups:
            owner = ticket.owner
            deliveries.setdefault(owner.loop, []).append((owner, rows, positions))
        request_ids = tuple(ticket.owner.request_id for ticket, _, _ in groups)
        record = BatchRecord(batch_id, timing, request_ids, depth_after, spans, batch_span, logits, batch.lengths)
        observed = False
        for loop, answers in deliveries.items():
            if observed:
                post(loop, deliver_all, answers, logits, timing, batch_id, batch_span)
            else:
                post(loop, self._deliver_and_observe, answers, logits, timing, batch_id, batch_span, record)
                observed = True

    def failure(self, tickets: Sequence[Ticket[Collector]], batch_id: int, exc: Exception) -> None:
        """The engine raised on a batch: each of its requests fails with a GlassboxError."""
        for ticket in tickets:
            error: GlassboxError
            if isinstance(exc, GlassboxError):
                error = exc
            else:
                # The exception's own text stays in the log: a TorchScript error is a traceback with the server's
                # file paths, which is nothing a client should read.
                error = EngineError(f"the engine failed on batch {batch_id} ({type(exc).__name__}); the server log "
                                    "has the details")
                error.__cause__ = exc
            post(ticket.owner.loop, ticket.owner.fail, error)

    def fail_all(self, tickets: Sequence[Ticket[Collector]], error: Callable[[], GlassboxError]) -> None:
        """Each request fails with a fresh `error()` (its deadline passed in the queue, the server stopped)."""
        for ticket in tickets:
            post(ticket.owner.loop, ticket.owner.fail, error())

    def notify(self, hook: Callable[..., None], *args: Any) -> None:
        """Calls an observer's hook; telemetry must never take the engine thread (or a request) down with it."""
        try:
            hook(*args)
        except Exception:
            self._log.exception("observer %s failed", getattr(hook, "__name__", hook))

    def _deliver_and_observe(self, answers: list[tuple[Collector, list[int], list[int]]], logits: FloatArray,
                             timing: EngineTiming, batch_id: int, batch_span: SpanRef | None,
                             record: BatchRecord) -> None:
        """On the event loop: a batch's answers, then its record to the observers."""
        deliver_all(answers, logits, timing, batch_id, batch_span)
        self.notify(self._observer.on_batch, record)

    def _name_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef | None:
        if self._open_batch is None:
            return None
        try:
            return self._open_batch(spans)
        except Exception:  # telemetry must never take the engine thread down with it
            self._log.exception("observer open_batch failed")
            return None


def post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """`callback(*args)` on `loop`, from any thread. A closed loop raises RuntimeError: nobody is waiting for this
    answer any more."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def check_rows(result: EngineResult, rows: int) -> None:
    shape = result.logits.shape
    if len(shape) != 2 or shape[0] != rows:
        raise EngineError(f"the engine returned logits of shape {shape} for {rows} rows")
