"""The engine process's side of the link: it serves every HTTP worker's connection on one Unix socket.

A worker's Submit carries every request it sent in one turn of its loop; the hub admits them into the batcher under
one lock (the batcher forms batches across all workers). No request gets a task, a future or a timer of its own:
its rows collect in a RemoteRequest as batches end (the engine thread posts one call per batch to this loop), one
timer serves every queued request's deadline, and the requests of one worker answered in one turn (a batch's) leave
in one Answers frame, each a Done with its logits and engine-side times or a Refused. A Cancel withdraws what is
still queued of a request whose client left. Calls run against this process's own ASGI routes (the chaos control API);
Scrape renders the scrape-time metric families; Keep hands the batch ids that a worker's tracing kept a request for
to this process's tracing. The engine's State goes to every worker when it connects, whenever `broadcast` is called
and every BEAT_S besides: the beat tells a worker that this process is alive and its event loop turns, so that a hung
engine (stopped, deadlocked) is noticed by its silence, not only a dead one by its closed socket.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np

from glassbox.service.batching import Batcher, SubmitResult
from glassbox.service.batching.queue import Ticket
from glassbox.service.batching.waiter import Collector
from glassbox.service.errors import EngineError, GlassboxError
from glassbox.service.ipc.asgi import AsgiApp, call_asgi
from glassbox.service.ipc.framing import FrameProtocol
from glassbox.service.ipc.messages import (
    Answer,
    Answers,
    Call,
    Cancel,
    Done,
    Hello,
    Keep,
    Refused,
    Scrape,
    Scraped,
    State,
    Submit,
    encode,
    engine_decoder,
)
from glassbox.service.observer import SpanRef
from glassbox.service.types import TokenBatch

log = logging.getLogger("glassbox.hub")

BEAT_S = 1.0  # the State beat; workers call an engine silent after glassbox.service.ipc.link.ENGINE_SILENT_S
COMPACT_AT = 4096  # deadlines held before answered requests' are dropped from the heap


class EngineHub:
    def __init__(self, batcher: Batcher, *, state: Callable[[], State], control: AsgiApp | None = None,
                 scrape: Callable[[], bytes] | None = None,
                 keep: Callable[[tuple[int, ...]], None] | None = None) -> None:
        """`keep` hands on the batch ids a worker's tracing kept a request for (Keep), to this process's tracing."""
        self._batcher = batcher
        self._keep = keep
        self._state = state
        self._control = control
        self._scrape = scrape
        self._peers: set[_Peer] = set()
        self._server: asyncio.AbstractServer | None = None
        self._beat: asyncio.Task[None] | None = None
        self._deadlines = _Deadlines(self._expire, lambda: sum(len(peer.requests) for peer in self._peers))

    async def listen(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Peer(self).proto, path)
        self._beat = asyncio.ensure_future(self._beat_forever())

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            if self._peers:
                try:
                    self.broadcast()
                except Exception:  # a state that cannot be read this time: the next beat tries again
                    log.exception("the state beat failed")

    def broadcast(self) -> None:
        """Send the current State to every connected worker (call it on the event loop)."""
        payload = encode(self._state())
        for peer in list(self._peers):
            peer.proto.send(payload)

    @property
    def workers(self) -> int:
        return len(self._peers)

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        self._deadlines.close()
        if self._server is not None:
            self._server.close()
        for peer in list(self._peers):
            peer.proto.close()

    # -- what peers call ---------------------------------------------------------------------------------------------
    def joined(self, peer: _Peer) -> None:
        self._peers.add(peer)
        peer.proto.send(encode(self._state()))

    def left(self, peer: _Peer) -> None:
        self._peers.discard(peer)

    def submit(self, peer: _Peer, message: Submit) -> None:
        """Admit every request of one Submit under one lock; refusals are answered at once, the rest when their
        batches end (RemoteRequest) or their deadlines pass (the hub's one deadline timer)."""
        ids = np.frombuffer(message.ids, dtype=np.int64)
        lengths = np.frombuffer(message.lengths, dtype=np.int64)
        type_ids = np.frombuffer(message.type_ids, dtype=np.int64) if message.type_ids else None
        loop = asyncio.get_running_loop()
        now = time.perf_counter_ns()
        entries: list[tuple[TokenBatch, int, Collector]] = []
        at = row = typed_at = 0
        for request in message.requests:
            rows, width = request.rows, request.width
            size = rows * width
            types = None
            if request.types and type_ids is not None:
                types = type_ids[typed_at:typed_at + size].reshape(rows, width)  # [rows, width]
                typed_at += size
            tokens = TokenBatch(
                ids=ids[at:at + size].reshape(rows, width),  # [rows, width]
                lengths=lengths[row:row + rows],  # [rows]
                truncated=np.zeros(rows, dtype=np.bool_),  # only the worker's postprocessing needs it
                type_ids=types,
            )
            at += size
            row += rows
            span = None if request.span is None else SpanRef(*request.span)
            entries.append((tokens, request.deadline_ns,
                            RemoteRequest(loop, peer, request.id, rows, now, request.request_id, span)))
        outcomes = self._batcher.admit(entries)
        for (_, deadline_ns, owner), outcome in zip(entries, outcomes, strict=True):
            assert isinstance(owner, RemoteRequest)
            if isinstance(outcome, GlassboxError):
                owner.settled = True
                peer.answer_refused(_refused(owner.id, outcome))
                continue
            owner.ticket = outcome
            peer.requests[owner.id] = owner
            self._deadlines.add(deadline_ns, owner)

    def settled(self, owner: RemoteRequest) -> None:
        """A request admitted by `submit` was answered, cancelled or left with its worker: the drain may end."""
        owner.peer.requests.pop(owner.id, None)
        self._batcher.release()

    def withdraw(self, owner: RemoteRequest) -> None:
        """Its client (or its whole worker) went away: drop what is still queued of it; nobody is answered."""
        if owner.settled:
            return
        owner.settled = True
        if owner.ticket is not None:
            self._batcher.withdraw(owner.ticket)
        self.settled(owner)

    def _expire(self, owner: RemoteRequest) -> None:
        if not owner.settled and owner.ticket is not None:
            self._batcher.expire(owner.ticket)  # fails it (504) when some of it was still queued

    def keep(self, message: Keep) -> None:
        if self._keep is not None:
            try:
                self._keep(message.batch_ids)
            except Exception:  # telemetry must never take the link down
                log.exception("keeping batches %s failed", message.batch_ids)

    async def call(self, message: Call) -> Answer:
        if self._control is None:
            return Answer(message.id, 404, [("content-type", "application/json")],
                          b'{"error": {"code": "not_found", "message": "the engine serves no control routes"}}')
        try:
            status, headers, body = await call_asgi(self._control, message.method, message.path, message.query,
                                                    message.headers, message.body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker waits for an answer: a bug in a route must not leave it hanging
            log.exception("control call %s %s failed", message.method, message.path)
            body = json.dumps({"error": {"code": "internal_error", "message": f"the engine process failed on this "
                                         f"control request: {type(exc).__name__}"}}).encode()
            return Answer(message.id, 500, [("content-type", "application/json")], body)
        return Answer(message.id, status, headers, body)

    async def scrape(self, message: Scrape) -> Scraped:
        text = b"" if self._scrape is None else await asyncio.to_thread(self._scrape)
        return Scraped(message.id, text)


class RemoteRequest(Collector):
    """A worker's request in the engine process: its rows collect here as batches deliver them, and its answer goes
    into its worker's next Answers frame."""

    __slots__ = ("id", "peer", "ticket")

    def __init__(self, loop: asyncio.AbstractEventLoop, peer: _Peer, message_id: int, rows: int, queue_start_ns: int,
                 request_id: str, span: SpanRef | None) -> None:
        super().__init__(loop, rows, queue_start_ns, request_id, span)
        self.peer = peer
        self.id = message_id
        self.ticket: Ticket[Collector] | None = None

    def _complete(self, result: SubmitResult) -> None:
        logits = np.ascontiguousarray(result.logits, dtype=np.float32)  # [rows, labels]
        self.peer.answer_done(Done(
            self.id, int(logits.shape[1]), logits.tobytes(), result.queue_start_ns, result.queue_end_ns,
            result.infer_end_ns, result.device, result.engine_mode, result.batch_ids,
            tuple((span.trace_id, span.span_id, span.sampled) for span in result.batch_spans)))
        self.peer.hub.settled(self)

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, GlassboxError):
            refused = _refused(self.id, error)
        else:  # the batcher fails requests with GlassboxErrors; anything else is a bug, not a hang
            log.error("request %d of worker %d failed: %r", self.id, self.peer.worker, error)
            refused = Refused(self.id, EngineError.code, f"the engine failed: {type(error).__name__}: {error}")
        self.peer.answer_refused(refused)
        self.peer.hub.settled(self)


class _Deadlines:
    """Every queued request's deadline on one timer of the event loop (the earliest), instead of one each."""

    def __init__(self, on_expired: Callable[[RemoteRequest], None], live: Callable[[], int]) -> None:
        """`live`: how many requests are unsettled now; the heap drops answered ones when they are most of it."""
        self._on_expired = on_expired
        self._live = live
        self._heap: list[tuple[int, int, RemoteRequest]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_ns = 0  # the deadline the timer is set for
        self._check_at = COMPACT_AT  # the heap's size at which answered requests are next looked for

    def add(self, deadline_ns: int, owner: RemoteRequest) -> None:
        self._seq += 1
        heap = self._heap
        if len(heap) >= self._check_at:
            # Answered requests wait here until their deadlines (10 s by default): at thousands a second, drop them
            # before they pile up. Looked at again only once the heap has doubled, so it costs O(1) a request.
            if len(heap) > 2 * self._live():
                self._heap = heap = [entry for entry in heap if not entry[2].settled]
                heapq.heapify(heap)
            self._check_at = max(COMPACT_AT, 2 * len(heap))
        heapq.heappush(heap, (deadline_ns, self._seq, owner))
        if self._timer is None or deadline_ns < self._timer_ns:
            self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        heap = self._heap
        while heap and heap[0][2].settled:  # answered already: nothing to expire
            heapq.heappop(heap)
        if heap:
            self._timer_ns = heap[0][0]
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, (self._timer_ns - time.perf_counter_ns()) / 1e9), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.perf_counter_ns()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, owner = heapq.heappop(heap)
            if not owner.settled:
                self._on_expired(owner)
        self._arm()


class _Peer:
    """One worker's connection: its admitted requests by message id, so a Cancel can find them, and the answers of
    this turn of the loop, sent together at its end."""

    def __init__(self, hub: EngineHub) -> None:
        self.hub = hub
        self._decode = engine_decoder().decode
        self._tasks: dict[int, asyncio.Task[None]] = {}  # control calls and scrapes
        self.requests: dict[int, RemoteRequest] = {}
        self._done: list[Done] = []
        self._refused: list[Refused] = []
        self.worker = -1
        self.proto = FrameProtocol(self._on_frame, self._on_lost, lambda _proto: hub.joined(self))

    def answer_done(self, done: Done) -> None:
        if not self._done and not self._refused:
            asyncio.get_running_loop().call_soon(self._flush)
        self._done.append(done)

    def answer_refused(self, refused: Refused) -> None:
        if not self._done and not self._refused:
            asyncio.get_running_loop().call_soon(self._flush)
        self._refused.append(refused)

    def _flush(self) -> None:
        done, refused = tuple(self._done), tuple(self._refused)
        self._done.clear()
        self._refused.clear()
        if (done or refused) and self.proto.send(encode(Answers(done, refused))):
            self.proto.flush()  # this runs at the end of the turn already

    def _on_frame(self, payload: bytes) -> None:
        message = self._decode(payload)
        if isinstance(message, Submit):
            self.hub.submit(self, message)
        elif isinstance(message, Cancel):
            request = self.requests.get(message.id)
            if request is not None:
                self.hub.withdraw(request)
        elif isinstance(message, Call):
            self._start(message.id, functools.partial(self.hub.call, message))
        elif isinstance(message, Scrape):
            self._start(message.id, functools.partial(self.hub.scrape, message))
        elif isinstance(message, Keep):
            self.hub.keep(message)
        elif isinstance(message, Hello):
            self.worker = message.worker
            log.debug("worker %d (pid %d) connected", message.worker, message.pid)

    def _start(self, message_id: int, work: Callable[[], Awaitable[Answer | Scraped]]) -> None:
        # The coroutine is made inside the task: a task cancelled before its first step (the worker left at once)
        # then leaves no never-awaited coroutine behind.
        self._tasks[message_id] = asyncio.ensure_future(self._answer(message_id, work))

    async def _answer(self, message_id: int, work: Callable[[], Awaitable[Answer | Scraped]]) -> None:
        try:
            reply = await work()
        except asyncio.CancelledError:
            return  # the worker is gone: nobody waits for an answer
        finally:
            self._tasks.pop(message_id, None)
        self.proto.send(encode(reply))

    def _on_lost(self, exc: Exception | None) -> None:
        self.hub.left(self)
        for task in self._tasks.values():  # the worker is gone: what it asked for is moot
            task.cancel()
        self._tasks.clear()
        for request in list(self.requests.values()):
            self.hub.withdraw(request)
        self._done.clear()
        self._refused.clear()


def _refused(message_id: int, error: GlassboxError) -> Refused:
    return Refused(message_id, error.code, error.message, getattr(error, "retry_after_s", 0.0))
