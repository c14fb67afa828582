"""One request's side of the bridge: the partial results of its items, and what settles it: the future a task
awaits (Waiter, the one-process layout), or an answer to a worker process (service/ipc/hub.py).

Lives on the event loop: the engine thread never touches it, it only schedules `deliver_all`/`fail` with
`loop.call_soon_threadsafe`, so none of this needs a lock.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from glassbox.service.batching.records import SubmitResult
from glassbox.service.observer import SpanRef
from glassbox.service.types import EngineTiming, FloatArray

log = logging.getLogger("glassbox.batcher")


class Collector:
    """One request's rows as batches deliver them, on its event loop; `_complete` gets the whole result once every row
    has arrived, `_failed` the first failure. Settled (answered or given up) at most once."""

    __slots__ = (
        "_batch_ids", "_batch_spans", "_devices", "_first_start_ns", "_last_end_ns", "_logits", "_modes", "_remaining",
        "_size", "loop", "queue_start_ns", "request_id", "settled", "span",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, rows: int, queue_start_ns: int, request_id: str,
                 span: SpanRef | None = None) -> None:
        self.loop = loop
        self.span = span
        self.queue_start_ns = queue_start_ns
        self.request_id = request_id
        self.settled = False
        self._size = rows
        self._remaining = rows
        self._logits: FloatArray | None = None  # [rows, labels], allocated on the first delivery
        self._first_start_ns = 0
        self._last_end_ns = 0
        self._devices: set[str] = set()
        self._modes: set[str] = set()
        self._batch_ids: list[int] = []
        self._batch_spans: dict[int, SpanRef] = {}

    def deliver(self, rows: list[int], positions: list[int], logits: FloatArray, timing: EngineTiming,
                batch_id: int, batch_span: SpanRef | None = None) -> None:
        """Store the batch's `logits` ([batch rows, labels]) at `positions` as this request's `rows`; complete once
        every row has arrived. The batch's array is the batcher's own copy, never written again: a request that
        holds a run of it in order gets a view, not a copy."""
        if self.settled:  # cancelled or already failed: late rows of a request nobody awaits
            return
        if self._logits is None and len(rows) == self._size:  # the whole request in this one batch
            first, last = positions[0], positions[-1]
            if last - first == len(positions) - 1 and (len(rows) == 1 or rows == sorted(rows)):
                whole = logits[first:last + 1]  # [rows, labels]
            else:  # its rows in the batch's order (by length bucket), not the request's
                whole = np.empty((self._size, logits.shape[1]), dtype=np.float32)
                whole[rows] = logits[positions]
            self.settled = True
            self._complete(SubmitResult(
                logits=whole, queue_start_ns=self.queue_start_ns, queue_end_ns=timing.start_ns,
                infer_start_ns=timing.start_ns, infer_end_ns=timing.end_ns, device=timing.device,
                engine_mode=timing.mode, batch_ids=(batch_id,),
                batch_spans=() if batch_span is None else (batch_span,)))
            return
        if self._logits is None:
            self._logits = np.empty((self._size, logits.shape[1]), dtype=np.float32)
            self._first_start_ns = timing.start_ns
        self._logits[rows] = logits[positions]
        self._first_start_ns = min(self._first_start_ns, timing.start_ns)
        self._last_end_ns = max(self._last_end_ns, timing.end_ns)
        self._devices.add(timing.device)
        self._modes.add(timing.mode)
        self._batch_ids.append(batch_id)
        if batch_span is not None:
            self._batch_spans[batch_id] = batch_span
        self._remaining -= len(rows)
        if self._remaining == 0:
            self.settled = True
            self._complete(self._result(self._logits))

    def fail(self, error: BaseException) -> None:
        if not self.settled:
            self.settled = True
            self._failed(error)

    def _complete(self, result: SubmitResult) -> None:
        raise NotImplementedError

    def _failed(self, error: BaseException) -> None:
        raise NotImplementedError

    def _result(self, logits: FloatArray) -> SubmitResult:
        return SubmitResult(
            logits=logits,
            queue_start_ns=self.queue_start_ns,
            queue_end_ns=self._first_start_ns,
            infer_start_ns=self._first_start_ns,
            infer_end_ns=self._last_end_ns,
            device=",".join(sorted(self._devices)),
            engine_mode=self._modes.pop() if len(self._modes) == 1 else "mixed",
            batch_ids=tuple(sorted(set(self._batch_ids))),
            batch_spans=tuple(span for _, span in sorted(self._batch_spans.items())),
        )


class Waiter(Collector):
    """A request awaited by a task on the loop (`Batcher.submit`): the result or the failure settles its future."""

    __slots__ = ("future",)

    def __init__(self, loop: asyncio.AbstractEventLoop, rows: int, queue_start_ns: int, request_id: str,
                 span: SpanRef | None = None) -> None:
        super().__init__(loop, rows, queue_start_ns, request_id, span)
        self.future: asyncio.Future[SubmitResult] = loop.create_future()

    def deliver(self, rows: list[int], positions: list[int], logits: FloatArray, timing: EngineTiming,
                batch_id: int, batch_span: SpanRef | None = None) -> None:
        if self.future.done():  # the awaiting task was cancelled (the client left)
            self.settled = True
        super().deliver(rows, positions, logits, timing, batch_id, batch_span)

    def _complete(self, result: SubmitResult) -> None:
        self.future.set_result(result)

    def _failed(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


def deliver_all(answers: list[tuple[Collector, list[int], list[int]]], logits: FloatArray, timing: EngineTiming,
                batch_id: int, batch_span: SpanRef | None) -> None:
    """On the event loop: hand each request of one batch its rows of the batch's `logits` (the engine thread posts
    one call of this per loop and batch, not one per request, and leaves the splitting to it). One failing delivery
    fails its own request and does not stop the others."""
    for waiter, rows, positions in answers:
        try:
            waiter.deliver(rows, positions, logits, timing, batch_id, batch_span)
        except Exception as exc:  # a bug in one request's bookkeeping must not leave the rest of the batch waiting
            log.exception("delivering batch %d to request %r failed", batch_id, waiter.request_id)
            waiter.fail(exc)
