"""The engine process's side of the link: it serves every HTTP worker's connection on one Unix socket.

Each Submit becomes one `batcher.submit` on this process's event loop (the batcher forms batches across all
workers), and its answer goes back as Done or Refused with the engine-side times. A Cancel withdraws what is still
queued of a request whose client left. Calls run against this process's own ASGI routes (the chaos control API);
Scrape renders the scrape-time metric families; Keep hands the batch ids that a worker's tracing kept a request for
to this process's tracing. The engine's State goes to every worker when it connects, whenever `broadcast` is called
and every BEAT_S besides: the beat tells a worker that this process is alive and its event loop turns, so that a hung
engine (stopped, deadlocked) is noticed by its silence, not only a dead one by its closed socket.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable

import numpy as np

from service.errors import EngineError, GlassboxError
from service.frontend import Submitter
from service.ipc.asgi import AsgiApp, call_asgi
from service.ipc.framing import FrameProtocol
from service.ipc.messages import (
    Answer,
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
from service.observer import SpanRef
from service.types import TokenBatch

log = logging.getLogger("glassbox.hub")

BEAT_S = 1.0  # the State beat; workers call an engine silent after service.ipc.link.ENGINE_SILENT_S


class EngineHub:
    def __init__(self, batcher: Submitter, *, state: Callable[[], State], control: AsgiApp | None = None,
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

    async def run(self, message: Submit) -> Done | Refused:
        rows, width = message.rows, message.width
        tokens = TokenBatch(
            ids=np.frombuffer(message.ids, dtype=np.int64).reshape(rows, width),  # [rows, width]
            lengths=np.frombuffer(message.lengths, dtype=np.int64),  # [rows]
            truncated=np.zeros(rows, dtype=np.bool_),  # only the worker's postprocessing needs it
            type_ids=None if message.type_ids is None else
            np.frombuffer(message.type_ids, dtype=np.int64).reshape(rows, width),  # [rows, width]
        )
        span = None if message.span is None else SpanRef(*message.span)
        try:
            result = await self._batcher.submit(tokens, message.deadline_ns, request_id=message.request_id, span=span)
        except GlassboxError as error:
            return Refused(message.id, error.code, error.message, getattr(error, "retry_after_s", 0.0))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the batcher answers with GlassboxErrors; anything else is a bug, not a hang
            log.exception("submit failed")
            return Refused(message.id, EngineError.code, f"the engine failed: {type(exc).__name__}: {exc}")
        logits = np.ascontiguousarray(result.logits, dtype=np.float32)  # [rows, labels]
        return Done(message.id, int(logits.shape[1]), logits.tobytes(), result.queue_start_ns, result.queue_end_ns,
                    result.infer_end_ns, result.device, result.engine_mode, result.batch_ids,
                    tuple((span.trace_id, span.span_id, span.sampled) for span in result.batch_spans))

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


class _Peer:
    """One worker's connection: its in-flight tasks by message id, so a Cancel can find them."""

    def __init__(self, hub: EngineHub) -> None:
        self._hub = hub
        self._decode = engine_decoder().decode
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.worker = -1
        self.proto = FrameProtocol(self._on_frame, self._on_lost, lambda _proto: hub.joined(self))

    def _on_frame(self, payload: bytes) -> None:
        message = self._decode(payload)
        if isinstance(message, Submit):
            self._start(message.id, functools.partial(self._hub.run, message))
        elif isinstance(message, Cancel):
            task = self._tasks.pop(message.id, None)
            if task is not None:
                task.cancel()
        elif isinstance(message, Call):
            self._start(message.id, functools.partial(self._hub.call, message))
        elif isinstance(message, Scrape):
            self._start(message.id, functools.partial(self._hub.scrape, message))
        elif isinstance(message, Keep):
            self._hub.keep(message)
        elif isinstance(message, Hello):
            self.worker = message.worker
            log.debug("worker %d (pid %d) connected", message.worker, message.pid)

    def _start(self, message_id: int, work: Callable[[], Awaitable[Done | Refused | Answer | Scraped]]) -> None:
        # The coroutine is made inside the task: a task cancelled before its first step (the worker left at once)
        # then leaves no never-awaited coroutine behind.
        self._tasks[message_id] = asyncio.ensure_future(self._answer(message_id, work))

    async def _answer(self, message_id: int, work: Callable[[], Awaitable[Done | Refused | Answer | Scraped]]) -> None:
        try:
            reply = await work()
        except asyncio.CancelledError:
            return  # the worker cancelled it (its client left): nobody waits for an answer
        finally:
            self._tasks.pop(message_id, None)
        self.proto.send(encode(reply))

    def _on_lost(self, exc: Exception | None) -> None:
        self._hub.left(self)
        for task in self._tasks.values():  # the worker is gone: what it asked for is moot
            task.cancel()
        self._tasks.clear()
