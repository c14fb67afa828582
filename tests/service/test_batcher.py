"""The batcher end to end with a fake engine: real engine thread, real event loop, no sleeps, no timing asserts.

Tests run their scenario with `asyncio.run` (pytest-asyncio is not installed; no plugin needed). To pile work
up deterministically the fake engine blocks inside `run` until its gate is set: a test closes the gate,
submits a first request, waits (threading primitive, bounded) until the engine holds it, queues more, then
opens the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

from glassbox.service.batching import Batcher, BatcherLimits, SubmitResult
from glassbox.service.batching.waiter import Waiter
from glassbox.service.errors import (
    DeadlineExceededError,
    DeviceUnavailableError,
    EmptyInputError,
    EngineError,
    NotReadyError,
    OverloadedError,
)
from glassbox.service.observer import BatchRecord, RequestRecord, SpanRef
from glassbox.service.types import TokenBatch
from tests.service.apptools import FakeEngine, RecordingObserver, expected_logits

T = TypeVar("T")
FAR = 10**18  # a deadline that never passes
WAIT_S = 10.0  # upper bound on any wait for the engine thread; only reached when a test is already failing


class FakeClock:
    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def tokens(*lengths: int, first_id: int = 1) -> TokenBatch:
    """Rows with ids first_id, first_id+1, ... (so each row is recognisable), padded with 0."""
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)  # [n, longest]
    next_id = first_id
    for row, length in enumerate(lengths):
        ids[row, :length] = np.arange(next_id, next_id + length)
        next_id += length
    return TokenBatch(ids, np.array(lengths, dtype=np.int64), np.zeros(len(lengths), dtype=np.bool_))


def limits(**changes: Any) -> BatcherLimits:
    base = BatcherLimits(max_batch_size=8, max_batch_tokens=4096, max_queue_requests=100,
                         max_queue_tokens=100_000, length_buckets=(8, 16, 32, 64))
    return dataclasses.replace(base, **changes)


@contextlib.contextmanager
def running(engine: FakeEngine, lim: BatcherLimits | None = None, **kwargs: Any) -> Iterator[Batcher]:
    batcher = Batcher(engine, lim or limits(), **kwargs)
    batcher.start()
    try:
        yield batcher
    finally:
        engine.run_gate.set()
        batcher.stop(timeout_s=WAIT_S)
        assert not any(t.name == "glassbox-engine" and t.is_alive() for t in threading.enumerate())


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(scenario(), WAIT_S))


async def settle(predicate: Callable[[], bool]) -> None:
    """Let event-loop tasks run until `predicate` holds (loop-side state only; no sleeping)."""
    for _ in range(100):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def submit(batcher: Batcher, batch: TokenBatch, request_id: str = "", deadline_ns: int = FAR
           ) -> asyncio.Task[SubmitResult]:
    return asyncio.create_task(batcher.submit(batch, deadline_ns, request_id=request_id))


async def hold_engine(batcher: Batcher, engine: FakeEngine, length: int = 3) -> asyncio.Task[SubmitResult]:
    """Close the gate and put one request (one row of `length` tokens) into the engine, so that what follows queues
    up behind it."""
    engine.run_gate.clear()
    runs_before = len(engine.batches)  # the engine is idle here: every earlier request was answered
    first = submit(batcher, tokens(length, first_id=900), "held")
    await settle(lambda: batcher.stats().pending_requests == 1)
    engine.wait_for_batches(runs_before + 1)
    return first


async def queue_three_behind(batcher: Batcher, engine: FakeEngine
                             ) -> tuple[asyncio.Task[SubmitResult], list[asyncio.Task[SubmitResult]]]:
    """Hold the engine on one request and queue three more (r0, r1, r2, two rows each) behind it."""
    first = await hold_engine(batcher, engine)
    rest = [submit(batcher, tokens(2, first_id=10 * i), f"r{i}") for i in range(3)]
    await settle(lambda: batcher.depth == (3, 6))
    return first, rest


# -- splitting, packing, grouping ----------------------------------------------------------------------------


def test_a_request_is_split_across_batches_and_reassembled_in_order() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=2)) as batcher:
            batch = tokens(30, 3, 20, 4, 31, 2, 9)
            result = await batcher.submit(batch, FAR, request_id="r")
        np.testing.assert_array_equal(result.logits, expected_logits(batch))
        # buckets 8/16/32/64, two rows a batch: 31 and 2 run alone because 9 (bucket 16) would pad too much
        assert [b.lengths.tolist() for b in engine.batches] == [[30, 20], [3, 4], [31], [2], [9]]
        assert result.batch_ids == (1, 2, 3, 4, 5)
        assert (result.device, result.engine_mode) == ("cpu", "eager")
        assert result.queue_start_ns <= result.queue_end_ns == result.infer_start_ns <= result.infer_end_ns

    run(scenario)


def test_a_request_whose_rows_run_in_one_batch_out_of_order_gets_them_back_in_its_own_order() -> None:
    """The batch takes rows by length bucket, so a request's rows can sit in it in another order than the request's."""
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=8, max_padding_ratio=0.99)) as batcher:
            batch = tokens(3, 9, 4)
            result = await batcher.submit(batch, FAR, request_id="r")
        np.testing.assert_array_equal(result.logits, expected_logits(batch))
        [only] = engine.batches
        assert only.lengths.tolist() != batch.lengths.tolist()  # the batch's order is not the request's
        assert result.batch_ids == (1,) and result.queue_end_ns == result.infer_start_ns <= result.infer_end_ns

    run(scenario)


def test_idle_engine_takes_the_first_request_at_once_and_then_batches_what_piled_up() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        with running(engine, observer=observer) as batcher:
            first = await hold_engine(batcher, engine)  # returns only once the engine holds it
            assert engine.batches[0].size == 1  # it did not wait for company
            rest = [submit(batcher, tokens(2, first_id=10 * i), f"r{i}") for i in range(3)]
            await settle(lambda: batcher.depth == (3, 6))
            engine.run_gate.set()
            results = await asyncio.gather(first, *rest)
        assert [b.size for b in engine.batches] == [1, 3]  # the three queued requests shared one batch
        assert [r.batch_ids for r in results] == [(1,), (2,), (2,), (2,)]
        for i, result in enumerate(results[1:]):
            np.testing.assert_array_equal(result.logits, expected_logits(tokens(2, first_id=10 * i)))
        assert [(b.batch_id, b.request_ids) for b in observer.batches] == [(1, ("held",)), (2, ("r0", "r1", "r2"))]
        assert observer.batches[1].queue_depth_after == 0

    run(scenario)


def test_a_batch_hands_all_its_answers_to_the_event_loop_at_once() -> None:
    """Each hand-over wakes the event loop, which then contends with the engine thread for the GIL: a batch of
    three requests is one call_soon_threadsafe, not three."""
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        handed_over: list[str] = []
        plain = loop.call_soon_threadsafe

        def counting(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Handle:
            if threading.current_thread() is not threading.main_thread():
                handed_over.append(getattr(callback, "__name__", repr(callback)))
            return plain(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        with running(engine) as batcher:
            first, rest = await queue_three_behind(batcher, engine)
            engine.run_gate.set()
            results = await asyncio.gather(first, *rest)
        assert [b.size for b in engine.batches] == [1, 3]
        assert len(handed_over) == 2  # one per batch
        for i, result in enumerate(results[1:]):
            np.testing.assert_array_equal(result.logits, expected_logits(tokens(2, first_id=10 * i)))

    run(scenario)


def test_a_delivery_that_fails_fails_its_own_request_and_the_rest_of_the_batch_is_answered() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine) as batcher:
            first, rest = await queue_three_behind(batcher, engine)
            original = Waiter.deliver

            def deliver(self: Waiter, *args: Any, **kwargs: Any) -> None:
                if self.request_id == "r1":
                    raise RuntimeError("bookkeeping bug")
                original(self, *args, **kwargs)

            Waiter.deliver = deliver  # type: ignore[method-assign]
            try:
                engine.run_gate.set()
                results = await asyncio.gather(first, *rest, return_exceptions=True)
            finally:
                Waiter.deliver = original  # type: ignore[method-assign]
        assert isinstance(results[2], RuntimeError)
        assert [isinstance(r, SubmitResult) for r in results] == [True, True, False, True]

    run(scenario)


def test_batches_respect_max_batch_size_and_max_batch_tokens() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=3, max_batch_tokens=40, length_buckets=(64,))) as batcher:
            first = await hold_engine(batcher, engine)
            by_size = submit(batcher, tokens(*[10] * 7, first_id=1))  # 3 x 10 <= 40: the size cap binds
            by_tokens = submit(batcher, tokens(*[15] * 3, first_id=100))  # 3 x 15 > 40: the token cap binds
            await settle(lambda: batcher.depth[0] == 2)
            engine.run_gate.set()
            await asyncio.gather(first, by_size, by_tokens)
        shapes = [(b.size, b.max_length) for b in engine.batches[1:]]
        # the last 10 rides with the first 15 (2 x 15 <= 40); three 15s would be 45 > 40
        assert shapes == [(3, 10), (3, 10), (2, 15), (2, 15)]
        assert all(b.size <= 3 and b.size * b.max_length <= 40 for b in engine.batches)

    run(scenario)


def test_one_item_beyond_the_token_budget_still_runs_alone() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(max_batch_tokens=16, length_buckets=(64,))) as batcher:
            batch = tokens(50, 2)
            result = await batcher.submit(batch, FAR)
        np.testing.assert_array_equal(result.logits, expected_logits(batch))
        assert [(b.size, b.max_length) for b in engine.batches] == [(1, 50), (1, 2)]

    run(scenario)


def test_queued_items_are_grouped_by_length_bucket() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(length_buckets=(8, 16, 32))) as batcher:
            first = await hold_engine(batcher, engine)
            lengths = (30, 5, 31, 6, 29, 7)
            tasks = [submit(batcher, tokens(n, first_id=100 * i)) for i, n in enumerate(lengths)]
            await settle(lambda: batcher.depth[0] == 6)
            engine.run_gate.set()
            await asyncio.gather(first, *tasks)
        assert [b.lengths.tolist() for b in engine.batches[1:]] == [[30, 31, 29], [5, 6, 7]]

    run(scenario)


def test_rows_of_different_requests_are_padded_with_the_pad_id() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(length_buckets=(64,)), pad_id=7) as batcher:
            first = await hold_engine(batcher, engine)
            a, b = submit(batcher, tokens(4, first_id=10)), submit(batcher, tokens(2, first_id=20))
            await settle(lambda: batcher.depth[0] == 2)
            engine.run_gate.set()
            await asyncio.gather(first, a, b)
        assert engine.batches[1].ids.tolist() == [[10, 11, 12, 13], [20, 21, 7, 7]]

    run(scenario)


# -- deadlines and disconnects -------------------------------------------------------------------------------


def test_a_deadline_passed_at_submit_is_refused_without_queueing() -> None:
    engine, observer, clock = FakeEngine(ns_per_token=1000), RecordingObserver(), FakeClock()

    async def scenario() -> None:
        with running(engine, observer=observer, clock=clock) as batcher:
            with pytest.raises(DeadlineExceededError):
                await batcher.submit(tokens(3, 4), clock.now)
            assert batcher.stats().dropped == {"deadline": 2}
        assert engine.batches == [] and observer.dropped == [("deadline", 2)]

    run(scenario)


def test_the_deadline_timer_drops_queued_items_while_the_engine_is_busy() -> None:
    engine, observer, clock = FakeEngine(ns_per_token=1000), RecordingObserver(), FakeClock()

    async def scenario() -> None:
        with running(engine, observer=observer, clock=clock) as batcher:
            first = await hold_engine(batcher, engine)
            late = submit(batcher, tokens(3, 4, first_id=500), deadline_ns=clock.now + 1)  # timer fires at once
            with pytest.raises(DeadlineExceededError):
                await late
            assert batcher.depth == (0, 0) and len(engine.batches) == 1  # answered while the engine still held
            engine.run_gate.set()
            await first
        assert not engine.seen_ids() & set(range(500, 600))
        assert observer.dropped == [("deadline", 2)]

    run(scenario)


def test_a_deadline_that_passes_with_part_of_a_request_in_the_engine_says_how_much_was_left() -> None:
    engine, clock = FakeEngine(ns_per_token=1000), FakeClock()

    async def scenario() -> None:
        with running(engine, limits(length_buckets=(8, 32)), clock=clock) as batcher:
            engine.run_gate.clear()
            # Two length buckets: two batches.
            late = submit(batcher, tokens(5, 30, first_id=500), deadline_ns=clock.now + 10**8)
            await asyncio.to_thread(engine.wait_for_batches, 1)  # the first row is in the engine, the other queued
            with pytest.raises(DeadlineExceededError, match="with 1 of its 2 texts still queued"):
                await late  # the loop's timer fires 100 ms on, while the engine still holds the first row
            engine.run_gate.set()
        assert [b.size for b in engine.batches] == [1]

    run(scenario)


def test_the_engine_thread_drops_items_whose_deadline_passed_in_the_queue() -> None:
    engine, observer, clock = FakeEngine(ns_per_token=1000), RecordingObserver(), FakeClock()

    async def scenario() -> None:
        with running(engine, observer=observer, clock=clock) as batcher:
            first = await hold_engine(batcher, engine)
            deadline = clock.now + 10**12  # the loop's timer is 1000 s away; only the engine thread can see this
            late = submit(batcher, tokens(3, 40, first_id=500), deadline_ns=deadline)
            ok = submit(batcher, tokens(5, first_id=700), deadline_ns=deadline + 1)
            await settle(lambda: batcher.depth[0] == 2)
            clock.now = deadline
            engine.run_gate.set()
            with pytest.raises(DeadlineExceededError):
                await late
            await asyncio.gather(first, ok)
            assert batcher.stats().dropped == {"deadline": 2}
        assert not engine.seen_ids() & set(range(500, 600))
        assert observer.dropped == [("deadline", 2)]

    run(scenario)


def test_a_cancelled_request_is_dropped_before_the_engine() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        with running(engine, observer=observer) as batcher:
            first = await hold_engine(batcher, engine)
            gone = submit(batcher, tokens(3, 4, 5, first_id=500))
            stays = submit(batcher, tokens(6, first_id=700))
            await settle(lambda: batcher.depth[0] == 2)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert batcher.depth == (1, 6)
            engine.run_gate.set()
            result = await stays
            await first
            assert batcher.stats().dropped == {"disconnected": 3}
        np.testing.assert_array_equal(result.logits, expected_logits(tokens(6, first_id=700)))
        assert not engine.seen_ids() & set(range(500, 600))
        assert observer.dropped == [("disconnected", 3)]

    run(scenario)


def test_cancelling_a_request_already_in_the_engine_drops_nothing_and_the_worker_goes_on() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine) as batcher:
            first = await hold_engine(batcher, engine)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            engine.run_gate.set()
            after = await batcher.submit(tokens(2, first_id=5), FAR)
            assert batcher.stats().dropped == {}
        np.testing.assert_array_equal(after.logits, expected_logits(tokens(2, first_id=5)))
        assert len(engine.batches) == 2

    run(scenario)


# -- admission control ---------------------------------------------------------------------------------------


def test_a_full_request_queue_answers_overloaded_with_retry_after() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        with running(engine, limits(max_queue_requests=2), observer=observer) as batcher:
            first = await hold_engine(batcher, engine)  # in the engine, so no longer queued
            queued = [submit(batcher, tokens(4)), submit(batcher, tokens(5))]
            await settle(lambda: batcher.depth[0] == 2)
            with pytest.raises(OverloadedError) as refused:
                await batcher.submit(tokens(2), FAR)
            assert refused.value.retry_after_s >= 1.0 and refused.value.retry_after_s.is_integer()
            assert batcher.stats().rejected == {"queue_full_requests": 1}
            engine.run_gate.set()
            await asyncio.gather(first, *queued)
        assert observer.rejected == ["queue_full_requests"]

    run(scenario)


def test_an_idle_batcher_predicts_no_wait_before_anything_was_measured() -> None:
    # The autoscaler's queue-fill query divides this gauge by the bound: absent on a fresh replica, KEDA would take the
    # empty result for an error. While work waits unmeasured there is no prediction to give.
    engine = FakeEngine(ns_per_token=10**7)

    async def scenario() -> None:
        with running(engine, limits()) as batcher:
            assert batcher.stats().predicted_wait_s == 0.0
            first = await hold_engine(batcher, engine)
            assert batcher.stats().predicted_wait_s is None  # running, and no batch has finished yet
            engine.run_gate.set()
            await first
            assert batcher.stats().predicted_wait_s == 0.0

    run(scenario)


def test_a_full_token_queue_answers_overloaded_with_retry_after_from_measured_throughput() -> None:
    engine, observer = FakeEngine(ns_per_token=10**7), RecordingObserver()  # 100 tokens per engine-second

    async def scenario() -> None:
        with running(engine, limits(max_queue_tokens=500), observer=observer) as batcher:
            await batcher.submit(tokens(50, 50), FAR)  # measure
            assert batcher.stats().throughput_tokens_per_s == pytest.approx(100.0)
            first = await hold_engine(batcher, engine)
            queued = submit(batcher, tokens(*[50] * 9))  # 450 tokens queued
            await settle(lambda: batcher.depth == (1, 450))
            with pytest.raises(OverloadedError) as refused:
                await batcher.submit(tokens(51), FAR)
            # 9 queued rows are one full batch of 8 ahead of a new request: 400 of the 450 queued tokens at 100
            # tokens/s, after the running 3-token batch (0.03 s): 4.03 s, rounded up
            assert refused.value.retry_after_s == 5.0
            engine.run_gate.set()
            await asyncio.gather(first, queued)
        assert observer.rejected == ["queue_full_tokens"]

    run(scenario)


def test_a_batch_takes_only_the_rows_its_measured_cost_fits_in_the_batch_time_bound() -> None:
    engine = FakeEngine(ns_per_token=10**7)  # 10 ms per real token

    async def scenario() -> None:
        with running(engine, limits(max_batch_time_s=0.1)) as batcher:
            await batcher.submit(tokens(4, 4), FAR)  # measure: nothing capped before the cost is known
            first = await hold_engine(batcher, engine)
            eight = submit(batcher, tokens(*[3] * 8, first_id=100))  # 8 rows of 30 ms each
            await settle(lambda: batcher.depth == (1, 24))
            engine.run_gate.set()
            await first
            result = await eight
        np.testing.assert_array_equal(result.logits, expected_logits(tokens(*[3] * 8, first_id=100)))
        # 100 ms holds 3 rows of 30 ms: the 8 queued rows go as 3 + 3 + 2, not as one batch of 8 (240 ms)
        assert [b.size for b in engine.batches] == [2, 1, 3, 3, 2]

    run(scenario)


def test_the_wait_bound_applies_once_a_full_batch_is_queued_or_in_the_engine() -> None:
    engine, observer = FakeEngine(ns_per_token=10**7), RecordingObserver()  # 10 ms per real token

    async def scenario() -> None:
        lim = limits(max_batch_size=2, max_queue_wait_s=0.05)
        with running(engine, lim, observer=observer) as batcher:
            await batcher.submit(tokens(2), FAR)  # measure
            engine.run_gate.clear()
            held = submit(batcher, tokens(30, first_id=500))  # one row, predicted to run 300 ms
            await asyncio.to_thread(engine.wait_for_batches, 2)
            # One row in the engine is less than a full batch: admitted although its wait (~300 ms) is over the bound.
            batcher.check_admission(FAR)
            below = submit(batcher, tokens(3, first_id=600))
            await settle(lambda: batcher.depth == (1, 3))
            # One queued and one in the engine make a full batch of 2: the bound now refuses, before tokenizing too.
            with pytest.raises(OverloadedError):
                batcher.check_admission(FAR)
            with pytest.raises(OverloadedError):
                await batcher.submit(tokens(3, first_id=700), FAR)
            engine.run_gate.set()
            await asyncio.gather(held, below)

            # A full batch in the engine and nothing queued: refused as well.
            engine.run_gate.clear()
            full = submit(batcher, tokens(30, 30, first_id=800))
            await asyncio.to_thread(engine.wait_for_batches, 4)
            with pytest.raises(OverloadedError):
                batcher.check_admission(FAR)
            engine.run_gate.set()
            await full
        assert observer.rejected == ["predicted_wait"] * 3

    run(scenario)


def test_while_the_bound_refuses_as_many_as_it_admits_its_floor_is_a_full_batch_queued_for_the_next_engine() -> None:
    engine, observer = FakeEngine(ns_per_token=10**7), RecordingObserver()  # 10 ms per real token

    def refused_now(batcher: Batcher) -> bool:
        try:
            batcher.check_admission(FAR)
        except OverloadedError:
            return True
        return False

    async def scenario() -> None:
        # Rows of 3 tokens (30 ms): two fit the 70 ms batch time, so a full batch is 2 rows; the floor is 4 rows.
        lim = limits(max_batch_size=4, max_queue_wait_s=0.05, max_batch_time_s=0.07, shed_window_s=60.0)
        with running(engine, lim, observer=observer) as batcher:
            await batcher.submit(tokens(2), FAR)  # measure
            held = await hold_engine(batcher, engine, length=30)  # one row, predicted to run 300 ms
            two = submit(batcher, tokens(3, 3, first_id=600))
            await settle(lambda: batcher.depth == (1, 6))
            # A full batch queued behind the running row is below the floor of 4 rows: nothing refuses it.
            assert not refused_now(batcher)
            third = submit(batcher, tokens(3, first_id=700))
            await settle(lambda: batcher.depth == (2, 9))
            # 4 rows queued or running: the bound refuses. One refusal against 4 admissions is not overload.
            with pytest.raises(OverloadedError):
                await batcher.submit(tokens(3, first_id=800), FAR)
            engine.run_gate.set()
            await asyncio.gather(held, two, third)
            held = await hold_engine(batcher, engine, length=30)
            two = submit(batcher, tokens(3, 3, first_id=600))
            await settle(lambda: batcher.depth == (1, 6))
            assert not refused_now(batcher)  # 3 rows queued or running, and 6 admitted against 1 refused
            engine.run_gate.set()
            await asyncio.gather(held, two)

            # Refusals catch up with admissions (10 more at the floor of 4 rows): the floor is now a full batch queued
            # for the next engine thread to come free, though only 3 rows are queued or running.
            held = await hold_engine(batcher, engine, length=30)
            four = submit(batcher, tokens(3, 3, 3, first_id=600))
            await settle(lambda: batcher.depth == (1, 9))
            assert all(refused_now(batcher) for _ in range(10))
            engine.run_gate.set()
            await asyncio.gather(held, four)
            held = await hold_engine(batcher, engine, length=30)
            two = submit(batcher, tokens(3, 3, first_id=600))
            await settle(lambda: batcher.depth == (1, 6))
            assert refused_now(batcher)
            with pytest.raises(OverloadedError):
                await batcher.submit(tokens(3, first_id=900), FAR)
            # With no window the refusals weigh nothing, and the floor is max_batch_size rows again.
            batcher.update_limits(dataclasses.replace(lim, shed_window_s=0.0))
            assert not refused_now(batcher)
            engine.run_gate.set()
            await asyncio.gather(held, two)
        assert observer.rejected == ["predicted_wait"] * 13

    run(scenario)


def test_while_shedding_the_wait_bound_covers_the_whole_stay_a_third_for_the_wait_the_rest_caps_the_batch() -> None:
    engine = FakeEngine(ns_per_token=10**7)  # 10 ms per real token

    async def held_with_three_rows(batcher: Batcher) -> list[asyncio.Task[SubmitResult]]:
        held = await hold_engine(batcher, engine, length=30)  # one row, predicted to run 300 ms
        three = submit(batcher, tokens(3, 3, 3, first_id=600))  # rows of 30 ms
        await settle(lambda: batcher.depth == (1, 9))
        return [held, three]

    async def scenario() -> None:
        # Rows of 3 tokens run 30 ms: two fit the 70 ms batch time. While shedding the batch cap is two thirds of the
        # 60 ms wait bound (40 ms: one row) and the wait bound a third of it (20 ms).
        lim = limits(max_batch_size=4, max_queue_wait_s=0.06, max_batch_time_s=0.07, shed_window_s=60.0)
        assert (lim.while_shedding().max_queue_wait_s, lim.while_shedding().max_batch_time_s) == pytest.approx(
            (0.02, 0.04))
        with running(engine, lim) as batcher:
            await batcher.submit(tokens(2), FAR)  # measure
            requests = await held_with_three_rows(batcher)
            with pytest.raises(OverloadedError, match=r"over the 60 ms bound \(--max-queue-wait-ms\)"):
                batcher.check_admission(FAR)
            assert not batcher.stats().shedding
            for _ in range(3):  # refusals catch up with the 3 admissions: the server sheds
                with pytest.raises(OverloadedError):
                    batcher.check_admission(FAR)
            assert batcher.stats().shedding
            with pytest.raises(OverloadedError, match="over the 20 ms the server allows while it sheds heavy overload"):
                await batcher.submit(tokens(3, first_id=800), FAR)
            engine.run_gate.set()
            await asyncio.gather(*requests)
            shed_batches = [b.lengths.tolist() for b in engine.batches[1:]]
            # With no window nothing is shedding: batches of two rows again.
            batcher.update_limits(dataclasses.replace(lim, shed_window_s=0.0))
            assert not batcher.stats().shedding
            requests = await held_with_three_rows(batcher)
            engine.run_gate.set()
            await asyncio.gather(*requests)
            batches = [b.lengths.tolist() for b in engine.batches[1 + len(shed_batches):]]
        assert shed_batches == [[30], [3], [3], [3]]
        assert batches == [[30], [3, 3], [3]]

    run(scenario)


def test_limits_can_change_at_run_time() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        with running(engine, observer=observer) as batcher:
            first = await hold_engine(batcher, engine)
            four = submit(batcher, tokens(3, 4, 5, 6))
            await settle(lambda: batcher.depth[0] == 1)
            batcher.update_limits(dataclasses.replace(batcher.limits, max_batch_size=1, max_queue_requests=1))
            with pytest.raises(OverloadedError):
                await batcher.submit(tokens(2), FAR)
            with pytest.raises(ValueError, match="length buckets"):
                batcher.update_limits(dataclasses.replace(batcher.limits, length_buckets=(128,)))
            engine.run_gate.set()
            await asyncio.gather(first, four)
        assert [b.size for b in engine.batches] == [1, 1, 1, 1, 1]
        assert observer.rejected == ["queue_full_requests"]

    run(scenario)


# -- engine failures -----------------------------------------------------------------------------------------


def test_an_engine_error_fails_its_batch_and_the_worker_survives() -> None:
    engine = FakeEngine(ns_per_token=1000)
    engine.fail_with[0] = RuntimeError("boom")
    engine.fail_with[1] = DeviceUnavailableError("gpu lost")

    async def scenario() -> None:
        with running(engine) as batcher:
            with pytest.raises(EngineError) as wrapped:
                await batcher.submit(tokens(3), FAR)
            assert wrapped.value.code == "engine_error" and isinstance(wrapped.value.__cause__, RuntimeError)
            # What the client reads names the batch and the exception's type; its text (a TorchScript error is a
            # traceback with file paths) stays in the server log.
            assert wrapped.value.message == ("the engine failed on batch 1 (RuntimeError); the server log has the "
                                             "details")
            with pytest.raises(DeviceUnavailableError):  # already a GlassboxError: passed through as is
                await batcher.submit(tokens(3), FAR)
            result = await batcher.submit(tokens(4, first_id=3), FAR)
            stats = batcher.stats()
        np.testing.assert_array_equal(result.logits, expected_logits(tokens(4, first_id=3)))
        assert (stats.engine_errors, stats.batches_run, stats.items_run, stats.in_flight_items) == (2, 1, 1, 0)

    run(scenario)


def test_the_rest_of_a_failed_request_is_dropped_unrun() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()
    engine.fail_with[1] = RuntimeError("boom")

    async def scenario() -> None:
        with running(engine, limits(length_buckets=(8, 32)), observer=observer) as batcher:
            first = await hold_engine(batcher, engine)
            doomed = submit(batcher, tokens(5, 30, first_id=500))  # two buckets: two batches
            await settle(lambda: batcher.depth[0] == 1)
            engine.run_gate.set()
            with pytest.raises(EngineError):
                await doomed
            await first
            assert batcher.stats().dropped == {"failed": 1}
        assert [b.lengths.tolist() for b in engine.batches] == [[3], [5]]  # the 30-token row never ran
        assert observer.dropped == [("failed", 1)]

    run(scenario)


def test_an_observer_that_raises_does_not_stop_the_worker() -> None:
    class Broken(RecordingObserver):
        def on_batch(self, record: BatchRecord) -> None:
            raise RuntimeError("telemetry bug")

    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, observer=Broken()) as batcher:
            await batcher.submit(tokens(3), FAR)
            second = await batcher.submit(tokens(4), FAR)
        np.testing.assert_array_equal(second.logits, expected_logits(tokens(4)))

    run(scenario)


class Opener(RecordingObserver):
    """Names request and batch spans as tracing would (glassbox.service.observer.SpanOpener); `fail` makes open_batch
    raise."""

    fail = False

    def open_request(self, traceparent: str | None, tracestate: str | None = None) -> SpanRef:
        return SpanRef("ab" * 16, "cd" * 8, False)

    def open_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef:
        if self.fail:
            raise RuntimeError("telemetry bug")
        return SpanRef("ef" * 16, f"{len(self.batches) + 1:016x}", any(s is not None and s.sampled for s in spans))

    def trace_response(self, record: RequestRecord) -> str | None:
        return None


def test_each_batch_is_named_before_its_answers_go_out_and_every_request_learns_its_batches_spans() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), Opener()
    request_span = SpanRef("12" * 16, "34" * 8, True)

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=1), observer=observer) as batcher:
            result = await batcher.submit(tokens(3, 4), FAR, request_id="r", span=request_span)
        assert len(result.batch_ids) == 2
        assert [record.span for record in sorted(observer.batches, key=lambda b: b.batch_id)] == list(
            result.batch_spans)
        assert all(span.sampled for span in result.batch_spans)  # the request in them was kept up front
        assert all(record.spans == (request_span,) for record in observer.batches)

    run(scenario)


def test_a_failing_batch_opener_leaves_the_batch_unnamed_and_answered() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), Opener()
    observer.fail = True

    async def scenario() -> None:
        with running(engine, observer=observer) as batcher:
            result = await batcher.submit(tokens(3), FAR)
        np.testing.assert_array_equal(result.logits, expected_logits(tokens(3)))
        assert result.batch_spans == () and [b.span for b in observer.batches] == [None]

    run(scenario)


def test_device_and_mode_report_every_run_a_request_took_part_in() -> None:
    engine = FakeEngine(devices=("cuda:0", "cpu"), modes=("graph", "eager"), ns_per_token=1000)

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=1)) as batcher:
            result = await batcher.submit(tokens(3, 4), FAR)
            stats = batcher.stats()
        assert (result.device, result.engine_mode) == ("cpu,cuda:0", "mixed")
        assert stats.throughput_device == "cpu"  # the meter follows the device now in use

    run(scenario)


def test_an_empty_batch_is_refused() -> None:
    async def scenario() -> None:
        with running(FakeEngine(ns_per_token=1000)) as batcher:
            empty = TokenBatch(np.zeros((0, 0), np.int64), np.zeros(0, np.int64), np.zeros(0, np.bool_))
            with pytest.raises(EmptyInputError):
                await batcher.submit(empty, FAR)

    run(scenario)


# -- drain and stop ------------------------------------------------------------------------------------------


def test_drain_finishes_queued_work_then_refuses_new_work() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        with running(engine, observer=observer) as batcher:
            first = await hold_engine(batcher, engine)
            queued = submit(batcher, tokens(4, first_id=40))
            await settle(lambda: batcher.depth[0] == 1)
            drain = asyncio.create_task(batcher.drain(WAIT_S))
            await settle(lambda: not batcher.accepting)
            with pytest.raises(NotReadyError):
                await batcher.submit(tokens(2), FAR)
            assert not drain.done()
            engine.run_gate.set()
            assert await drain is True
            results = await asyncio.gather(first, queued)
            assert await batcher.drain(0.0) is True  # nothing left: answers at once
            assert batcher.stats().rejected == {"draining": 1}
        np.testing.assert_array_equal(results[1].logits, expected_logits(tokens(4, first_id=40)))
        assert observer.rejected == ["draining"]

    run(scenario)


def test_drain_gives_up_at_its_timeout_while_the_engine_is_stuck() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        with running(engine) as batcher:
            first = await hold_engine(batcher, engine)
            assert await batcher.drain(0.01) is False  # the engine is held: it cannot have emptied
            engine.run_gate.set()
            await first

    run(scenario)


def test_stop_is_idempotent_and_answers_what_is_still_queued() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        batcher = Batcher(engine, limits(), observer)
        batcher.start()
        batcher.start()  # a second start does nothing
        worker = [t for t in threading.enumerate() if t.name == "glassbox-engine"]
        assert len(worker) == 1 and not worker[0].daemon
        first = await hold_engine(batcher, engine)
        left = submit(batcher, tokens(3, 4))
        await settle(lambda: batcher.depth[0] == 1)
        batcher.stop(timeout_s=0.0)  # asks the thread to stop; it is still inside the engine
        engine.run_gate.set()
        batcher.stop()
        batcher.stop()
        assert not worker[0].is_alive()
        await first  # the batch in the engine finished
        with pytest.raises(NotReadyError):
            await left
        with pytest.raises(NotReadyError):
            await batcher.submit(tokens(2), FAR)
        with pytest.raises(RuntimeError):
            batcher.start()
        assert batcher.stats().dropped == {"shutdown": 2}
        assert observer.dropped == [("shutdown", 2)]

    run(scenario)


def test_stop_without_start_answers_what_was_queued() -> None:
    async def scenario() -> None:
        batcher = Batcher(FakeEngine(ns_per_token=1000), limits())
        waiting = submit(batcher, tokens(3))
        await settle(lambda: batcher.depth[0] == 1)
        batcher.stop()
        with pytest.raises(NotReadyError):
            await waiting

    run(scenario)


# -- several engine threads -------------------------------------------------------------------------------------


def test_two_engine_threads_run_two_batches_side_by_side_and_share_the_threads() -> None:
    engine, shared = FakeEngine(ns_per_token=1000), []

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=2), runners=2, share_threads=shared.append) as batcher:
            engine.run_gate.clear()
            first = submit(batcher, tokens(3, 4, first_id=1), "first")  # one full batch of 2: engine thread A
            await asyncio.to_thread(engine.wait_for_batches, 1)
            second = submit(batcher, tokens(5, first_id=20), "second")  # thread B takes it while A is held
            await asyncio.to_thread(engine.wait_for_batches, 2)
            assert batcher.stats().in_flight_items == 3  # both batches are inside the engine at once
            engine.run_gate.set()
            results = await asyncio.gather(first, second)
        np.testing.assert_array_equal(results[0].logits, expected_logits(tokens(3, 4, first_id=1)))
        np.testing.assert_array_equal(results[1].logits, expected_logits(tokens(5, first_id=20)))
        assert results[0].batch_ids != results[1].batch_ids

    run(scenario)
    # the first batch ran alone (all the threads), the second beside it (half each)
    assert shared[:2] == [1, 2]
    names = {t.name for t in threading.enumerate()}
    assert not {"glassbox-engine-0", "glassbox-engine-1"} & names  # both stopped


class ThreadNamingEngine(FakeEngine):
    """Records which engine thread ran each batch."""

    def __init__(self) -> None:
        super().__init__(ns_per_token=1000)
        self.threads: list[str] = []

    def run(self, batch: TokenBatch) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().run(batch)


def test_a_batch_that_starts_alone_runs_on_the_first_engine_thread() -> None:
    """Thread 0 owns the only OpenMP team of every intra-op thread (service/runtime.py, IntraOpTeams): a lone batch
    must land there, one after another, however the two threads happen to be woken."""
    engine, started = ThreadNamingEngine(), []

    async def scenario() -> None:
        with running(engine, limits(), runners=2, on_thread_start=started.append) as batcher:
            for i in range(12):
                await submit(batcher, tokens(3, first_id=i + 1), f"r{i}")

    run(scenario)
    assert sorted(started) == [0, 1]  # each thread was told its index as it started
    assert engine.threads == ["glassbox-engine-0"] * 12


def test_the_second_engine_thread_joins_while_a_batch_runs() -> None:
    engine = ThreadNamingEngine()

    async def scenario() -> None:
        with running(engine, limits(max_batch_size=1), runners=2) as batcher:
            held = await hold_engine(batcher, engine)  # thread 0 is inside the engine
            beside = submit(batcher, tokens(4, first_id=30), "beside")
            await asyncio.to_thread(engine.wait_for_batches, 2)  # taken while the first still runs
            engine.run_gate.set()
            await asyncio.gather(held, beside)

    run(scenario)
    assert engine.threads == ["glassbox-engine-0", "glassbox-engine-1"]


def test_runners_must_be_positive() -> None:
    with pytest.raises(ValueError, match="runners"):
        Batcher(FakeEngine(ns_per_token=1000), limits(), runners=0)
