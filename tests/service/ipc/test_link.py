"""The engine link end to end in one process: an EngineHub over a real Batcher and fake engine, listening on a real
Unix socket, and EngineLinks connected to it as HTTP workers would be. No sleeps: waits are on the link's own
events or bounded loop-side polls."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import glassbox.service.ipc.hub as hub_module
import glassbox.service.ipc.link as link_module
from glassbox.service.batching import Batcher, SubmitResult
from glassbox.service.errors import (
    DeadlineExceededError,
    EmptyInputError,
    EngineRestartingError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
)
from glassbox.service.ipc.hub import EngineHub
from glassbox.service.ipc.link import EngineLink
from glassbox.service.ipc.messages import Answers, Cancel, Hello, State, Submit, engine_decoder
from glassbox.service.observer import BatchRecord, SpanRef
from glassbox.service.types import TokenBatch
from tests.service.apptools import FakeEngine, RecordingObserver, expected_logits, until
from tests.service.test_batcher import FAR, limits, tokens

BOUND_S = 10.0


def state(phase: str = "ready") -> State:
    return State(phase=phase, device="cpu", degraded_reason="", live=True, live_reason="", generation=1)


async def control(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"method": request.method, "path": request.url.path, "query": request.url.query,
                         "auth": request.headers.get("authorization"), "body": body.decode()}, status_code=201)


async def broken(request: Request) -> JSONResponse:
    raise RuntimeError("a bug in a control route")


async def slow(request: Request) -> JSONResponse:
    await asyncio.sleep(0.8)  # longer than the silence bound of the quick_beats tests, while the engine beats
    return JSONResponse({"armed": True}, status_code=201)


@contextlib.asynccontextmanager
async def hub_and_link(engine: FakeEngine, *, observer: RecordingObserver | None = None,
                       states: list[State | None] | None = None, **limit_changes: object
                       ) -> AsyncIterator[tuple[EngineHub, EngineLink, Batcher, str]]:
    batcher = Batcher(engine, limits(**limit_changes), observer)
    batcher.start()
    app = Starlette(routes=[Route("/chaos/faults", control, methods=["POST"]),
                            Route("/chaos/faults/{fault_id}", control, methods=["DELETE"]),
                            Route("/chaos/broken", broken, methods=["POST"]),
                            Route("/chaos/slow", slow, methods=["POST"])])
    current = {"state": state()}
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "engine.sock")
        hub = EngineHub(batcher, state=lambda: current["state"], control=app, scrape=lambda: b"# scraped\n")
        await hub.listen(path)
        seen = states if states is not None else []
        link = EngineLink(path, worker=3, on_state=seen.append)
        await link.start()
        assert await link.wait_connected(BOUND_S)
        try:
            yield hub, link, batcher, path
        finally:
            engine.run_gate.set()
            await link.close()
            await hub.close()
            await asyncio.to_thread(batcher.stop, BOUND_S)


async def one_running_one_queued(engine: FakeEngine, link: EngineLink, batcher: Batcher
                                 ) -> tuple[asyncio.Future[SubmitResult], asyncio.Future[SubmitResult]]:
    """Hold the engine on one request (3 tokens) and queue a second (6 tokens) behind it, both sent over the link."""
    engine.run_gate.clear()
    running = asyncio.ensure_future(link.submit(tokens(3), FAR))
    await asyncio.to_thread(engine.wait_for_batches, 1)
    queued = asyncio.ensure_future(link.submit(tokens(6), FAR))
    await until(lambda: batcher.depth[0] == 1, "the second request is queued")
    return running, queued


def run(scenario: Callable[[], object]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))  # type: ignore[arg-type]


def test_a_submit_over_the_link_returns_the_engines_logits_and_times() -> None:
    engine, observer = FakeEngine(ns_per_token=1000), RecordingObserver()

    async def scenario() -> None:
        async with hub_and_link(engine, observer=observer) as (_, link, _, _):
            batch = tokens(3, 5, first_id=7)
            span = SpanRef("ab" * 16, "cd" * 8, True)
            result = await link.submit(batch, FAR, request_id="r1", span=span)
            np.testing.assert_array_equal(result.logits, expected_logits(batch))
            assert result.queue_start_ns <= result.queue_end_ns == result.infer_start_ns <= result.infer_end_ns
            assert result.device == "cpu" and result.engine_mode == "eager" and len(result.batch_ids) == 1
        [record] = observer.batches
        assert isinstance(record, BatchRecord) and record.request_ids == ("r1",) and record.spans == (span,)

    run(scenario)


def test_engine_errors_come_back_as_their_own_types() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine, max_queue_requests=1) as (_, link, batcher, _):
            with pytest.raises(EmptyInputError):
                await link.submit(tokens(1).select([]), FAR)
            engine.run_gate.clear()
            first = asyncio.ensure_future(link.submit(tokens(3), FAR))
            await asyncio.to_thread(engine.wait_for_batches, 1)
            queued = asyncio.ensure_future(link.submit(tokens(4), FAR))
            await until(lambda: batcher.depth[0] == 1, "one request is queued")
            with pytest.raises(OverloadedError) as refused:
                await link.submit(tokens(2), FAR)
            assert refused.value.retry_after_s >= 1.0
            engine.run_gate.set()
            await asyncio.gather(first, queued)

    run(scenario)


def test_a_cancelled_submit_is_withdrawn_from_the_engines_queue() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, batcher, _):
            first, doomed = await one_running_one_queued(engine, link, batcher)
            doomed.cancel()
            await until(lambda: batcher.stats().dropped.get("disconnected", 0) == 1, "the engine dropped it")
            engine.run_gate.set()
            await first
        assert len(engine.batches) == 1  # the cancelled request never ran

    run(scenario)


def test_losing_the_engine_answers_everything_in_flight_with_engine_restarting_and_reconnects() -> None:
    engine = FakeEngine(ns_per_token=1000)
    states: list[State | None] = []

    async def scenario() -> None:
        async with hub_and_link(engine, states=states) as (hub, link, batcher, path):
            await until(lambda: states == [state()], "the state arrives with the connection")
            engine.run_gate.clear()
            in_flight = [asyncio.ensure_future(link.submit(tokens(3 + i), FAR)) for i in range(3)]
            await until(lambda: batcher.stats().pending_requests == 3, "three requests reached the engine")
            await hub.close()  # the engine process goes away
            for task in in_flight:
                with pytest.raises(EngineRestartingError) as gone:
                    await task
                assert gone.value.retry_after_s == link.restart_retry_after_s
            assert states[-1] is None and not link.connected
            with pytest.raises(EngineRestartingError):  # no engine: answered at once, never queued
                await link.submit(tokens(2), FAR)
            engine.run_gate.set()
            Path(path).unlink()
            replacement = EngineHub(batcher, state=lambda: state("loading"))  # a new engine process starts
            await replacement.listen(path)
            await until(lambda: link.connected, "the link reconnected")
            await until(lambda: states[-1] == state("loading"), "the new engine's state arrived")
            result = await link.submit(tokens(2, first_id=40), FAR)
            np.testing.assert_array_equal(result.logits, expected_logits(tokens(2, first_id=40)))
            assert link.connects == 2
            await replacement.close()

    run(scenario)


def test_a_worker_that_leaves_has_its_queued_requests_withdrawn() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, batcher, _):
            running, queued = await one_running_one_queued(engine, link, batcher)
            await link.close()  # the worker goes away with one request in the engine and one queued
            await until(lambda: batcher.stats().dropped.get("disconnected", 0) == 1, "the queued one is withdrawn")
            engine.run_gate.set()
            await until(lambda: batcher.stats().pending_requests == 0, "the one in the engine finishes")
            await asyncio.gather(running, queued, return_exceptions=True)
        assert len(engine.batches) == 1  # the withdrawn request never ran

    run(scenario)


def test_broadcast_reaches_every_connected_worker() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (hub, link, _, path):
            other_states: list[State | None] = []
            other = EngineLink(path, worker=4, on_state=other_states.append)
            await other.start()
            assert await other.wait_connected(BOUND_S)
            await until(lambda: hub.workers == 2, "both workers joined")
            hub.broadcast()
            await until(lambda: len(other_states) >= 2, "the broadcast arrived")  # (and maybe a beat)
            assert set(other_states) == {state()}
            await other.close()
            await until(lambda: hub.workers == 1, "the closed worker left")
            assert link.connected

    run(scenario)


def test_control_calls_run_against_the_engines_own_routes_and_scrapes_return_its_text() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, _, _):
            answer = await link.call("POST", "/chaos/faults", "a=1", [("Authorization", "Bearer t")], b'{"x": 1}')
            assert answer.status == 201
            assert dict(answer.headers)["content-type"] == "application/json"
            assert json.loads(answer.body) == {"method": "POST", "path": "/chaos/faults", "query": "a=1",
                                               "auth": "Bearer t", "body": '{"x": 1}'}
            assert await link.scrape() == b"# scraped\n"

    run(scenario)


def test_a_control_route_that_raises_answers_500_instead_of_leaving_the_worker_waiting() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, _, _):
            answer = await link.call("POST", "/chaos/broken", "", [], b"")
            assert answer.status == 500
            assert json.loads(answer.body)["error"]["code"] == "internal_error"
            # A path beyond Latin-1 (the worker relays it decoded) reaches the route, percent-encoded as sent.
            answer = await link.call("DELETE", "/chaos/faults/\u20ac", "", [], b"")
            assert answer.status == 201 and json.loads(answer.body)["path"] == "/chaos/faults/\u20ac"
            assert (await link.call("POST", "/chaos/faults", "", [], b"{}")).status == 201  # the link still works

    run(scenario)


@pytest.fixture
def quick_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine beats every 50 ms, a worker looks 50 ms after a deadline and calls the engine silent after 0.4 s."""
    monkeypatch.setattr(hub_module, "BEAT_S", 0.05)
    monkeypatch.setattr(link_module, "SILENT_GRACE_S", 0.05)
    monkeypatch.setattr(link_module, "ENGINE_SILENT_S", 0.4)


def test_texts_already_in_the_engine_finish_after_their_deadline(quick_beats: None) -> None:
    """As in the one-process layout: the deadline drops what is still queued, never what runs. Before, the worker
    answered 504 at the deadline plus a second, whatever the engine was doing."""
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, _, _):
            engine.run_gate.clear()
            deadline_ns = time.perf_counter_ns() + 100_000_000  # 0.1 s
            running = asyncio.ensure_future(link.submit(tokens(2), deadline_ns))
            await asyncio.to_thread(engine.wait_for_batches, 1)
            await asyncio.sleep(0.8)  # the deadline, several looks after it, and twice the silence bound: it beats
            assert not running.done()
            engine.run_gate.set()
            result = await running
            np.testing.assert_array_equal(result.logits, expected_logits(tokens(2)))

    run(scenario)


@contextlib.asynccontextmanager
async def mute_engine() -> AsyncIterator[tuple[EngineLink, list[bytes]]]:
    """A socket that accepts a worker and never says a word (an engine process stopped or hung), keeping what it
    is sent."""
    received: list[bytes] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            received.append(chunk)

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "engine.sock")
        server = await asyncio.start_unix_server(accept, path)
        link = EngineLink(path, worker=1)
        await link.start()
        assert await link.wait_connected(BOUND_S)
        try:
            yield link, received
        finally:
            await link.close()
            server.close()


def sent(chunks: list[bytes]) -> list[object]:
    """The frames (u32 length, then msgpack) a worker wrote, decoded as the engine would."""
    frames: list[object] = []
    view = memoryview(b"".join(chunks))
    while len(view) >= 4:
        size = int.from_bytes(view[:4], "little")
        if len(view) < 4 + size:
            break
        frames.append(engine_decoder().decode(bytes(view[4:4 + size])))
        view = view[4 + size:]
    return frames


def test_a_silent_engine_gets_a_504_that_says_so_and_a_cancel(quick_beats: None) -> None:
    async def scenario() -> None:
        async with mute_engine() as (link, received):
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="has not been heard from"):
                await link.submit(tokens(2), time.perf_counter_ns() + 100_000_000)
            assert time.monotonic() - started < 2.0
            assert link.silent_s() > 0.4
            await until(lambda: len(sent(received)) == 3, "three frames sent")
        hello, submit, cancel = sent(received)  # the Cancel: the engine drops the request should it wake up
        assert isinstance(hello, Hello) and isinstance(submit, Submit) and cancel == Cancel(submit.requests[0].id)

    run(scenario)


def test_a_control_call_to_a_silent_engine_is_given_up_and_one_to_a_slow_engine_is_not(quick_beats: None) -> None:
    """A chaos control call has no fixed bound (arming a GPU fault can take seconds, and a call given up on would
    still take effect): only an engine gone silent ends it."""
    async def scenario() -> None:
        async with mute_engine() as (link, _):
            with pytest.raises(DeadlineExceededError, match="has not been heard from"):
                await link.call("GET", "/chaos/faults", "", [], b"")
            assert link.in_flight == 0
        engine = FakeEngine(ns_per_token=1000)
        async with hub_and_link(engine) as (_, link, _, _):
            answer = await link.call("POST", "/chaos/slow", "", [], b"{}")
            assert answer.status == 201 and link.in_flight == 0

    run(scenario)


def test_an_engine_given_up_for_good_is_not_called_restarting(tmp_path: Path) -> None:
    async def scenario() -> None:
        link = EngineLink(str(tmp_path / "nothing.sock"))
        with pytest.raises(EngineRestartingError):
            await link.submit(tokens(1), FAR)
        link.gone_for_good = "the engine process kept failing and will not be restarted"
        with pytest.raises(NotReadyError, match="will not be restarted") as refused:
            await link.submit(tokens(1), FAR)
        assert not isinstance(refused.value, EngineRestartingError)

    run(scenario)


def test_a_request_too_big_for_the_link_is_413_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a frame over the engine's limit made it drop the worker's connection: that request and every other in
    flight on the worker got 503 engine_restarting for a restart that never happened."""
    monkeypatch.setattr(link_module, "MAX_FRAME", 600)
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, _, _):
            with pytest.raises(PayloadTooLargeError, match="send fewer texts per request"):
                await link.submit(tokens(*[8] * 20), FAR)
            assert link.in_flight == 0 and link.connected
            result = await link.submit(tokens(4), FAR)  # the link still carries the small ones
            np.testing.assert_array_equal(result.logits, expected_logits(tokens(4)))

    run(scenario)


# -- requests in bulk: one frame a turn each way -----------------------------------------------------------------------

def counting_answers(link: EngineLink) -> list[object]:
    """Wrap the link's decoder: the messages the worker receives, in order."""
    received: list[object] = []
    decode = link._decode

    def spy(payload: bytes) -> object:
        message = decode(payload)
        received.append(message)
        return message

    link._decode = spy  # type: ignore[assignment]
    return received


def typed(batch: TokenBatch, type_id: int) -> TokenBatch:
    return dataclasses.replace(batch, type_ids=np.where(batch.ids > 0, type_id, 0))  # [rows, width]


def test_the_requests_of_one_turn_travel_in_one_submit_with_their_own_rows_and_types() -> None:
    """One frame carries every request of the turn; each keeps its own ids, lengths, types, deadline and span."""
    async def scenario() -> None:
        async with mute_engine() as (link, received):
            batches = [tokens(3, 5, first_id=1), typed(tokens(4, first_id=20), 1), tokens(2, 2, 6, first_id=40)]
            span = SpanRef("ab" * 16, "cd" * 8, True)
            tasks = [asyncio.ensure_future(link.submit(batch, FAR - i, request_id=f"r{i}", span=span if i else None))
                     for i, batch in enumerate(batches)]
            await until(lambda: len(sent(received)) == 2, "the hello and one submit")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        _, submit = sent(received)[:2]
        assert isinstance(submit, Submit) and [r.request_id for r in submit.requests] == ["r0", "r1", "r2"]
        ids = np.frombuffer(submit.ids, dtype=np.int64)
        lengths = np.frombuffer(submit.lengths, dtype=np.int64)
        types = np.frombuffer(submit.type_ids, dtype=np.int64)
        at = row = 0
        for request, batch in zip(submit.requests, batches, strict=True):
            block = ids[at:at + request.rows * request.width].reshape(request.rows, request.width)
            np.testing.assert_array_equal(block, batch.ids)
            np.testing.assert_array_equal(lengths[row:row + request.rows], batch.lengths)
            assert request.types == (batch.type_ids is not None)
            at, row = at + block.size, row + request.rows
        assert submit.requests[0].deadline_ns == FAR and submit.requests[0].span is None
        assert submit.requests[1].span == (span.trace_id, span.span_id, span.sampled)
        np.testing.assert_array_equal(types, typed(tokens(4, first_id=20), 1).type_ids.ravel())  # type: ignore[union-attr]

    run(scenario)


def test_requests_of_one_turn_are_answered_in_one_frame_and_each_gets_its_own_rows() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine, max_batch_size=32) as (_, link, batcher, _):
            received = counting_answers(link)
            engine.run_gate.clear()
            blocker = asyncio.ensure_future(link.submit(tokens(2, first_id=90), FAR))
            await asyncio.to_thread(engine.wait_for_batches, 1)
            batches = [tokens(3, 5, first_id=1 + 10 * i) for i in range(6)] + [typed(tokens(4, first_id=70), 1)]
            tasks = [asyncio.ensure_future(link.submit(batch, FAR)) for batch in batches]
            await until(lambda: batcher.depth[0] == len(batches), "every request is queued behind the blocker")
            engine.run_gate.set()
            results = await asyncio.gather(*tasks)
            await blocker
        for batch, result in zip(batches, results, strict=True):
            np.testing.assert_array_equal(result.logits, expected_logits(batch))
        assert len(engine.batches) == 2 and engine.batches[1].size == 13  # the seven ran as one batch ...
        assert engine.batches[1].type_ids is not None and int(engine.batches[1].type_ids.sum()) == 4
        answers = [m for m in received if isinstance(m, Answers)]
        # ... and came back in one frame (the blocker's answer may share it: both batches can end in one turn)
        assert sum(len(a.done) for a in answers) == 8 and len(answers) <= 2

    run(scenario)


def test_requests_from_several_workers_ride_in_one_batch_and_each_worker_gets_its_own() -> None:
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine, max_batch_size=32) as (_, first, batcher, path):
            second = EngineLink(path, worker=4)
            await second.start()
            assert await second.wait_connected(BOUND_S)
            engine.run_gate.clear()
            blocker = asyncio.ensure_future(first.submit(tokens(2, first_id=90), FAR))
            await asyncio.to_thread(engine.wait_for_batches, 1)
            mine = [asyncio.ensure_future(first.submit(tokens(3, first_id=1 + i), FAR)) for i in range(3)]
            theirs = [asyncio.ensure_future(second.submit(tokens(5, first_id=50 + i), FAR)) for i in range(4)]
            await until(lambda: batcher.depth[0] == 7, "both workers' requests are queued")
            engine.run_gate.set()
            for i, task in enumerate(mine):
                np.testing.assert_array_equal((await task).logits, expected_logits(tokens(3, first_id=1 + i)))
            for i, task in enumerate(theirs):
                np.testing.assert_array_equal((await task).logits, expected_logits(tokens(5, first_id=50 + i)))
            await blocker
            await second.close()
        assert [batch.size for batch in engine.batches] == [1, 7]

    run(scenario)


def test_a_request_cancelled_in_the_turn_it_was_sent_never_runs() -> None:
    """Its Cancel must follow the Submit that carries it, not overtake it."""
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, batcher, _):
            first, _ = await one_running_one_queued(engine, link, batcher)
            doomed = asyncio.ensure_future(link.submit(tokens(7, first_id=60), FAR))
            await asyncio.sleep(0)  # it runs up to its await and sits in the outbox, unsent
            doomed.cancel()
            await until(lambda: batcher.stats().dropped.get("disconnected", 0) == 1, "the engine dropped it")
            engine.run_gate.set()
            await first
            await until(lambda: batcher.stats().pending_requests == 0, "the engine is idle")
        assert all(60 not in row for row in engine.rows)  # it never ran

    run(scenario)


def test_queued_requests_are_refused_at_their_own_deadlines_while_the_engine_is_busy() -> None:
    """One timer in the engine process serves every deadline: each queued request gets its 504 at its own time, the
    engine still busy, and the ones with time left stay queued."""
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (_, link, batcher, _):
            engine.run_gate.clear()
            running = asyncio.ensure_future(link.submit(tokens(2), FAR))
            await asyncio.to_thread(engine.wait_for_batches, 1)
            now = time.perf_counter_ns()
            soon = asyncio.ensure_future(link.submit(tokens(3), now + 50_000_000))
            later = asyncio.ensure_future(link.submit(tokens(4), now + 250_000_000))
            spared = asyncio.ensure_future(link.submit(tokens(5), FAR))
            with pytest.raises(DeadlineExceededError, match="while it was queued"):
                await soon
            assert not later.done()
            with pytest.raises(DeadlineExceededError, match="while it was queued"):
                await later
            assert time.perf_counter_ns() - now >= 250_000_000 and not spared.done()
            assert batcher.stats().dropped.get("deadline") == 2
            engine.run_gate.set()
            np.testing.assert_array_equal((await spared).logits, expected_logits(tokens(5)))
            await running

    run(scenario)


def test_the_deadline_heap_drops_answered_requests_before_they_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_module, "COMPACT_AT", 64)
    engine = FakeEngine(ns_per_token=1000)

    async def scenario() -> None:
        async with hub_and_link(engine) as (hub, link, _, _):
            held = []
            for _ in range(20):
                await asyncio.gather(*(link.submit(tokens(2), FAR - 1) for _ in range(90)))
                held.append(len(hub._deadlines._heap))
        assert max(held) < 2 * 64 + 2 * 90  # without compaction: 1800 at the end

    run(scenario)
