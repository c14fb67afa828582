"""The open-loop load generator: requests leave on the plan's schedule whether or not earlier ones came back.

How it avoids coordinated omission: every request has an intended send time from the RatePlan, and its latency
is measured from that time to the last byte of the answer. If the server stalls, requests keep coming due; they
wait (for a free connection, then for the server) and the wait is in their latency, where a closed-loop tool
would simply have sent less and reported the stall as one slow request.

Shape of a run: one scheduler coroutine releases requests at their send times into a FIFO line; `connections`
worker coroutines, each owning one keep-alive HTTP/1.1 connection (glassbox.chaos.loadgen.http1), take them in order
and send them. A request still waiting when its timeout (counted from its intended time, like its latency) has
passed is recorded as a timeout without being sent. When `max_outstanding` requests are queued or in flight, a
newly due request is recorded as `backlog` and never sent, so a dead server cannot make the generator's memory
grow without bound. After the plan's duration the scheduler stops; queued and in-flight requests finish or time
out, which bounds the drain by `timeout_s`.

The generator's own pauses count in every latency it measures. So for the run its thread asks the kernel for a short
scheduler slice (Linux 6.12+), so that it runs sooner when it wakes while the server keeps the cores busy; and it
moves what is alive at its start (the imports, the rendered requests) to the garbage collector's permanent
generation, unless something in the process already froze objects: a full collection in the middle of a `glassbox
chaos run` walked all of it and stalled the generator for 56-92 ms (docs/benchmarks/2026-12-04-shedding.md), a
stall that every request in flight then showed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from glassbox.chaos.loadgen.bodies import PROTOCOLS, Bodies, Protocol, build_bodies
from glassbox.chaos.loadgen.dispatch import Dispatcher
from glassbox.chaos.loadgen.http1 import ConnectFailed, Endpoint, Http1Connection, TransportFailed
from glassbox.chaos.loadgen.plan import RatePlan
from glassbox.chaos.loadgen.progress import Snapshot, show_progress
from glassbox.chaos.loadgen.result import LoadResult, Recorder
from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice, thread_slice_ns
from glassbox.chaos.loadgen.texts import MIX_SIZE, default_mix, shuffled
from glassbox.chaos.samples import ErrorKind, Sample, error_kind_for_status

SLICE_NS = 100_000  # the scheduler slice the generator's thread asks for during a run (chaos/loadgen/slice.py)
MAX_CONNECTIONS = 10_000
MIN_SLEEP_S = 0.001
TICK_S = 0.05  # the longest the scheduler sleeps at once, so stop() is noticed promptly at low rates
DRAIN_SLACK_S = 2.0  # beyond timeout_s, before requests still open after the window are cancelled
YIELD_EVERY = 256  # requests released back to back (when the scheduler is late) before it lets workers run


@dataclass(frozen=True, slots=True)
class LoadConfig:
    target: str  # base URL of the server, http:// or https://
    plan: RatePlan
    protocol: Protocol = "json"
    texts: Sequence[str] | None = None  # None: the built-in review-like mix (glassbox.chaos.loadgen.texts)
    connections: int = 64
    timeout_s: float = 10.0  # per request, from its intended send time
    seed: int = 0  # the order of the texts (and the built-in mix itself)
    max_outstanding: int = 10_000  # queued + in flight; more are recorded as "backlog" and not sent
    keep_samples: bool = True  # False: only the histogram and counts (long runs at high rates)
    # Texts sent instead of `texts` by the requests due in [start_s, end_s) of the plan (an experiment's fault
    # phase: a shift in the inputs).
    shifted_texts: Sequence[str] | None = None
    shifted_window: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        Endpoint.parse(self.target)  # raises ValueError naming the problem
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if not 1 <= self.connections <= MAX_CONNECTIONS:
            raise ValueError(f"connections must be between 1 and {MAX_CONNECTIONS}, got {self.connections}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_outstanding < 1:
            raise ValueError(f"max_outstanding must be at least 1, got {self.max_outstanding}")
        if self.texts is not None and not self.texts:
            raise ValueError("texts is empty: pass None for the built-in mix")
        if self.shifted_texts is not None and not self.shifted_texts:
            raise ValueError("shifted_texts is empty: pass None to send the same texts throughout")

    def to_json(self) -> dict[str, Any]:
        texts = (f"built-in mix ({MIX_SIZE} texts, seed {self.seed})" if self.texts is None
                 else f"{len(self.texts)} given texts")
        shifted = {} if self.shifted_texts is None else {
            "shifted_texts": f"{len(self.shifted_texts)} given texts from {self.shifted_window[0]:g} s to "
                             f"{self.shifted_window[1]:g} s"}
        return {"target": self.target, "protocol": self.protocol, "connections": self.connections,
                "timeout_s": self.timeout_s, "seed": self.seed, "max_outstanding": self.max_outstanding,
                "texts": texts, **shifted, "plan": self.plan.to_json()}


def classify_failure(exc: BaseException) -> ErrorKind:
    """A failed request's error kind: its own timeout, a connection that would not open, or one that broke."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectFailed):
        return "connect"
    return "transport"


class LoadGenerator:
    """Runs one LoadConfig once. `started_at` is time.monotonic() at the start of the schedule: sample times
    (`intended_s`, `done_s`) are offsets from it, so a caller can place its own events on the same clock."""

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        texts = shuffled(config.texts, config.seed) if config.texts is not None else default_mix(config.seed)
        self.bodies: Bodies = build_bodies(texts, config.protocol)
        self.endpoint = Endpoint.parse(config.target)
        # Whole requests rendered once: a request costs the generator one write and one parse of the answer.
        self._requests = self._render(self.bodies)
        self._shifted = self._requests
        if config.shifted_texts is not None:
            self._shifted = self._render(build_bodies(shuffled(config.shifted_texts, config.seed), config.protocol))
        self.planned = config.plan.count
        self.started_at: float | None = None
        self.scheduled = 0
        self.outstanding = 0  # queued + in flight
        self._recorder: Recorder | None = None
        self._stopping = False
        self._stopped_at: float | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def _render(self, bodies: Bodies) -> tuple[bytes, ...]:
        return tuple(self.endpoint.render_post(bodies.path, bodies.content_type, body) for body in bodies.bodies)

    # --- control ----------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """End the run early: nothing more is sent, and queued and in-flight requests are cancelled (counted in
        `cancelled`, not sampled). Safe to call from another thread, before or during the run."""
        loop = self._loop
        if loop is not None and loop.is_running() and threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self._stop_now)
        else:
            self._stop_now()

    def _stop_now(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._stopped_at = time.monotonic()
        if self._wake is not None:
            self._wake.set()

    def snapshot(self) -> Snapshot:
        rec = self._recorder
        elapsed = time.monotonic() - self.started_at if self.started_at is not None else 0.0
        return Snapshot(elapsed, self.config.plan.duration_s, self.planned, self.scheduled,
                        rec.recorded if rec else 0, rec.ok if rec else 0,
                        rec.recorded - rec.ok if rec else 0, self.outstanding)

    # --- the run ----------------------------------------------------------------------------------------------------
    async def run(self, progress: bool = False, on_sample: Callable[[Sample], None] | None = None) -> LoadResult:
        if self._recorder is not None:
            raise RuntimeError("a LoadGenerator runs once; make a new one for another run")
        config = self.config
        record = Recorder(window_s=config.plan.duration_s, keep_samples=config.keep_samples, on_sample=on_sample)
        self._recorder = record
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        if self._stopping:
            self._wake.set()
        line: Dispatcher[tuple[int, float]] = Dispatcher()
        cpu_at_start = time.process_time()
        froze = gc.get_freeze_count() == 0  # otherwise someone else froze objects: leave the permanent generation be
        if froze:
            gc.freeze()
        sliced = thread_slice_ns() != SLICE_NS and set_thread_slice(SLICE_NS)
        slice_ns = thread_slice_ns()
        self.started_at = time.monotonic()
        workers = [asyncio.create_task(self._worker(line, record)) for _ in range(config.connections)]
        for worker in workers:
            worker.add_done_callback(self._on_worker_done)
        shown = asyncio.create_task(show_progress(self.snapshot)) if progress else None
        try:
            await self._schedule(line, record)
            line.close()  # workers finish what is queued, then end
            await self._drain(workers)
        finally:
            for worker in workers:
                worker.cancel()
            results = await asyncio.gather(*workers, return_exceptions=True)
            if shown is not None:
                shown.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await shown
            if froze:
                gc.unfreeze()
            if sliced:
                set_thread_slice(DEFAULT_SLICE)
        ended = time.monotonic()
        for outcome in results:
            if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                raise outcome
        window_end = min(self._stopped_at or ended, self.started_at + config.plan.duration_s)
        return LoadResult(
            samples=record.samples, duration_s=max(0.0, window_end - self.started_at),
            elapsed_s=ended - self.started_at, planned=self.planned, scheduled=self.scheduled,
            recorded=record.recorded, cancelled=self.scheduled - record.recorded, ok=record.ok,
            answered=record.answered, answered_in_window=record.answered_in_window,
            ok_in_window=record.ok_in_window, errors=dict(record.errors), histogram=record.histogram, lags=record.lags,
            stopped=self._stopped_at is not None, config=config.to_json(), cpu_s=time.process_time() - cpu_at_start,
            slice_ns=slice_ns,
        )

    def _on_worker_done(self, task: asyncio.Task[None]) -> None:
        # A worker only ends early on a bug; stop the run so the error surfaces now, not after the whole plan.
        if not task.cancelled() and task.exception() is not None:
            self._stop_now()

    async def _schedule(self, line: Dispatcher[tuple[int, float]], record: Recorder) -> None:
        assert self.started_at is not None
        start = self.started_at
        limit = self.config.max_outstanding
        in_a_row = 0
        for index, intended in enumerate(self.config.plan.times()):
            while (delay := start + intended - time.monotonic()) > 0 and not self._stopping:
                in_a_row = 0
                # Never less than a millisecond: event-loop timers have millisecond resolution (uvloop's may fire
                # up to 1 ms early), and re-sleeping for the remainder would spin. The lateness this allows is
                # measured (scheduler_lag) and, like any lateness, counts in the request's latency.
                await asyncio.sleep(min(max(delay, MIN_SLEEP_S), TICK_S))
            if self._stopping:
                return
            self.scheduled += 1
            record.lag(time.monotonic() - start - intended)
            if self.outstanding >= limit:
                record(Sample(intended, 0.0, 0, "backlog"))
            else:
                self.outstanding += 1
                line.put((index, intended))
            in_a_row += 1
            if in_a_row >= YIELD_EVERY:  # running late: let the workers send what is due before releasing more
                in_a_row = 0
                await asyncio.sleep(0)
        end = start + self.config.plan.duration_s
        while (left := end - time.monotonic()) > 0 and not self._stopping:
            await asyncio.sleep(min(left, TICK_S))

    async def _drain(self, workers: list[asyncio.Task[None]]) -> None:
        assert self._wake is not None
        if self._stopping:
            return
        finished = asyncio.ensure_future(asyncio.wait(workers))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({finished, woken}, timeout=self.config.timeout_s + DRAIN_SLACK_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            finished.cancel()
            woken.cancel()

    async def _worker(self, line: Dispatcher[tuple[int, float]], record: Recorder) -> None:
        assert self.started_at is not None
        start = self.started_at
        timeout = self.config.timeout_s
        requests, shifted = self._requests, self._shifted
        count, shifted_count = len(requests), len(shifted)
        shift_start, shift_end = self.config.shifted_window
        connection = Http1Connection(self.endpoint)
        try:
            while (item := await line.get()) is not None:
                index, intended = item
                left = start + intended + timeout - time.monotonic()
                status = 0
                error: ErrorKind | None = None
                try:
                    if left <= 0:
                        error = "timeout"  # waited its whole timeout for a connection: never sent
                    else:
                        async with asyncio.timeout(left):
                            status = await connection.request(
                                shifted[index % shifted_count] if shift_start <= intended < shift_end
                                else requests[index % count])
                        error = error_kind_for_status(status)
                except (TimeoutError, ConnectFailed, TransportFailed) as exc:
                    error = classify_failure(exc)
                finally:
                    self.outstanding -= 1
                latency = timeout if left <= 0 else time.monotonic() - start - intended
                record(Sample(intended, latency, status, error))
        finally:
            connection.close()
