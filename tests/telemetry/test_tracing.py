"""telemetry/tracing.py: spans from records (names, parents, real times, batch links, remote parents, no text), on
hand-made records and then end to end through the real app with the tiny model, exported to memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from glassbox.service.app import create_app
from glassbox.service.observer import STAGES
from glassbox.telemetry.tracing import BATCH_SPAN, TEXT_ATTRIBUTE, TracingObserver
from tests.service.apptools import BOUND_S, FakeEngine, app_settings, parse_server_timing, ready_client, wait_until
from tests.telemetry.tracetools import (
    PARENT_SPAN_ID,
    TRACE_ID,
    MemoryTracing,
    batch_record,
    every_string,
    memory_tracing,
    request_record,
    traceparent,
)

SERVER = "POST /v1/classify"


@pytest.fixture
def mem() -> Iterator[MemoryTracing]:
    with memory_tracing() as tracing:
        yield tracing


def attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def children_of(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def assert_request_tree(spans: list[ReadableSpan], server: ReadableSpan) -> list[ReadableSpan]:
    """The server span's children are the five stages, in order, inside its interval; returns them."""
    stages = sorted(children_of(spans, server), key=lambda s: s.start_time or 0)
    assert [s.name for s in stages] == list(STAGES)
    assert server.start_time is not None and server.end_time is not None
    previous_end = server.start_time
    for stage in stages:
        assert stage.context.trace_id == server.context.trace_id
        assert stage.start_time is not None and stage.end_time is not None
        assert previous_end <= stage.start_time <= stage.end_time <= server.end_time
        previous_end = stage.end_time
    return stages


# --- one request -----------------------------------------------------------------------------------------------------
def test_server_span_with_stage_children_at_their_real_times(mem: MemoryTracing) -> None:
    record = request_record(batch_ids=())
    mem.tracing.observer.on_request(record)
    spans = mem.spans()
    [server] = by_name(spans, SERVER)
    assert server.kind == SpanKind.SERVER
    assert server.parent is None
    assert server.attributes is not None
    assert server.attributes["http.route"] == "/v1/classify"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["glassbox.request_id"] == "r1"
    offset = record.wall_start_ns - record.start_ns
    assert (server.start_time, server.end_time) == (record.wall_start_ns, record.end_ns + offset)
    stages = assert_request_tree(spans, server)
    for span, stage in zip(stages, record.stages, strict=True):
        assert (span.start_time, span.end_time) == (stage.start_ns + offset, stage.end_ns + offset)
    assert len(spans) == 1 + len(STAGES)


def test_a_traceparent_makes_the_server_span_a_child_of_the_remote_span(mem: MemoryTracing) -> None:
    mem.tracing.observer.on_request(request_record(traceparent=traceparent(), batch_ids=()))
    spans = mem.spans()
    [server] = by_name(spans, SERVER)
    assert trace.format_trace_id(server.context.trace_id) == TRACE_ID
    assert server.parent is not None and server.parent.is_remote
    assert trace.format_span_id(server.parent.span_id) == PARENT_SPAN_ID
    assert all(s.context.trace_id == server.context.trace_id for s in spans)


@pytest.mark.parametrize("header", ["", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                                    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"])
def test_a_missing_or_invalid_traceparent_starts_a_new_trace(mem: MemoryTracing, header: str) -> None:
    mem.tracing.observer.on_request(request_record(traceparent=header or None, batch_ids=()))
    [server] = by_name(mem.spans(), SERVER)
    assert server.parent is None
    assert trace.format_trace_id(server.context.trace_id) != TRACE_ID


def test_an_unsampled_traceparent_does_not_keep_a_fast_answer_at_ratio_0() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        record = request_record(traceparent=traceparent(sampled=False), batch_ids=())
        mem.tracing.observer.on_request(record)
        ids = mem.tracing.observer.ids_for(record)
        assert ids is not None and (ids.trace_id, ids.sampled) == (TRACE_ID, False)
        assert mem.spans() == []


@pytest.mark.parametrize(("status", "code", "expected"), [(500, "engine_error", StatusCode.ERROR),
                                                          (429, "overloaded", StatusCode.UNSET)])
def test_errors_carry_their_code_and_only_5xx_marks_the_span_failed(
    mem: MemoryTracing, status: int, code: str, expected: StatusCode
) -> None:
    mem.tracing.observer.on_request(request_record(status=status, error_code=code, batch_ids=()))
    [server] = by_name(mem.spans(), SERVER)
    assert server.attributes is not None and server.attributes["glassbox.error.code"] == code
    # The HTTP conventions set error.type on a server span for a 5xx only: a 4xx is the client's error.
    assert server.attributes.get("error.type") == (code if status >= 500 else None)
    assert server.status.status_code == expected


def test_ids_for_answers_only_for_the_record_it_just_handled(mem: MemoryTracing) -> None:
    observer = mem.tracing.observer
    first, second = request_record("a", batch_ids=()), request_record("b", batch_ids=())
    observer.on_request(first)
    observer.on_request(second)
    ids = observer.ids_for(second)
    assert observer.ids_for(first) is None
    [server] = [s for s in by_name(mem.spans(), SERVER) if s.attributes and s.attributes["glassbox.request_id"] == "b"]
    assert ids is not None and ids.sampled
    assert (ids.trace_id, ids.span_id) == (trace.format_trace_id(server.context.trace_id),
                                           trace.format_span_id(server.context.span_id))


# --- batches ---------------------------------------------------------------------------------------------------------
def server_spans_by_request(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})["glassbox.request_id"]): s for s in by_name(spans, SERVER)}


def linked(batch: ReadableSpan) -> set[tuple[int, int]]:
    return {(link.context.trace_id, link.context.span_id) for link in batch.links}


def test_a_batch_span_links_to_every_request_in_it_as_soon_as_it_ran(mem: MemoryTracing) -> None:
    # Requests name their server spans when they start; the batch is linked to them before any of them ends.
    observer = mem.tracing.observer
    span_a, span_b = observer.open_request(traceparent()), observer.open_request(None)
    a = request_record("a", batch_ids=(7,), traceparent=traceparent(), span=span_a)
    b = request_record("b", batch_ids=(7,), span=span_b)
    batch = batch_record(7, ("a", "b"), start_ns=a.stages[2].end_ns, spans=(span_a, span_b))
    offset = time.time_ns() - time.perf_counter_ns()
    observer.on_batch(batch)
    assert [s.name for s in mem.spans()] == [BATCH_SPAN]  # emitted at once, not held for its requests
    observer.on_request(a)
    observer.on_request(b)
    spans = mem.spans()
    [batch_span] = by_name(spans, BATCH_SPAN)
    servers = server_spans_by_request(spans)
    assert linked(batch_span) == {(s.context.trace_id, s.context.span_id) for s in servers.values()}
    assert {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in servers.values()} == {
        (span_a.trace_id, span_a.span_id), (span_b.trace_id, span_b.span_id)}
    assert batch_span.parent is None
    assert batch_span.attributes is not None
    assert {k: batch_span.attributes[k] for k in ("glassbox.device", "glassbox.engine.mode", "glassbox.batch.bucket",
                                                  "glassbox.batch.rows", "glassbox.batch.tokens")} == {
        "glassbox.device": "cpu", "glassbox.engine.mode": "eager", "glassbox.batch.bucket": "4x8",
        "glassbox.batch.rows": 4, "glassbox.batch.tokens": 17}
    assert "glassbox.batch.unlinked_requests" not in batch_span.attributes
    # perf_counter times shifted to wall-clock time by the offset measured when the span was made
    assert batch_span.start_time is not None and batch_span.end_time is not None
    assert abs(batch_span.start_time - (batch.timing.start_ns + offset)) < 50_000_000
    assert batch_span.end_time - batch_span.start_time == batch.timing.end_ns - batch.timing.start_ns


def test_a_request_split_over_two_batches_is_linked_from_both(mem: MemoryTracing) -> None:
    observer = mem.tracing.observer
    big, small = observer.open_request(None), observer.open_request(None)
    observer.on_batch(batch_record(1, ("big", "small"), spans=(big, small)))
    observer.on_batch(batch_record(2, ("big",), spans=(big,)))
    observer.on_request(request_record("small", batch_ids=(1,), span=small))
    observer.on_request(request_record("big", batch_ids=(1, 2), span=big))
    spans = mem.spans()
    servers = server_spans_by_request(spans)
    batches = {int(attr(s, "glassbox.batch.id")): s for s in by_name(spans, BATCH_SPAN)}
    big_ctx, small_ctx = servers["big"].context, servers["small"].context
    assert linked(batches[1]) == {(big_ctx.trace_id, big_ctx.span_id), (small_ctx.trace_id, small_ctx.span_id)}
    assert linked(batches[2]) == {(big_ctx.trace_id, big_ctx.span_id)}


def test_requests_never_opened_leave_their_batch_unlinked_and_say_so(mem: MemoryTracing) -> None:
    observer = mem.tracing.observer
    opened = observer.open_request(None)
    observer.on_batch(batch_record(3, ("opened", "unnamed"), spans=(opened, None)))
    observer.on_batch(batch_record(4, ("gone",)))  # a caller that passed no spans at all
    batches = {int(attr(s, "glassbox.batch.id")): s for s in by_name(mem.spans(), BATCH_SPAN)}
    assert len(batches[3].links) == 1 and (batches[3].attributes or {})["glassbox.batch.unlinked_requests"] == 1
    assert not batches[4].links and (batches[4].attributes or {})["glassbox.batch.unlinked_requests"] == 1


def test_the_event_loop_only_queues_items_and_the_export_thread_builds_spans(mem: MemoryTracing) -> None:
    queued: list[object] = []
    processor = mem.tracing.processor

    class Recording:
        def on_end(self, item: object) -> None:
            queued.append(item)
            processor.on_end(item)  # type: ignore[arg-type]

    observer = TracingObserver(mem.tracing.provider, Recording())  # type: ignore[arg-type]
    span = observer.open_request(None)
    observer.on_batch(batch_record(5, ("r1",), spans=(span,)))
    observer.on_request(request_record("r1", batch_ids=(5,), span=span))
    assert [type(item).__name__ for item in queued] == ["BatchSpans", "RequestSpans"]
    assert sorted(s.name for s in mem.spans()) == sorted([SERVER, *STAGES, BATCH_SPAN])


def test_a_request_that_was_never_opened_still_gets_its_spans(mem: MemoryTracing) -> None:
    mem.tracing.observer.on_request(request_record("late", batch_ids=()))
    assert sorted(s.name for s in mem.spans()) == sorted([SERVER, *STAGES])


def test_sampling_keeps_batches_that_link_to_sampled_requests() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        kept, dropped = observer.open_request(traceparent()), observer.open_request(None)
        assert (kept.sampled, dropped.sampled) == (True, False)
        observer.on_batch(batch_record(1, ("kept",), spans=(kept,)))
        observer.on_batch(batch_record(2, ("dropped",), spans=(dropped,)))
        observer.on_request(request_record("kept", batch_ids=(1,), traceparent=traceparent(), span=kept))
        observer.on_request(request_record("dropped", batch_ids=(2,), span=dropped))
        spans = mem.spans()
    assert sorted(s.name for s in spans) == sorted([SERVER, *STAGES, BATCH_SPAN])
    [batch] = by_name(spans, BATCH_SPAN)
    assert (batch.attributes or {})["glassbox.batch.id"] == 1


# --- text ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("record_text", [False, True])
def test_raw_text_reaches_spans_only_when_asked(record_text: bool) -> None:
    with memory_tracing(record_text=record_text) as mem:
        mem.tracing.observer.on_batch(batch_record(1, ("r1",)))
        mem.tracing.observer.on_request(request_record(attributes={"text": "my secret zebra"}, batch_ids=(1,)))
        spans = mem.spans()
    assert len(spans) == 2 + len(STAGES)
    leaked = [s.name for s in spans if any("zebra" in text for text in every_string(s))]
    if record_text:
        [server] = by_name(spans, SERVER)
        assert (server.attributes or {})[TEXT_ATTRIBUTE] == "my secret zebra"
        assert leaked == [SERVER]
    else:
        assert leaked == []


# --- end to end through the app --------------------------------------------------------------------------------------
def test_the_app_exports_request_trees_linked_batches_and_remote_parents(tiny_model_dir: Path) -> None:
    with memory_tracing() as mem:
        app = create_app(app_settings(tiny_model_dir, max_batch_size=2), observer=mem.tracing.observer)
        with ready_client(app) as client:
            plain = client.post("/v1/classify", json={"text": "a good zebra movie"})
            remote = client.post("/v1/classify", json={"texts": ["bad", "great fun", "zebra"]},
                                 headers={"traceparent": traceparent(), "X-Request-Id": "with-parent"})
            refused = client.post("/v1/classify", content=b"{", headers={"Content-Type": "application/json"})
        spans = mem.spans()
    assert [r.status_code for r in (plain, remote, refused)] == [200, 200, 400]
    servers = server_spans_by_request(spans)
    assert set(servers) == {r.headers["x-request-id"] for r in (plain, remote, refused)}

    for response in (plain, remote):
        server = servers[response.headers["x-request-id"]]
        stages = assert_request_tree(spans, server)
        # The spans are the very timings the client was told about in Server-Timing.
        told = parse_server_timing(response.headers["server-timing"])
        assert [name for name, _ in told] == [s.name for s in stages]
        for (_, ms), span in zip(told, stages, strict=True):
            assert span.end_time is not None and span.start_time is not None
            assert (span.end_time - span.start_time) / 1e6 == pytest.approx(ms, abs=0.0011)
        # Every batch the request was in has a span that links back to it, and its infer span links to each.
        batch_ids = list(attr(server, "glassbox.batch.ids"))
        assert batch_ids
        [infer] = [stage for stage in stages if stage.name == "infer"]
        assert [(link.attributes or {})["glassbox.batch.id"] for link in infer.links] == batch_ids
        for batch_id, link in zip(batch_ids, infer.links, strict=True):
            [batch] = [b for b in by_name(spans, BATCH_SPAN) if attr(b, "glassbox.batch.id") == batch_id]
            assert (server.context.trace_id, server.context.span_id) in linked(batch)
            assert (link.context.trace_id, link.context.span_id) == (batch.context.trace_id, batch.context.span_id)

    with_parent = servers["with-parent"]
    assert trace.format_trace_id(with_parent.context.trace_id) == TRACE_ID
    assert with_parent.parent is not None and trace.format_span_id(with_parent.parent.span_id) == PARENT_SPAN_ID
    assert len(list(attr(with_parent, "glassbox.batch.ids"))) == 2  # 3 texts, batches of 2
    assert servers[plain.headers["x-request-id"]].parent is None

    failed = servers[refused.headers["x-request-id"]]
    assert (failed.attributes or {})["glassbox.error.code"] == "invalid_json"
    assert "error.type" not in (failed.attributes or {})
    assert [s.name for s in children_of(spans, failed)] == []  # parse failed before its lap was taken
    assert not any("zebra" in text for span in spans for text in every_string(span))


def test_requests_that_share_a_batch_are_all_linked_from_it(tiny_model_dir: Path) -> None:
    # The engine is held on a first request, so the next two queue up and run together in one batch.
    engine = FakeEngine(hold_runs=True)
    with memory_tracing() as mem:
        app = create_app(app_settings(tiny_model_dir), engine=engine, observer=mem.tracing.observer)
        with ready_client(app) as client:
            statuses: dict[str, int] = {}

            def send(request_id: str) -> None:
                response = client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": request_id})
                statuses[request_id] = response.status_code

            first = threading.Thread(target=send, args=("first",))
            first.start()
            engine.wait_for_rows(1)
            others = [threading.Thread(target=send, args=(name,)) for name in ("second", "third")]
            for thread in others:
                thread.start()
            wait_until(lambda: app.state.batcher.stats().queued_requests == 2, "two requests are queued")
            engine.release()
            for thread in (first, *others):
                thread.join(BOUND_S)
        spans = mem.spans()
    assert statuses == {"first": 200, "second": 200, "third": 200}
    servers = server_spans_by_request(spans)
    batches = by_name(spans, BATCH_SPAN)
    assert len(batches) == 2
    shared = [b for b in batches if len(b.links) == 2]
    assert len(shared) == 1
    assert linked(shared[0]) == {(servers[n].context.trace_id, servers[n].context.span_id)
                                 for n in ("second", "third")}


def test_a_request_no_route_took_is_named_by_its_method_alone(tiny_model_dir: Path) -> None:
    with memory_tracing() as mem:
        app = create_app(app_settings(tiny_model_dir), observer=mem.tracing.observer)
        with ready_client(app) as client:
            missing = client.get("/no/such/path", headers={"X-Request-Id": "lost"})
            wrong_method = client.delete("/v1/classify", headers={"X-Request-Id": "wrong"})
        spans = mem.spans()
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    servers = {attr(s, "glassbox.request_id"): s for s in spans if s.kind == SpanKind.SERVER}
    assert (servers["lost"].name, servers["wrong"].name) == ("GET", "DELETE")
    # The conventions name a route only where one matched: a made-up path must not become a span name or route.
    assert all("http.route" not in (s.attributes or {}) for s in servers.values())
    assert attr(servers["lost"], "http.response.status_code") == 404
    for response, request_id in ((missing, "lost"), (wrong_method, "wrong")):  # the answer leads to its trace
        server = servers[request_id].context
        assert response.headers["traceresponse"] == f"00-{server.trace_id:032x}-{server.span_id:016x}-01"


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.5, 1.0])
def test_the_quick_root_decision_is_the_samplers_own(ratio: float) -> None:
    # open_request (no traceparent) and open_batch (no sampled request) decide a root without the sampler's objects;
    # the answer must be the one the provider's sampler gives for the same trace id.
    import random

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Decision

    from glassbox.telemetry.otlp import build_sampler
    from glassbox.telemetry.tracing import _Decider

    sampler = build_sampler(ratio)
    decider = _Decider(TracerProvider(sampler=sampler))
    rng = random.Random(7)
    ids = [rng.getrandbits(128) or 1 for _ in range(4000)]
    decider.new_trace_id = iter(ids).__next__  # the ids the quick path draws, in order
    kept = [decider.root("request", SpanKind.SERVER).sampled for _ in ids]
    expected = [sampler.should_sample(Context(), trace_id, "request", SpanKind.SERVER).decision
                is Decision.RECORD_AND_SAMPLE for trace_id in ids]
    assert kept == expected
    assert (0 < sum(kept) < len(ids)) == (0 < ratio < 1)  # the ids cover both answers where the ratio has two
