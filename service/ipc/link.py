"""An HTTP worker's link to the engine process: submits and control calls out, answers and engine state in.

It keeps one connection to the engine's Unix socket and reconnects when it drops (the engine process crashed, was
killed or is restarting). Everything in flight when the connection drops is answered at once with
EngineRestartingError (503 `engine_restarting` + Retry-After); while no engine is connected new work gets the same
answer immediately, so no client ever hangs on a dead engine. `submit` has the Batcher's signature, so the request
pipeline does not know which of the two it talks to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from glassbox.service.batching import SubmitResult
from glassbox.service.errors import (
    DeadlineExceededError,
    EngineRestartingError,
    NotReadyError,
    PayloadTooLargeError,
    rebuild,
)
from glassbox.service.ipc.framing import MAX_FRAME, FrameProtocol
from glassbox.service.ipc.messages import (
    Answer,
    Answers,
    Call,
    Cancel,
    Done,
    Hello,
    Keep,
    Request,
    Scrape,
    Scraped,
    State,
    Submit,
    encode,
    worker_decoder,
)
from glassbox.service.observer import SpanRef
from glassbox.service.types import TokenBatch

log = logging.getLogger("glassbox.link")

RECONNECT_FIRST_S = 0.02
RECONNECT_MAX_S = 0.5
# The engine answers a request's deadline itself (504 for texts still queued; texts already running finish, late).
# The worker looks again this long after the deadline, and then every SILENT_GRACE_S: it answers 504 itself only when
# the engine has been silent for ENGINE_SILENT_S (no beat: stopped or hung; service/ipc/hub.py beats every second), or
# when the request is STUCK_GRACE_S past its deadline (a batch that never ends in an engine whose loop still turns).
SILENT_GRACE_S = 1.0
ENGINE_SILENT_S = 3.0
STUCK_GRACE_S = 60.0
CONFIRM_S = 0.05  # silence is looked at twice, this far apart, so that the sockets are read in between
FLUSH_BYTES = 4 * 2**20  # a Submit frame is sent before this turn's requests come to more than this
REQUEST_OVERHEAD = 256  # a request's bytes in a Submit besides its arrays, at most (ids, deadline, span)


class EngineLink:
    """Lives on the worker's event loop; not thread-safe (nothing here needs a lock)."""

    def __init__(self, path: str, *, worker: int = 0, on_state: Callable[[State | None], None] | None = None,
                 restart_retry_after_s: float = 5.0) -> None:
        """`on_state` gets every State the engine sends, and None whenever the connection drops.
        `restart_retry_after_s` is the Retry-After of engine_restarting answers (the supervisor passes the engine's
        measured start-up time)."""
        self._path = path
        self._worker = worker
        self._on_state = on_state or (lambda _state: None)
        self.restart_retry_after_s = restart_retry_after_s
        self._decode = worker_decoder().decode
        self._proto: FrameProtocol | None = None
        self._outbox = _Outbox(None)  # the requests of this turn of the loop, for the connected engine
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._connected = asyncio.Event()
        self.connects = 0  # successful connections so far (1 after the first)
        self._heard_at = time.monotonic()  # the engine's last frame (a beat at least every second while it is well)
        self._quiet_until = 0.0  # until then the engine said it may be silent (State.quiet_s)
        self.gone_for_good = ""  # set (the reason) once the supervisor will not start the engine again

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect in the background (and again after every drop) until `close`."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._keep_connected())

    async def wait_connected(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self._closing = True
        if self._proto is not None:
            self._proto.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_all(EngineRestartingError("the server is shutting down", self.restart_retry_after_s))

    @property
    def connected(self) -> bool:
        return self._proto is not None

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def silent_s(self) -> float:
        """Seconds since the connected engine last spoke; 0 while none is connected (restarting, not silent)."""
        if self._proto is None:
            return 0.0
        # While the engine said it would be quiet (a trace's export), silence counts from the end of that window.
        return max(0.0, time.monotonic() - max(self._heard_at, self._quiet_until))

    # -- the Submitter protocol ------------------------------------------------------------------------------------
    def check_admission(self, deadline_ns: int) -> None:
        """Nothing to refuse early: the queue lives in the engine process, which judges each request at submit."""

    async def submit(self, tokens: TokenBatch, deadline_ns: int, *, request_id: str = "",
                     span: SpanRef | None = None) -> SubmitResult:
        rows, width = tokens.ids.shape
        ids, lengths = _bytes(tokens.ids), _bytes(tokens.lengths)
        type_ids = b"" if tokens.type_ids is None else _bytes(tokens.type_ids)
        size = len(ids) + len(lengths) + len(type_ids) + len(request_id) + REQUEST_OVERHEAD
        if size > MAX_FRAME:  # the engine would drop the connection, failing every request on it
            raise PayloadTooLargeError(
                f"this request's {rows} texts come to {size / 2**20:.0f} MiB of token ids, over the "
                f"{MAX_FRAME / 2**20:.0f} MiB one request may take to the engine process; send fewer texts per "
                "request")
        loop = asyncio.get_running_loop()
        _, message_id, future = self._reserve(loop)
        self._outbox.add(Request(message_id, rows, width, deadline_ns, request_id, bool(type_ids),
                                 None if span is None else (span.trace_id, span.span_id, span.sampled)),
                         ids, lengths, type_ids, size)
        left_s = max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9)
        timer = loop.call_later(left_s + SILENT_GRACE_S, self._check, message_id,
                                time.monotonic() + left_s + STUCK_GRACE_S)
        try:
            done: Done = await future
        except asyncio.CancelledError:
            # The client went away: the engine drops whatever of this request is still queued.
            if self._waiting.pop(message_id, None) is not None:
                self._cancel(message_id)
            raise
        finally:
            timer.cancel()
        logits = np.frombuffer(done.logits, dtype=np.float32).reshape(rows, done.labels)  # [rows, labels]
        return SubmitResult(logits=logits, queue_start_ns=done.queue_start_ns, queue_end_ns=done.queue_end_ns,
                            infer_start_ns=done.queue_end_ns, infer_end_ns=done.infer_end_ns, device=done.device,
                            engine_mode=done.engine_mode, batch_ids=done.batch_ids,
                            batch_spans=tuple(SpanRef(*span) for span in done.batch_spans))

    def _cancel(self, message_id: int) -> None:
        """Tell the engine to drop what is left of a request, after the Submit that carried it."""
        if self._proto is not None:
            self._outbox.flush()  # a request still in the outbox must reach the engine before its Cancel
            self._proto.send(encode(Cancel(message_id)))

    def keep_batches(self, batch_ids: tuple[int, ...]) -> None:
        """Ask the engine process to export the spans of these batches (tracing kept a request that rode in them).
        Best effort: while no engine is connected there is nothing to ask (a restarted engine never had them)."""
        if self._proto is not None and batch_ids:
            self._proto.send(encode(Keep(batch_ids)))

    # -- control calls ---------------------------------------------------------------------------------------------
    async def call(self, method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        """Run one HTTP request against the engine process's own routes (the chaos control API)."""
        proto, message_id, future = self._reserve(asyncio.get_running_loop())
        proto.send(encode(Call(message_id, method, path, query, headers, body)))
        try:
            # No fixed bound: arming a GPU fault can take seconds, and a call given up on would still take effect.
            # Only an engine that went silent is given up on.
            while True:
                try:
                    async with asyncio.timeout(SILENT_GRACE_S):
                        answer: Answer = await asyncio.shield(future)
                    return answer
                except TimeoutError:
                    if self.silent_s() > ENGINE_SILENT_S:
                        raise DeadlineExceededError(f"the engine process has not been heard from for "
                                                    f"{self.silent_s():.1f} s; this control request may or may not "
                                                    "have taken effect") from None
        finally:
            self._waiting.pop(message_id, None)

    async def scrape(self) -> bytes:
        """The engine's scrape-time metric families, in the Prometheus text format."""
        proto, message_id, future = self._reserve(asyncio.get_running_loop())
        proto.send(encode(Scrape(message_id)))
        try:
            scraped: Scraped = await future
        finally:  # the scrape's caller bounds the wait: what it gave up on must not count as in flight
            self._waiting.pop(message_id, None)
        return scraped.text

    # -- internals -------------------------------------------------------------------------------------------------
    def _reserve(self, loop: asyncio.AbstractEventLoop) -> tuple[FrameProtocol, int, asyncio.Future[Any]]:
        """The connection, a new message id and the future its answer will resolve; engine_restarting at once
        while no engine is connected."""
        proto = self._proto
        if proto is None:
            if self.gone_for_good:
                raise NotReadyError(self.gone_for_good)
            raise EngineRestartingError("the engine process is restarting; retry shortly", self.restart_retry_after_s)
        self._next_id += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting[self._next_id] = future
        return proto, self._next_id, future

    def _check(self, message_id: int, give_up_at: float, confirming: bool = False) -> None:
        """After a request's deadline: wait on while the engine beats (it answers the deadline itself, and texts
        already running finish); answer 504 here when it went silent or the request is stuck. Silence is confirmed
        once after a short wait: after a stall of this worker's own loop its timers run before its sockets are read,
        and a beat may be waiting unread."""
        future = self._waiting.get(message_id)
        if future is None or future.done():
            return
        silent_s = self.silent_s()
        loop = asyncio.get_running_loop()
        if silent_s <= ENGINE_SILENT_S and time.monotonic() < give_up_at:
            loop.call_later(SILENT_GRACE_S, self._check, message_id, give_up_at)
            return
        if not confirming:
            loop.call_later(CONFIRM_S, self._check, message_id, give_up_at, True)
            return
        del self._waiting[message_id]
        self._cancel(message_id)  # should the engine wake up: drop what is left of it
        reason = (f"the engine process has not been heard from for {silent_s:.1f} s" if silent_s > ENGINE_SILENT_S
                  else f"the request was still in the engine {STUCK_GRACE_S:g} s after its deadline")
        future.set_exception(DeadlineExceededError(f"{reason}; its deadline has passed"))

    def _on_frame(self, payload: bytes) -> None:
        self._heard_at = time.monotonic()
        message = self._decode(payload)
        if isinstance(message, State):
            self._quiet_until = self._heard_at + message.quiet_s
            self._on_state(message)
            return
        waiting = self._waiting
        if isinstance(message, Answers):
            for done in message.done:
                future = waiting.pop(done.id, None)
                if future is not None and not future.done():  # else answered already (deadline, cancel): dropped
                    future.set_result(done)
            for refused in message.refused:
                future = waiting.pop(refused.id, None)
                if future is not None and not future.done():
                    future.set_exception(rebuild(refused.code, refused.message, refused.retry_after_s))
            return
        future = waiting.pop(message.id, None)
        if future is not None and not future.done():
            future.set_result(message)

    def _fail_all(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    async def _keep_connected(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = RECONNECT_FIRST_S
        while not self._closing:
            lost: asyncio.Future[Exception | None] = loop.create_future()

            def on_lost(exc: Exception | None, lost: asyncio.Future[Exception | None] = lost) -> None:
                if not lost.done():
                    lost.set_result(exc)

            try:
                _, proto = await loop.create_unix_connection(lambda: FrameProtocol(self._on_frame, on_lost), self._path)
            except OSError:
                await asyncio.sleep(backoff)  # the engine process is not listening yet: retry with backoff
                backoff = min(2 * backoff, RECONNECT_MAX_S)
                continue
            backoff = RECONNECT_FIRST_S
            self._proto = proto
            self._outbox = _Outbox(proto)
            self._heard_at = time.monotonic()
            self.connects += 1
            proto.send(encode(Hello(self._worker, os.getpid())))
            self._connected.set()
            exc = await lost
            self._proto = None
            self._outbox = _Outbox(None)
            self._connected.clear()
            if not self._closing:
                log.warning("lost the engine process (%s); failing %d in-flight requests with engine_restarting",
                            exc or "connection closed", len(self._waiting))
            self._fail_all(EngineRestartingError("the engine process went away while this request was in it; "
                                                 "retry shortly", self.restart_retry_after_s))
            self._on_state(None)


class _Outbox:
    """The requests submitted in this turn of the worker's loop, sent as one Submit at its end (or sooner, once they
    come to FLUSH_BYTES): the engine process then handles one frame a turn, however many requests it carries."""

    def __init__(self, proto: FrameProtocol | None) -> None:
        self._proto = proto
        self._requests: list[Request] = []
        self._ids: list[bytes] = []
        self._lengths: list[bytes] = []
        self._type_ids: list[bytes] = []
        self._bytes = 0

    def add(self, request: Request, ids: bytes, lengths: bytes, type_ids: bytes, size: int) -> None:
        if self._bytes and self._bytes + size > FLUSH_BYTES:
            self.flush()  # one frame stays well under MAX_FRAME
        if not self._requests:
            asyncio.get_running_loop().call_soon(self.flush)
        self._requests.append(request)
        self._ids.append(ids)
        self._lengths.append(lengths)
        if type_ids:
            self._type_ids.append(type_ids)
        self._bytes += size

    def flush(self) -> None:
        if not self._requests or self._proto is None:
            return
        message = Submit(tuple(self._requests), b"".join(self._ids), b"".join(self._lengths),
                         b"".join(self._type_ids))
        self._requests, self._ids, self._lengths, self._type_ids, self._bytes = [], [], [], [], 0
        if self._proto.send(encode(message)):
            self._proto.flush()  # this runs at the end of the turn already


def _bytes(array: np.ndarray[Any, Any]) -> bytes:
    return np.ascontiguousarray(array, dtype=np.int64).tobytes()
