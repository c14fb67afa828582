"""The only bridge between the asyncio event loop and the engine threads (one, or on a CPU engine that allows it
several running batches side by side: `runners`).

Requests are split into items (one per text) and queued by length bucket; the engine threads sleep on a
condition while the queue is empty and wake on submits. When one is free and work is queued, the batch former
(service/batching/formation.py) says whether to start now or hold a moment for a burst that is arriving, within a
bound derived from the engine's own batch time; a lone request on an idle server starts at once. Admission
(service/batching/admission.py) refuses by the wait a request would face at the engine's measured rate.
Results go back with `loop.call_soon_threadsafe`, one call per loop and batch, the batch's telemetry (`on_batch`)
riding with its answers (service/batching/handback.py); an engine thread never touches an asyncio object.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NoReturn

from glassbox.service.batching.admission import ShedMeter, Verdict, predicted_wait_s, refusal
from glassbox.service.batching.cost import CostModel
from glassbox.service.batching.formation import GO, BatchFormer, FormationPolicy
from glassbox.service.batching.handback import HandBack, check_rows
from glassbox.service.batching.limits import BatcherLimits
from glassbox.service.batching.queue import BucketQueue, Item, Ticket, by_ticket, stack_rows
from glassbox.service.batching.records import (
    DROP_DEADLINE,
    DROP_DISCONNECTED,
    DROP_FAILED,
    DROP_SHUTDOWN,
    REJECT_PREDICTED_WAIT,
    BatcherStats,
    SubmitResult,
)
from glassbox.service.batching.throughput import ThroughputMeter
from glassbox.service.batching.waiter import Collector, Waiter
from glassbox.service.errors import (
    DeadlineExceededError,
    EmptyInputError,
    GlassboxError,
    NotReadyError,
)
from glassbox.service.observer import NullObserver, Observer, SpanRef
from glassbox.service.types import TokenBatch

if TYPE_CHECKING:
    from glassbox.service.engines.base import Engine

_Ticket = Ticket[Collector]


class Batcher:
    """Feeds one engine from many concurrent requests: admission, batching, deadlines, results, drain."""

    def __init__(
        self,
        engine: Engine,
        limits: BatcherLimits,
        observer: Observer | None = None,
        *,
        pad_id: int = 0,  # the tokenizer's pad id, used when rows of different requests are stacked
        clock: Callable[[], int] = time.perf_counter_ns,  # for deadlines; tests pass a fake
        formation: FormationPolicy | None = None,  # None: the default policy; FormationPolicy(hold_share=0): never hold
        runners: int = 1,  # engine threads, each running whole batches; >1 only for engines safe to call concurrently
        share_threads: Callable[[int], None] | None = None,  # called on an engine thread before each batch with
        # the number of batches running with it: how the runtime shares the intra-op threads between them
        on_thread_start: Callable[[int], None] | None = None,  # called first on each engine thread with its index
        # (0 is the thread a batch that starts alone goes to): its priority and intra-op threads
    ) -> None:
        if runners < 1:
            raise ValueError("runners must be at least 1")
        self._runners = runners
        self._share_threads = share_threads
        self._on_thread_start = on_thread_start
        self._engine = engine
        self._limits = limits
        self._shed_limits = limits.while_shedding()
        self._observer: Observer = observer if observer is not None else NullObserver()
        self._pad_id = pad_id
        self._clock = clock
        self._log = logging.getLogger("glassbox.batcher")
        self._hand_back = HandBack(self._observer, self._log)
        self._notify = self._hand_back.notify
        # One lock guards the queue, the counters and the flags; the condition on it wakes the engine thread.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: BucketQueue[Collector] = BucketQueue(limits.length_buckets)
        self._meter = ThroughputMeter()
        # Batch formation and the in-flight estimate run on the real clock whatever `clock` is: they measure the
        # engine, while `clock` only decides deadlines.
        self._former = BatchFormer(formation)
        self._cost = CostModel()
        # Batches in the engine now, by batch id: (perf_counter_ns at its start, real tokens, rows).
        self._running: dict[int, tuple[int, int, int]] = {}
        self._in_flight = 0  # rows in the engine now: the sum over _running (written under the lock)
        self._threads: list[threading.Thread] = []
        self._draining = False
        self._stopping = False
        self._pending = 0  # admitted requests not yet answered (changed on the event loop, under the lock)
        self._drained: asyncio.Event | None = None  # set by the last pending request while draining
        self._batches_run = 0
        self._items_run = 0
        self._engine_errors = 0
        self._dropped: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._shed = ShedMeter()  # the wait bound's refusals against admissions
        self._next_batch_id = 1  # under the lock

    # -- event-loop side ---------------------------------------------------------------------------------

    async def submit(self, tokens: TokenBatch, deadline_ns: int, *, request_id: str = "",
                     span: SpanRef | None = None) -> SubmitResult:
        """Run every row of `tokens` through the engine and return their logits in order.

        `deadline_ns` is on the batcher's clock (`time.perf_counter_ns` unless a test passed another).
        `request_id` and `span` (the request's server span) only label the BatchRecords its items appear in.
        """
        if tokens.size == 0:
            raise EmptyInputError("nothing to classify: the batch has no rows")
        loop = asyncio.get_running_loop()
        now = self._clock()
        waiter = Waiter(loop, tokens.size, now, request_id, span)
        ticket: _Ticket = Ticket(waiter, tokens, deadline_ns)
        self._admit(ticket, now)
        # The engine thread also drops expired items when it meets them; this timer answers the client at
        # its deadline even while the engine is busy with a long batch.
        timer = loop.call_later((deadline_ns - now) / 1e9, self.expire, ticket)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._withdraw(ticket, DROP_DISCONNECTED)
            raise
        finally:
            timer.cancel()
            self.release()

    def admit(self, requests: Sequence[tuple[TokenBatch, int, Collector]]) -> list[_Ticket | GlassboxError]:
        """Queue many requests at once, under one lock, each settled through its own Collector (on its loop) rather
        than awaited: for each, its Ticket (keep it to `withdraw` or `expire` the request, and call `release` once it
        is settled) or the error that refused it, in order. What `submit` does, less the task and the deadline timer
        of each request: the caller keeps the deadlines (service/ipc/hub.py)."""
        outcomes: list[_Ticket | GlassboxError] = []
        refused: list[Verdict] = []
        late = 0
        with self._wake:
            now = self._clock()
            queued = 0
            for tokens, deadline_ns, owner in requests:
                if tokens.size == 0:
                    outcomes.append(EmptyInputError("nothing to classify: the batch has no rows"))
                    continue
                verdict = self._judge(tokens.real_tokens, (deadline_ns - now) / 1e9)
                if verdict.reason is not None:
                    refused.append(verdict)
                    outcomes.append(verdict.error(tokens.real_tokens))
                    continue
                if deadline_ns <= now:
                    self._count_dropped(DROP_DEADLINE, tokens.size)
                    late += tokens.size
                    outcomes.append(DeadlineExceededError("the request's deadline had passed before it was queued"))
                    continue
                ticket = Ticket(owner, tokens, deadline_ns)
                self._shed.admitted(time.perf_counter_ns(), self._limits.shed_window_s)
                self._queue.push(ticket)
                self._pending += 1
                queued += 1
                outcomes.append(ticket)
            if queued:
                self._former.arrived(time.perf_counter_ns(), self._queue.items + self._in_flight)
                if self._runners > 1 and not self._running:
                    self._wake.notify_all()  # a batch that would start alone is the first engine thread's
                else:
                    self._wake.notify()
        if late:
            self._notify(self._observer.on_dropped, DROP_DEADLINE, late)
        for verdict in refused:
            self._notify(self._observer.on_rejected, verdict.reason)
        return outcomes

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait until every admitted request is answered; False on timeout."""
        with self._lock:
            self._draining = True
            if self._pending == 0:
                return True
            if self._drained is None:
                self._drained = asyncio.Event()
            drained = self._drained
        try:
            async with asyncio.timeout(timeout_s):
                await drained.wait()
        except TimeoutError:
            return False
        return True

    def check_admission(self, deadline_ns: int) -> None:
        """Raise now the refusal `submit` would give any request at this moment, whatever its tokens, so that under
        overload a request refused anyway is not decoded and tokenized first (the event loop's time is what an
        overloaded host runs short of). A request let through here is judged again, in full, by `submit`."""
        if not self._queue.items and not self._draining and self._in_flight < self._limits.max_batch_size:
            # Nothing queued and less than a full batch in the engine: no rule refuses a request for its place, and
            # the rest (its deadline against the running batch) needs its tokens. Read without the lock: submit
            # judges again under it.
            return
        now_ns = self._clock()
        if deadline_ns <= now_ns:
            return  # submit answers a request whose deadline has passed as such
        with self._lock:
            # No tokens and no run time of its own: every rule refuses a real request whenever it refuses this one.
            verdict = self._judge(0, (deadline_ns - now_ns) / 1e9)
        if verdict.reason is not None:
            self._refuse(verdict, 0)

    def _admit(self, ticket: _Ticket, now_ns: int) -> None:
        tokens = ticket.tokens
        with self._wake:
            verdict = self._judge(tokens.real_tokens, (ticket.deadline_ns - now_ns) / 1e9)
            if verdict.reason is None and ticket.deadline_ns > now_ns:
                self._shed.admitted(time.perf_counter_ns(), self._limits.shed_window_s)
                self._queue.push(ticket)
                self._pending += 1
                self._former.arrived(time.perf_counter_ns(), self._queue.items + self._in_flight)
                if self._runners > 1 and not self._running:
                    self._wake.notify_all()  # a batch that would start alone is the first engine thread's
                else:
                    self._wake.notify()
                return
            if verdict.reason is None:
                self._count_dropped(DROP_DEADLINE, tokens.size)
        if verdict.reason is None:
            self._notify(self._observer.on_dropped, DROP_DEADLINE, tokens.size)
            raise DeadlineExceededError("the request's deadline had passed before it was queued")
        self._refuse(verdict, tokens.real_tokens)

    def _judge(self, tokens: int, deadline_left_s: float) -> Verdict:
        """Under the lock: whether a request of `tokens` real tokens is admitted now; a refusal is counted."""
        cost = self._cost.cost
        queued_requests, queued_tokens = self._queue.requests, self._queue.tokens
        now_ns = time.perf_counter_ns()
        shedding, limits = self._limits_now(now_ns)
        wait_s = self._predicted_wait_s(now_ns, limits)
        own_s = cost.batch_ns(tokens) / 1e9 if cost is not None and tokens else 0.0
        # The wait bound's floor (see glassbox.service.batching.admission): a full batch's rows queued or in the engine,
        # or, while the server sheds heavy overload, a full batch queued for the next engine thread to come free.
        queue_ahead = self._queue.items + self._in_flight >= limits.max_batch_size or (
            shedding and self._queue.items >= self._batch_rows(limits))
        reason = refusal(limits, self._draining, queued_requests, queued_tokens, tokens, wait_s, own_s,
                         deadline_left_s, queue_ahead=queue_ahead)
        if reason is not None:
            self._rejected[reason] += 1
            if reason == REJECT_PREDICTED_WAIT and queue_ahead:
                self._shed.refused(now_ns, limits.shed_window_s)
        return Verdict(reason, limits, queued_requests, queued_tokens, wait_s, own_s, deadline_left_s, shedding)

    def _limits_now(self, now_ns: int) -> tuple[bool, BatcherLimits]:
        """Under the lock: whether the server sheds heavy overload now, and the limits it obeys meanwhile."""
        if self._shed.shedding(now_ns, self._limits.shed_window_s):
            return True, self._shed_limits
        return False, self._limits

    def _refuse(self, verdict: Verdict, tokens: int) -> NoReturn:
        assert verdict.reason is not None
        self._notify(self._observer.on_rejected, verdict.reason)
        raise verdict.error(tokens)

    def _batch_rows(self, limits: BatcherLimits) -> int:
        """Under the lock: the most rows the next batch takes under `limits`. `max_batch_size`, or fewer when the
        engine's measured cost says that many rows of the queue's mean length would run longer than
        `max_batch_time_s`; at least one.
        A request that arrives as a batch starts waits for all of it: 32 texts on one core of a small CPU host run
        for several tenths of a second (docs/benchmarks/2026-12-02-batches-capped-by-time.md)."""
        rows, cost, queue = limits.max_batch_size, self._cost.cost, self._queue
        if cost is None or not queue.items:
            return rows
        fits = cost.rows_within(limits.max_batch_time_s * 1e9, queue.tokens / queue.items)
        return max(1, int(min(rows, fits)))

    def _predicted_wait_s(self, now_ns: int, limits: BatcherLimits) -> float | None:
        """Under the lock: how long a request admitted now would wait before its batch starts, in the batches
        `limits` form, at the measured cost on the device now serving; None before anything was measured."""
        cost = self._cost.cost
        if cost is None:
            return None
        # The first engine thread to come free takes the next batch: none has to, while one is idle.
        first_free_ns = 0.0
        if len(self._running) >= self._runners:
            first_free_ns = min(max(0.0, cost.batch_ns(tokens) - (now_ns - started))
                                for started, tokens, _ in self._running.values())
        return predicted_wait_s(self._queue.items, self._queue.tokens, self._batch_rows(limits), cost,
                                first_free_ns / 1e9, self._runners)

    def expire(self, ticket: _Ticket) -> None:
        """At a request's deadline, on its event loop: drop what is still queued and fail it. Items already in the
        engine are let finish."""
        dropped = self._withdraw(ticket, DROP_DEADLINE)
        if dropped:
            total = ticket.tokens.size
            where = "while it was queued" if dropped == total else f"with {dropped} of its {total} texts still queued"
            ticket.owner.fail(DeadlineExceededError(f"the request's deadline passed {where}"))

    def withdraw(self, ticket: _Ticket, reason: str = DROP_DISCONNECTED) -> int:
        """Drop what is still queued of an admitted request (its client left); the items dropped."""
        return self._withdraw(ticket, reason)

    def _withdraw(self, ticket: _Ticket, reason: str) -> int:
        with self._lock:
            dropped = self._queue.withdraw(ticket)
            self._count_dropped(reason, dropped)
        if dropped:
            self._notify(self._observer.on_dropped, reason, dropped)
        return dropped

    def release(self) -> None:
        """An admitted request was answered or given up: one fewer for the drain to wait for. On the event loop
        that called drain, once per request `admit` let in (`submit` calls it itself)."""
        with self._lock:
            self._pending -= 1
            drained = self._drained if self._pending == 0 else None
        if drained is not None:
            drained.set()

    # -- lifecycle and introspection (any thread) ---------------------------------------------------------

    def start(self) -> None:
        """Start the engine threads; a second call does nothing."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("a stopped batcher cannot be started again")
            if self._threads:
                return
            names = [f"glassbox-engine-{i}" for i in range(self._runners)] if self._runners > 1 else ["glassbox-engine"]
            self._threads = [threading.Thread(target=self._work, args=(index,), name=name, daemon=False)
                             for index, name in enumerate(names)]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the engine threads after their current batches; whatever is still queued is then answered with
        NotReadyError (call `drain` first to let it finish). Waits up to `timeout_s` (None: for good) for the
        threads to end; calling it again waits again. Idempotent."""
        with self._wake:
            self._stopping = self._draining = True
            self._wake.notify_all()
            threads = list(self._threads)
        if not threads:
            self._shut_queue()
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @property
    def accepting(self) -> bool:
        """False once drain or stop began (readiness can follow this)."""
        with self._lock:
            return not self._draining

    @property
    def limits(self) -> BatcherLimits:
        return self._limits

    def update_limits(self, limits: BatcherLimits) -> None:
        """Replace the limits; the next admission and the next batch obey them. Length buckets are fixed."""
        if limits.length_buckets != self._queue.buckets:
            raise ValueError("length buckets cannot change while the batcher runs")
        with self._wake:
            self._limits = limits
            self._shed_limits = limits.while_shedding()
            self._wake.notify()

    @property
    def depth(self) -> tuple[int, int]:
        """Queued (requests, real tokens); items already in the engine are not counted."""
        with self._lock:
            return self._queue.requests, self._queue.tokens

    def stats(self) -> BatcherStats:
        with self._lock:
            now_ns = time.perf_counter_ns()
            shedding, limits = self._limits_now(now_ns)
            wait_s = self._predicted_wait_s(now_ns, limits)
            if wait_s is None and not self._queue.items and not self._running:
                wait_s = 0.0  # idle: a request admitted now starts at once, whatever the engine's cost turns out to be
            return BatcherStats(
                batches_run=self._batches_run,
                items_run=self._items_run,
                engine_errors=self._engine_errors,
                dropped=MappingProxyType(dict(self._dropped)),
                rejected=MappingProxyType(dict(self._rejected)),
                in_flight_items=self._in_flight,
                pending_requests=self._pending,
                queued_requests=self._queue.requests,
                queued_tokens=self._queue.tokens,
                throughput_items_per_s=self._meter.items_per_s,
                throughput_tokens_per_s=self._meter.tokens_per_s,
                throughput_device=self._meter.device,
                predicted_wait_s=wait_s,
                shedding=shedding,
            )

    # -- engine thread ------------------------------------------------------------------------------------

    def _work(self, index: int = 0) -> None:
        """Engine thread `index`. A batch that starts while no other runs goes to thread 0: the runtime lets that
        one thread use every intra-op thread (service/runtime.py, IntraOpTeams); the others join in, side by side,
        while a batch runs."""
        if self._on_thread_start is not None:
            self._notify(self._on_thread_start, index)
        try:
            while True:
                with self._wake:
                    while not self._stopping and (self._queue.items == 0 or (index > 0 and not self._running)):
                        self._wake.wait()
                    self._hold()
                    if self._stopping:
                        return
                    if index > 0 and not self._running:
                        continue  # the batches it would have run beside have ended: thread 0 takes this one
                    _, limits = self._limits_now(time.perf_counter_ns())
                    taken = self._queue.take(
                        self._clock(), self._batch_rows(limits), limits.max_batch_tokens, limits.max_padding_ratio
                    )
                    batch_id = self._next_batch_id
                    if taken.items:
                        self._next_batch_id += 1
                        self._running[batch_id] = (time.perf_counter_ns(), sum(i.length for i in taken.items),
                                                   len(taken.items))
                        self._in_flight += len(taken.items)
                        if self._runners > 1 and self._queue.items:
                            self._wake.notify()  # rows left over: another engine thread may run them beside this
                    running = len(self._running)
                    if running == 1 and self._runners > 1 and self._former.expected_rows(time.perf_counter_ns()) > \
                            self._in_flight:
                        # Alone now, but the recent load keeps more rows in the server than the engine holds: another
                        # batch will start beside this one, so it takes its share as if that one ran already (a team
                        # of every core would then share them with it, its workers waiting at each barrier).
                        running = 2
                    expired_items = sum(n for _, n in taken.expired)
                    self._count_dropped(DROP_DEADLINE, expired_items)
                if taken.expired:  # rarely: no list, no closure for the batches of a server that keeps up
                    self._hand_back.fail_all([ticket for ticket, _ in taken.expired], lambda: DeadlineExceededError(
                        "the request's deadline passed while it was queued"))
                if expired_items:
                    self._notify(self._observer.on_dropped, DROP_DEADLINE, expired_items)
                if taken.items:
                    if self._share_threads is not None:
                        self._share_threads(running)
                    self._run(taken.items, batch_id)
        except Exception:
            self._log.exception("the engine thread stopped on an unexpected error")
        finally:
            with self._wake:
                self._stopping = self._draining = True
                self._wake.notify_all()  # the other engine threads stop too
            self._shut_queue()

    def _hold(self) -> None:
        """Under the lock, with work queued and the engine free: wait while the former expects more rows soon.
        Every submit wakes the condition, so the decision is taken again at each arrival."""
        start = time.perf_counter_ns()
        while not self._stopping and not self._draining and self._queue.items:
            now_ns = time.perf_counter_ns()
            wait_ns = self._former.decide(now_ns, self._queue.items, self._batch_rows(self._limits_now(now_ns)[1]),
                                          start, in_engine_rows=self._in_flight)
            if wait_ns == GO:
                return
            self._wake.wait(wait_ns / 1e9)

    def _run(self, items: Sequence[Item[Collector]], batch_id: int) -> None:
        try:
            batch = stack_rows(items, self._pad_id)  # ids [n, longest]
            result = self._engine.run(batch)
            check_rows(result, batch.size)
        except Exception as exc:  # the worker must outlive any one batch
            self._engine_failed(items, batch_id, exc)
            return
        timing = result.timing
        with self._wake:
            self._end_run(batch_id)
            self._batches_run += 1
            self._items_run += batch.size
            self._meter.record(timing.device, batch.size, batch.real_tokens, timing.end_ns - timing.start_ns)
            busy_ns = timing.end_ns - timing.start_ns
            self._cost.record(timing.device, batch.real_tokens, busy_ns)
            cost = self._cost.cost
            self._former.ran(busy_ns, cost.fixed_ns if cost is not None else 0.0)
            depth_after = self._queue.requests
            if self._runners > 1:
                self._wake.notify()  # another engine thread may be holding for rows this batch's answers bring back
        self._hand_back.answers(items, batch_id, batch, result, depth_after)

    def _end_run(self, batch_id: int) -> None:
        # Under the lock: the batch left the engine.
        ended = self._running.pop(batch_id, None)
        if ended is not None:
            self._in_flight -= ended[2]

    def _engine_failed(self, items: Sequence[Item[Collector]], batch_id: int, exc: Exception) -> None:
        tickets = [ticket for ticket, _, _ in by_ticket(items)]
        with self._lock:
            self._end_run(batch_id)
            self._engine_errors += 1
            # The rest of a failed request is moot: it can no longer be answered in full.
            dropped = sum(self._queue.withdraw(ticket) for ticket in tickets)
            self._count_dropped(DROP_FAILED, dropped)
        self._log.error("engine run of batch %d (%d rows) failed", batch_id, len(items), exc_info=exc)
        self._hand_back.failure(tickets, batch_id, exc)
        if dropped:
            self._notify(self._observer.on_dropped, DROP_FAILED, dropped)

    def _shut_queue(self) -> None:
        with self._lock:
            leftovers = self._queue.withdraw_all()
            dropped = sum(n for _, n in leftovers)
            self._count_dropped(DROP_SHUTDOWN, dropped)
        self._hand_back.fail_all([ticket for ticket, _ in leftovers],
                                 lambda: NotReadyError("the server stopped before this request ran"))
        if dropped:
            self._notify(self._observer.on_dropped, DROP_SHUTDOWN, dropped)

    def _count_dropped(self, reason: str, items: int) -> None:
        # Under the lock. Only reasons that happened appear in stats().dropped.
        if items:
            self._dropped[reason] += items
