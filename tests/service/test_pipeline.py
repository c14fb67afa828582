"""The classify pipeline: directly (stages, results, truncation policy, off-loop tokenizing) and end to end through a
real uvicorn server with a gated fake engine (admission 429, deadlines while queued, clients that leave while queued).

The fake engine blocks inside `run` until released, so work piles up deterministically: a test sends a first
request, waits (threading primitive, bounded) until the engine holds it, queues more, then acts.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from glassbox.service.app import create_app
from glassbox.service.batching.records import (
    DROP_DEADLINE,
    DROP_DISCONNECTED,
    REJECT_QUEUE_REQUESTS,
    REJECT_QUEUE_TOKENS,
)
from glassbox.service.classification import ClassifyRequest
from glassbox.service.engines.base import Engine
from glassbox.service.errors import TextTooLongError
from glassbox.service.http import pacing
from glassbox.service.observer import STAGES
from glassbox.service.pipeline import ClassifyPipeline, StageClock
from glassbox.service.runtime import Runtime, build_runtime
from glassbox.service.tokenizer import INLINE_CHARS, INLINE_TEXTS
from tests.service.apptools import (
    BOUND_S,
    LABELS,
    FakeEngine,
    LiveServer,
    RecordingObserver,
    app_settings,
    live_server,
    until,
    wait_ready,
)

FAR_NS = 10**18  # a deadline that never passes
LONG = " ".join(["good"] * 60)  # over the test max_length of 32


def passthrough(work: Any) -> Any:
    return work


def expected_logits(runtime: Runtime, texts: list[str]) -> np.ndarray:
    tokens = runtime.tokenizer.encode(texts)
    rows = [FakeEngine.logits_of([int(v) for v in tokens.ids[i, : tokens.lengths[i]]]) for i in range(len(texts))]
    return np.array(rows, dtype=np.float32)


def rows_of(runtime: Runtime, texts: list[str]) -> list[tuple[int, ...]]:
    tokens = runtime.tokenizer.encode(texts)
    return [tuple(int(v) for v in tokens.ids[i, : tokens.lengths[i]]) for i in range(len(texts))]


@contextmanager
def started(runtime: Runtime, engine: FakeEngine) -> Iterator[ClassifyPipeline]:
    runtime.batcher.start()
    try:
        yield ClassifyPipeline(runtime.frontend)
    finally:
        engine.release()
        runtime.batcher.stop(BOUND_S)


# --- the pipeline, called directly ------------------------------------------------------------------------------------
def test_the_fake_engine_is_an_engine() -> None:
    assert isinstance(FakeEngine(), Engine)  # the protocol is runtime-checkable: a renamed method would show here


def test_stage_clock_spans_are_contiguous_laps() -> None:
    clock = StageClock()
    clock.lap("parse")
    clock.add("queue", clock.spans[0].end_ns + 5, clock.spans[0].end_ns + 9)
    clock.lap("postprocess")
    parse, queue, post = clock.spans
    assert parse.start_ns <= parse.end_ns
    assert (queue.start_ns, queue.end_ns) == (parse.end_ns + 5, parse.end_ns + 9)
    assert post.start_ns == queue.end_ns  # add() moves the mark to its end, so the next lap starts there
    clock.restart()
    clock.lap("tokenize")
    assert clock.spans[-1].start_ns >= post.end_ns


def test_the_pipeline_times_each_stage_and_returns_rows_in_order(tiny_model_dir: Path) -> None:
    engine = FakeEngine()
    runtime = build_runtime(app_settings(tiny_model_dir, max_batch_size=2), engine=engine)
    texts = ["a very good movie", "bad", "the worst film and a boring plot", "fun music"]

    async def scenario(pipeline: ClassifyPipeline) -> Any:
        clock = StageClock()
        clock.lap("parse")
        classified = await pipeline(ClassifyRequest(texts=tuple(texts)), clock, FAR_NS, "rid-1", passthrough)
        return clock, classified

    with started(runtime, engine) as pipeline:
        clock, classified = asyncio.run(asyncio.wait_for(scenario(pipeline), BOUND_S))
    assert [span.name for span in clock.spans] == ["parse", "tokenize", "queue", "infer"]
    queue, infer = clock.spans[2], clock.spans[3]
    assert clock.spans[1].end_ns <= queue.start_ns <= queue.end_ns == infer.start_ns <= infer.end_ns
    result = classified.result
    assert result.labels == LABELS
    np.testing.assert_array_equal(result.logits, expected_logits(runtime, texts))
    np.testing.assert_allclose(result.probs.sum(axis=1), 1.0, rtol=1e-6)
    assert result.tokens.tolist() == [len(row) for row in rows_of(runtime, texts)]
    assert len(classified.submit.batch_ids) >= 2  # four texts, batches of at most two
    assert len(engine.batches) >= 2


LONG = "a very long and slow film " * (INLINE_CHARS // 26 + 1)  # just over INLINE_CHARS characters


@pytest.mark.parametrize(("count", "long", "inline"), [(INLINE_TEXTS, 0, True), (INLINE_TEXTS + 1, 0, False),
                                                       (60, 0, False), (1, 1, False), (3, 1, False)])
def test_large_requests_are_tokenized_off_the_event_loop(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, count: int, long: int, inline: bool
) -> None:
    engine = FakeEngine()
    runtime = build_runtime(app_settings(tiny_model_dir, max_batch_size=8), engine=engine)
    words = ["good", "bad movie", "the plot", "a very long and slow film", "fun"]
    texts = [LONG] * long + [f"{words[i % len(words)]} {'great ' * (i % 7)}".strip() for i in range(count - long)]
    threads: list[threading.Thread] = []
    encode = runtime.tokenizer.encode

    def spying_encode(batch: Any, pairs: Any = None) -> Any:
        threads.append(threading.current_thread())
        return encode(batch, pairs)

    monkeypatch.setattr(runtime.tokenizer, "encode", spying_encode)

    async def scenario(pipeline: ClassifyPipeline) -> Any:
        classified = await pipeline(ClassifyRequest(texts=tuple(texts)), StageClock(), FAR_NS, "", passthrough)
        return classified, threading.current_thread()

    with started(runtime, engine) as pipeline:
        classified, loop_thread = asyncio.run(asyncio.wait_for(scenario(pipeline), BOUND_S))
    assert len(threads) == 1
    assert (threads[0] is loop_thread) == inline
    np.testing.assert_array_equal(classified.result.logits, expected_logits(runtime, texts))


@pytest.mark.parametrize(
    ("oversize", "truncate", "refused"),
    [
        ("truncate", None, False),
        ("truncate", True, False),
        ("truncate", False, True),
        ("reject", None, True),
        ("reject", True, False),
        ("reject", False, True),
    ],
)
def test_over_long_texts_follow_the_setting_unless_the_request_says(
    tiny_model_dir: Path, oversize: str, truncate: bool | None, refused: bool
) -> None:
    engine = FakeEngine()
    runtime = build_runtime(app_settings(tiny_model_dir, oversize=oversize), engine=engine)
    request = ClassifyRequest(texts=("good", LONG), truncate=truncate)
    clock = StageClock()

    async def scenario(pipeline: ClassifyPipeline) -> Any:
        return await pipeline(request, clock, FAR_NS, "", passthrough)

    with started(runtime, engine) as pipeline:
        if refused:
            with pytest.raises(TextTooLongError, match="text 1 is longer than the 32-token limit"):
                asyncio.run(asyncio.wait_for(scenario(pipeline), BOUND_S))
        else:
            classified = asyncio.run(asyncio.wait_for(scenario(pipeline), BOUND_S))
    if refused:
        assert engine.rows == []  # refused before anything was queued
        assert [span.name for span in clock.spans] == ["tokenize"]  # the tokenizing it cost is still timed
    else:
        assert classified.result.truncated.tolist() == [False, True]
        assert classified.result.tokens.tolist() == [3, 32]
        assert len(engine.rows) == 2


# --- admission, deadlines and disconnects through a real server -------------------------------------------------------
@contextmanager
def gated_server(tiny_model_dir: Path, **overrides: Any) -> Iterator[tuple[LiveServer, FakeEngine, RecordingObserver]]:
    engine = FakeEngine(hold_runs=True)
    observer = RecordingObserver()
    settings = app_settings(tiny_model_dir, **overrides)
    app = create_app(settings, engine=engine, observer=observer)
    with live_server(app, settings, before_stop=engine.release) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        yield live, engine, observer


def runtime_of(live: LiveServer) -> Runtime:
    runtime: Runtime = live.app.state.runtime
    return runtime


@pytest.mark.parametrize(
    ("limits", "reason", "stages"),
    [
        # A full request queue refuses any request, so it is refused before its body is decoded or tokenized.
        ({"max_queue_requests": 1}, REJECT_QUEUE_REQUESTS, []),
        # The token bound depends on the request's own tokens: it is tokenized first.
        ({"max_queue_tokens": 5}, REJECT_QUEUE_TOKENS, ["parse", "tokenize"]),
    ],
    ids=["requests", "tokens"],
)
def test_a_full_queue_answers_429_with_retry_after(tiny_model_dir: Path, limits: dict[str, int], reason: str,
                                                   stages: list[str]) -> None:
    first, second, third = ["good"], ["a bad movie"], ["fun music"]  # 3, 5 and 4 tokens
    with gated_server(tiny_model_dir, **limits) as (live, engine, observer):
        batcher = live.app.state.batcher

        async def scenario() -> tuple[httpx.Response, ...]:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                held = asyncio.ensure_future(client.post("/v1/classify", json={"texts": first}))
                await asyncio.to_thread(engine.wait_for_rows, 1)  # the engine holds the first request
                queued = asyncio.ensure_future(client.post("/v1/classify", json={"texts": second}))
                await until(lambda: batcher.depth == (1, 5), "the second request is queued")
                refused = await client.post("/v1/classify", json={"texts": third}, headers={"X-Request-Id": "full"})
                engine.release()
                return await held, await queued, refused

        held, queued, refused = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        runtime = runtime_of(live)
    assert (held.status_code, queued.status_code) == (200, 200)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "overloaded"
    assert "queue is full" in refused.json()["error"]["message"]
    assert engine.rows == rows_of(runtime, first) + rows_of(runtime, second)  # the refused text never ran
    assert observer.rejected == [reason]
    record = next(r for r in observer.requests if r.request_id == "full")
    assert (record.status, record.error_code) == (429, "overloaded")
    assert [s.name for s in record.stages] == stages


def test_a_request_refused_early_is_not_decoded(tiny_model_dir: Path) -> None:
    """While the queue refuses every request, even a malformed body gets 429 (it is never decoded), not 400."""
    with gated_server(tiny_model_dir, max_queue_requests=1) as (live, engine, observer):
        batcher = live.app.state.batcher

        async def scenario() -> tuple[httpx.Response, ...]:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                held = asyncio.ensure_future(client.post("/v1/classify", json={"text": "good"}))
                await asyncio.to_thread(engine.wait_for_rows, 1)
                queued = asyncio.ensure_future(client.post("/v1/classify", json={"text": "a bad movie"}))
                await until(lambda: batcher.depth[0] == 1, "the second request is queued")
                refused = await client.post("/v1/classify", content=b"{not json", headers={
                    "content-type": "application/json", "X-Request-Id": "early"})
                engine.release()
                return await held, await queued, refused

        held, queued, refused = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        after = httpx.post(live.base_url + "/v1/classify", content=b"{not json",
                           headers={"content-type": "application/json"}, timeout=BOUND_S)
    assert (held.status_code, queued.status_code, refused.status_code) == (200, 200, 429)
    assert refused.json()["error"]["code"] == "overloaded" and int(refused.headers["retry-after"]) >= 1
    assert observer.rejected == [REJECT_QUEUE_REQUESTS]
    record = next(r for r in observer.requests if r.request_id == "early")
    assert record.stages == () and record.status == 429
    assert after.status_code == 400  # with room in the queue, the same body is decoded and refused as malformed


def test_a_refusal_beyond_the_budget_is_held_for_its_slot(tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals are paced (glassbox.service.http.pacing): with a budget of one a second and no burst, the first refusal
    is answered at once and the next one, sent right after, waits for its slot before its 429."""
    monkeypatch.setattr(pacing, "FLOOR_PER_S", 1.0)
    monkeypatch.setattr(pacing, "BURST_S", 0.0)
    with gated_server(tiny_model_dir, max_queue_requests=1) as (live, engine, observer):
        batcher = live.app.state.batcher

        async def scenario() -> tuple[list[httpx.Response], float]:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                held = asyncio.ensure_future(client.post("/v1/classify", json={"text": "good"}))
                await asyncio.to_thread(engine.wait_for_rows, 1)
                queued = asyncio.ensure_future(client.post("/v1/classify", json={"text": "a bad movie"}))
                await until(lambda: batcher.depth[0] == 1, "the second request is queued")
                first = await client.post("/v1/classify", json={"text": "fun music"})
                sent = asyncio.get_running_loop().time()
                second = await client.post("/v1/classify", json={"text": "fun music"},
                                           headers={"X-Request-Id": "paced"})
                waited = asyncio.get_running_loop().time() - sent
                engine.release()
                return [await held, await queued, first, second], waited

        answers, waited = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    assert waited >= 0.5  # its slot was a second after the first refusal's
    record = next(r for r in observer.requests if r.request_id == "paced")
    assert (record.status, record.error_code) == (429, "overloaded")
    assert (record.end_ns - record.start_ns) / 1e9 >= 0.5  # the hold is in the request's recorded duration


def test_a_deadline_that_passes_while_queued_answers_504_and_never_runs(tiny_model_dir: Path) -> None:
    late_texts = ["a bad movie", "the worst film"]
    with gated_server(tiny_model_dir) as (live, engine, observer):

        async def scenario() -> tuple[httpx.Response, httpx.Response, int]:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                held = asyncio.ensure_future(client.post("/v1/classify", json={"text": "good"}))
                await asyncio.to_thread(engine.wait_for_rows, 1)
                # The engine stays held until this answer arrives, so only the deadline can produce it.
                late = await client.post("/v1/classify", json={"texts": late_texts},
                                         headers={"X-Request-Timeout-Ms": "300", "X-Request-Id": "late"})
                rows_while_held = len(engine.rows)
                engine.release()
                return await held, late, rows_while_held

        held, late, rows_while_held = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        runtime = runtime_of(live)
        stats = live.app.state.batcher.stats()
    assert held.status_code == 200
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "deadline_exceeded"
    assert rows_while_held == 1
    assert engine.rows == rows_of(runtime, ["good"])  # the late request's texts never reached the engine
    assert stats.dropped[DROP_DEADLINE] == len(late_texts)
    assert (DROP_DEADLINE, len(late_texts)) in observer.dropped
    record = next(r for r in observer.requests if r.request_id == "late")
    assert (record.status, record.error_code, record.texts) == (504, "deadline_exceeded", 0)


def test_a_client_that_leaves_while_queued_never_reaches_the_engine(tiny_model_dir: Path) -> None:
    gone_texts = ["a bad movie", "the worst film", "slow"]
    with gated_server(tiny_model_dir) as (live, engine, observer):
        batcher = live.app.state.batcher

        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                held = asyncio.ensure_future(client.post("/v1/classify", json={"text": "good"}))
                await asyncio.to_thread(engine.wait_for_rows, 1)
                _, writer = await asyncio.open_connection("127.0.0.1", live.port)
                body = json.dumps({"texts": gone_texts}).encode()
                writer.write(b"POST /v1/classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"X-Request-Id: gone\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                await until(lambda: batcher.depth[0] == 1, "the leaving request is queued")
                writer.close()  # the client gives up while its texts wait behind the held batch
                await writer.wait_closed()
                await until(lambda: batcher.stats().dropped.get(DROP_DISCONNECTED) == len(gone_texts),
                            "the server noticed the disconnect and dropped the queued texts")
                await until(lambda: any(r.request_id == "gone" for r in observer.requests), "the request was recorded")
                engine.release()
                return await held

        held = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        runtime = runtime_of(live)
        assert batcher.depth == (0, 0)
    assert held.status_code == 200
    assert engine.rows == rows_of(runtime, ["good"])  # none of the leaving client's texts ran
    assert (DROP_DISCONNECTED, len(gone_texts)) in observer.dropped
    record = next(r for r in observer.requests if r.request_id == "gone")
    assert (record.status, record.error_code) == (499, "client_disconnected")
    assert [s.name for s in record.stages] == ["parse", "tokenize"]


def test_queued_requests_are_served_in_full_once_the_engine_frees_up(tiny_model_dir: Path) -> None:
    """The counterpart of the three above: with no limit hit, everything queued behind a busy engine is answered,
    each response carrying its own texts' answers, and every stage is reported."""
    batches = [["good"], ["a bad movie", "fun"], ["the worst film and a boring plot"], ["slow", "great", "sad"]]
    with gated_server(tiny_model_dir, max_batch_size=4) as (live, engine, _):
        batcher = live.app.state.batcher

        async def scenario() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=live.base_url, timeout=BOUND_S) as client:
                first = asyncio.ensure_future(client.post("/v1/classify", json={"texts": batches[0]}))
                await asyncio.to_thread(engine.wait_for_rows, 1)
                rest = [asyncio.ensure_future(client.post("/v1/classify", json={"texts": texts, "all_scores": True}))
                        for texts in batches[1:]]
                await until(lambda: batcher.depth[0] == len(rest), "the other requests are queued")
                engine.release()
                return [await first, *[await task for task in rest]]

        responses = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        runtime = runtime_of(live)
    for texts, response in zip(batches, responses, strict=True):
        assert response.status_code == 200
        logits = expected_logits(runtime, texts)
        assert [r["label"] for r in response.json()["results"]] == [LABELS[int(i)] for i in logits.argmax(axis=1)]
        timing = [part.split(";")[0].strip() for part in response.headers["server-timing"].split(",")]
        assert timing == list(STAGES)
    assert len(engine.rows) == sum(len(texts) for texts in batches)
    assert len(engine.batches) < 1 + 6  # six texts queued behind the first: some of them shared a batch
