"""Traces kept on their outcome (telemetry/tracing.py): ids named up front, every 5xx and every request slower than
the latency SLO kept whatever the ratio and the parent said, the ratio for the rest; batch spans held back until a
request that rode in them is kept, in one process and across the engine link; traceresponse, tracestate, links
from a request's infer span to its batches, and the HTTP server span attributes, through the real app."""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from prometheus_client import CollectorRegistry

from glassbox.service.app import create_app
from glassbox.service.batching import Batcher
from glassbox.service.ipc.hub import EngineHub
from glassbox.service.ipc.link import EngineLink
from glassbox.service.ipc.messages import State
from glassbox.service.observer import STAGES
from glassbox.service.settings import Settings
from glassbox.telemetry.metrics import build_metrics
from glassbox.telemetry.otlp import service_resource
from glassbox.telemetry.tracing import BATCH_SPAN, TRACE_DECISIONS, HeldBatches, RefusalBudget
from tests.service.apptools import FakeEngine, app_settings, live_server, ready_client, until, wait_until
from tests.service.test_batcher import FAR, limits, tokens
from tests.telemetry.tracetools import (
    HTTP,
    TRACE_ID,
    MemoryTracing,
    batch_record,
    memory_tracing,
    request_record,
    settings,
    slow_record,
    traceparent,
)

SERVER = "POST /v1/classify"
TRACERESPONSE = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])")
BOUND_S = 10.0


def ids_of(span: ReadableSpan) -> tuple[str, str]:
    return trace.format_trace_id(span.context.trace_id), trace.format_span_id(span.context.span_id)


def servers(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})["glassbox.request_id"]): s for s in spans if s.name == SERVER}


def batches(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {int((s.attributes or {})["glassbox.batch.id"]): s for s in spans if s.name == BATCH_SPAN}


# --- the rule, on hand-made records ---------------------------------------------------------------------------------
def test_at_ratio_0_every_5xx_every_slow_request_and_a_429_are_kept_and_fast_successes_are_not() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        for request_id, make in (("fast", lambda span: request_record("fast", batch_ids=(), span=span)),
                                 ("client-error", lambda span: request_record("client-error", status=429,
                                                                              error_code="overloaded", batch_ids=(),
                                                                              span=span)),
                                 ("failed", lambda span: request_record("failed", status=500,
                                                                        error_code="engine_error", batch_ids=(),
                                                                        span=span)),
                                 ("unavailable", lambda span: request_record("unavailable", status=503, batch_ids=(),
                                                                             span=span)),
                                 ("slow", lambda span: slow_record("slow", batch_ids=(), span=span))):
            span = observer.open_request(None)
            assert not span.sampled, request_id  # ratio 0: nothing is kept up front
            record = make(span)
            observer.on_request(record)
            ids = observer.ids_for(record)
            assert ids is not None and (ids.trace_id, ids.span_id) == (span.trace_id, span.span_id)
            assert ids.sampled == (request_id in ("client-error", "failed", "unavailable", "slow")), request_id
        spans = mem.spans()
    kept = servers(spans)
    assert set(kept) == {"client-error", "failed", "unavailable", "slow"}  # the 429 within the refusal budget
    assert len(spans) == 4 * (1 + len(STAGES))
    assert (kept["unavailable"].attributes or {})["error.type"] == "503"  # no code: the status says what failed


def test_429s_are_kept_up_to_the_refusal_budget_and_counted_by_why() -> None:
    """A burst of 20 refusals at 2 a second (the default budget): 2 kept, 18 dropped; a fast 200 dropped, a 5xx kept;
    glassbox_traces_total says so by reason, every series there from the start."""
    registry = CollectorRegistry()
    traces = build_metrics(registry).traces
    with memory_tracing(decisions=traces, trace_sample_ratio=0.0) as mem:  # bound as build_telemetry binds it
        observer = mem.tracing.observer
        zero = [registry.get_sample_value("glassbox_traces_total", {"decision": decision, "reason": reason})
                for decision, reason in TRACE_DECISIONS]
        assert zero == [0.0] * 6
        for number in range(20):
            span = observer.open_request(None)
            record = request_record(f"refused-{number}", status=429, error_code="overloaded", batch_ids=(), span=span)
            assert observer.trace_response(record) is not None  # decided here, once: on_request agrees with it
            observer.on_request(record)
        observer.on_request(request_record("fast", batch_ids=(), span=observer.open_request(None)))
        observer.on_request(request_record("failed", status=500, batch_ids=(), span=observer.open_request(None)))
        kept = servers(mem.spans())

    def count(decision: str, reason: str) -> float | None:
        return registry.get_sample_value("glassbox_traces_total", {"decision": decision, "reason": reason})

    assert sorted(kept) == ["failed", "refused-0", "refused-1"]
    assert count("kept", "refused") == 2 and count("dropped", "refusals_capped") == 18
    assert count("dropped", "unsampled") == 1 and count("kept", "error") == 1 and count("kept", "sampled") == 0


def test_the_refusal_budget_refills_at_its_rate() -> None:
    now = [0.0]
    budget = RefusalBudget(2.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, True, False]  # a burst of 2
    now[0] = 0.5
    assert [budget.take() for _ in range(2)] == [True, False]  # half a second: one more
    assert not RefusalBudget(0.0).take()  # 0: no 429 is kept for being a 429


def test_the_defaults_keep_a_small_share_and_the_outcomes() -> None:
    defaults = Settings()
    assert defaults.trace_sample_ratio == 0.01 and defaults.trace_refusals_per_s == 2.0
    with memory_tracing(trace_sample_ratio=defaults.trace_sample_ratio) as mem:
        observer = mem.tracing.observer
        up_front = [observer.open_request(None).sampled for _ in range(4000)]
    assert 10 <= sum(up_front) <= 80  # 1% of 4000 is 40; the ratio hashes trace ids, so it varies around it


def test_the_slow_threshold_is_the_latency_slo_setting() -> None:
    with memory_tracing(trace_sample_ratio=0.0, latency_slo_ms=1000.0) as mem:
        observer = mem.tracing.observer
        observer.on_request(slow_record("under-this-slo", slo_ms=250.0, batch_ids=()))
        observer.on_request(slow_record("over-it", slo_ms=1000.0, batch_ids=()))
        assert set(servers(mem.spans())) == {"over-it"}


def test_a_parent_may_raise_sampling_but_not_turn_it_off() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        sampled, unsampled = traceparent(), traceparent(sampled=False)
        raised = observer.open_request(sampled)
        assert raised.sampled and raised.trace_id == TRACE_ID
        observer.on_request(request_record("raised", batch_ids=(), traceparent=sampled, span=raised))
        for request_id, status in (("unsampled-fast", 200), ("unsampled-failed", 500)):
            span = observer.open_request(unsampled)
            assert not span.sampled and span.trace_id == TRACE_ID
            observer.on_request(request_record(request_id, status=status, batch_ids=(), traceparent=unsampled,
                                               span=span))
        kept = servers(mem.spans())
    assert set(kept) == {"raised", "unsampled-failed"}
    assert all(trace.format_trace_id(s.context.trace_id) == TRACE_ID for s in kept.values())
    assert kept["unsampled-failed"].parent is not None and kept["unsampled-failed"].parent.is_remote


def test_an_unsampled_parent_goes_by_the_ratio_like_a_root() -> None:
    with memory_tracing(trace_sample_ratio=1.0) as mem:
        span = mem.tracing.observer.open_request(traceparent(sampled=False))
    assert span.sampled


def test_a_request_never_opened_is_decided_on_its_outcome_too() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        mem.tracing.observer.on_request(request_record("fast", batch_ids=()))
        mem.tracing.observer.on_request(request_record("failed", status=500, batch_ids=()))
        assert set(servers(mem.spans())) == {"failed"}


# --- batches --------------------------------------------------------------------------------------------------------
def test_a_batch_of_requests_kept_only_for_their_outcome_is_exported_when_they_are() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        slow, fast = observer.open_request(None), observer.open_request(None)
        batch_span = observer.open_batch((slow, fast))
        assert not batch_span.sampled
        observer.on_batch(batch_record(4, ("slow", "fast"), spans=(slow, fast), span=batch_span))
        observer.on_batch(batch_record(5, ("fast",), spans=(fast,), span=observer.open_batch((fast,))))
        assert mem.spans() == []  # held: no request of theirs is kept yet
        observer.on_request(request_record("fast", batch_ids=(4, 5), span=fast))
        assert mem.spans() == []
        observer.on_request(slow_record("slow", batch_ids=(4,), span=slow, batch_spans=(batch_span,)))
        spans = mem.spans()
    [kept] = batches(spans).values()
    assert ids_of(kept) == (batch_span.trace_id, batch_span.span_id)
    assert {(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in kept.links} == {
        (slow.trace_id, slow.span_id), (fast.trace_id, fast.span_id)}
    # and back: the slow request's infer span links to the batch span
    [server] = servers(spans).values()
    [infer] = [s for s in spans if s.name == "infer" and s.parent is not None
               and s.parent.span_id == server.context.span_id]
    assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in infer.links] == [
        (batch_span.trace_id, batch_span.span_id)]
    assert (infer.links[0].attributes or {})["glassbox.batch.id"] == 4


def test_a_request_kept_before_its_batch_is_recorded_still_gets_the_batch() -> None:
    # The answers leave the engine thread before it reports the batch: the request may be recorded first.
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        span = observer.open_request(None)
        batch_span = observer.open_batch((span,))
        observer.on_request(request_record("failed", status=500, batch_ids=(9,), span=span))
        observer.on_batch(batch_record(9, ("failed",), spans=(span,), span=batch_span))
        assert set(batches(mem.spans())) == {9}


def test_batches_of_requests_kept_up_front_are_exported_at_once_with_an_exemplar_worthy_flag() -> None:
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        observer = mem.tracing.observer
        kept = observer.open_request(traceparent())
        batch_span = observer.open_batch((kept, None))
        assert batch_span.sampled
        observer.on_batch(batch_record(2, ("kept", "unnamed"), spans=(kept, None), span=batch_span))
        assert set(batches(mem.spans())) == {2}


def test_held_batches_and_early_asks_are_bounded() -> None:
    held = HeldBatches(limit=2)
    items = {batch_id: object() for batch_id in (1, 2, 3)}
    for batch_id, item in items.items():
        assert held.hold(batch_id, item) is False  # type: ignore[arg-type]
    assert len(held) == 2  # the oldest went first
    assert held.release((1, 2, 3)) == [items[2], items[3]]
    # 1 was not held (any more): remembered as asked for, so the batch is written if it is recorded after all
    assert held.hold(1, items[1]) is True  # type: ignore[arg-type]
    for batch_id in (10, 11, 12):
        held.release((batch_id,))
    assert held.hold(10, items[1]) is False  # type: ignore[arg-type]  # pushed out by 11 and 12


# --- across the engine link (the multi-process layout) ---------------------------------------------------------------
def test_a_worker_keeping_a_request_on_its_outcome_makes_the_engine_process_export_its_batch() -> None:
    async def scenario(engine_side: MemoryTracing, worker_side: MemoryTracing) -> None:
        engine_observer, worker_observer = engine_side.tracing.observer, worker_side.tracing.observer
        batcher = Batcher(FakeEngine(), limits(), engine_observer)
        batcher.start()
        try:
            with tempfile.TemporaryDirectory() as folder:
                path = str(Path(folder) / "engine.sock")
                hub = EngineHub(batcher, state=lambda: State("ready", "cpu", "", True, "", 1),
                                keep=engine_observer.keep_batches)
                await hub.listen(path)
                link = EngineLink(path)
                await link.start()
                assert await link.wait_connected(BOUND_S)
                worker_observer.forward_kept = link.keep_batches
                try:
                    fast, failed = worker_observer.open_request(None), worker_observer.open_request(None)
                    answers = []
                    for request_id, span in (("fast", fast), ("failed", failed)):
                        answers.append(await link.submit(tokens(3), FAR, request_id=request_id, span=span))
                    assert all(len(a.batch_spans) == len(a.batch_ids) == 1 for a in answers)
                    for (request_id, span, status), answer in zip((("fast", fast, 200), ("failed", failed, 500)),
                                                                  answers, strict=True):
                        worker_observer.on_request(request_record(
                            request_id, status=status, batch_ids=answer.batch_ids, span=span,
                            batch_spans=answer.batch_spans))
                    def failed_batch_exported() -> bool:
                        # The engine thread reports a batch after its answers went out, so the Keep may come first
                        # (the batch is then written when it is reported) or after (it is released from the held
                        # ones): either way it is exported, while the fast request's batch stays held.
                        exported = engine_side.exporter.get_finished_spans
                        return engine_side.tracing.flush(BOUND_S) and len(exported()) == 1

                    await until(lambda: engine_observer.held_batches == 1 and failed_batch_exported(),
                                "the failed request's batch is exported, the fast one's held")
                    [exported] = engine_side.exporter.get_finished_spans()
                    batch_span = answers[1].batch_spans[0]
                    assert ids_of(exported) == (batch_span.trace_id, batch_span.span_id)
                    assert [f"{link.context.span_id:016x}" for link in exported.links] == [failed.span_id]
                    [infer] = [s for s in worker_side.spans() if s.name == "infer"]
                    assert [f"{link.context.span_id:016x}" for link in infer.links] == [batch_span.span_id]
                finally:
                    await link.close()
                    await hub.close()
        finally:
            await asyncio.to_thread(batcher.stop, BOUND_S)

    with memory_tracing(trace_sample_ratio=0.0) as engine_side, memory_tracing(trace_sample_ratio=0.0) as worker_side:
        asyncio.run(asyncio.wait_for(scenario(engine_side, worker_side), BOUND_S))


# --- through the app ------------------------------------------------------------------------------------------------
def test_traceresponse_names_the_exported_server_span_and_says_whether_it_is_kept(tiny_model_dir: Path) -> None:
    engine = FakeEngine()
    with memory_tracing(trace_sample_ratio=0.0) as mem:
        app = create_app(app_settings(tiny_model_dir), engine=engine, observer=mem.tracing.observer)
        with ready_client(app) as client:
            fast = client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "fast"})
            kept = client.post("/v1/classify", json={"text": "good"},
                               headers={"X-Request-Id": "kept", "traceparent": traceparent(),
                                        "tracestate": "vendor=x1,other=y"})
            engine.fail_with[len(engine.batches)] = RuntimeError("boom")
            failed = client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "failed"})
            refused = client.post("/v1/classify", content=b"{", headers={"Content-Type": "application/json",
                                                                          "X-Request-Id": "refused"})
            health = client.get("/readyz")
        spans = mem.spans()
    assert [r.status_code for r in (fast, kept, failed, refused)] == [200, 200, 500, 400]
    exported = servers(spans)
    assert set(exported) == {"kept", "failed"}
    for response in (fast, kept, failed, refused):
        match = TRACERESPONSE.fullmatch(response.headers["traceresponse"])
        assert match is not None, response.headers["traceresponse"]
        trace_id, span_id, flags = match.groups()
        request_id = response.headers["x-request-id"]
        assert flags == ("01" if request_id in exported else "00")
        if request_id in exported:
            assert (trace_id, span_id) == ids_of(exported[request_id])
    assert TRACERESPONSE.fullmatch(kept.headers["traceresponse"]).group(1) == TRACE_ID  # type: ignore[union-attr]
    assert "traceresponse" not in health.headers  # no server span there
    # tracestate is passed on to the request's spans
    assert exported["kept"].context.trace_state.to_header() == "vendor=x1,other=y"
    assert all(s.context.trace_state.to_header() == "vendor=x1,other=y" for s in spans
               if s.context.trace_id == exported["kept"].context.trace_id)


def test_server_spans_carry_the_http_semantic_convention_attributes(tiny_model_dir: Path) -> None:
    with memory_tracing() as mem:
        app = create_app(app_settings(tiny_model_dir), observer=mem.tracing.observer)
        with ready_client(app) as client:
            ok = client.post("/v1/classify?truncate=true", json={"text": "good"},
                             headers={"User-Agent": "probe/1.0", "X-Request-Id": "ok"})
            bad = client.post("/v1/classify", content=b"{", headers={"Content-Type": "application/json",
                                                                      "X-Request-Id": "bad"})
        spans = mem.spans()
    assert (ok.status_code, bad.status_code) == (200, 400)
    attributes = dict(servers(spans)["ok"].attributes or {})
    assert {key: attributes.get(key) for key in (
        "http.request.method", "http.route", "http.response.status_code", "url.path", "url.query", "url.scheme",
        "client.address", "server.address", "server.port", "user_agent.original", "network.protocol.version")} == {
        "http.request.method": "POST", "http.route": "/v1/classify", "http.response.status_code": 200,
        "url.path": "/v1/classify", "url.query": "truncate=true", "url.scheme": "http",
        "client.address": "testclient", "server.address": "testserver", "server.port": 80,
        "user_agent.original": "probe/1.0", "network.protocol.version": "1.1"}
    assert "error.type" not in attributes
    refused = dict(servers(spans)["bad"].attributes or {})
    assert "error.type" not in refused and refused["glassbox.error.code"] == "invalid_json"  # a 4xx: no error.type


@pytest.mark.parametrize(("trusted", "client", "scheme"), [
    ("127.0.0.1,::1", "203.0.113.9", "https"),  # the default: a proxy on this host is believed
    ("10.0.0.0/8", "127.0.0.1", "http"),  # a peer outside the list: what it says it forwards is ignored
])
def test_behind_a_trusted_proxy_the_span_names_the_client_and_the_connection_names_the_proxy(
        tiny_model_dir: Path, trusted: str, client: str, scheme: str) -> None:
    settings = app_settings(tiny_model_dir, forwarded_allow_ips=trusted)
    with memory_tracing() as mem:
        app = create_app(settings, observer=mem.tracing.observer)
        with live_server(app, settings) as live:
            wait_until(lambda: httpx.get(live.base_url + "/readyz").status_code == 200, "the server is ready")
            with httpx.Client() as http:
                reply = http.post(live.base_url + "/v1/classify", json={"text": "good"},
                                  headers={"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https",
                                           "X-Request-Id": "forwarded"})
        spans = mem.spans()
    assert reply.status_code == 200
    attributes = dict(servers(spans)["forwarded"].attributes or {})
    assert (attributes["client.address"], attributes["url.scheme"]) == (client, scheme)
    # The connection's own peer is this test's socket, whatever the proxy headers say.
    assert attributes["network.peer.address"] == "127.0.0.1"
    assert isinstance(attributes["network.peer.port"], int) and attributes["network.peer.port"] > 0


@pytest.mark.parametrize(("host", "expected"), [
    ("glassbox.example:8443", ("glassbox.example", 8443)), ("glassbox.example", ("glassbox.example", 80)),
    ("[::1]:9000", ("::1", 9000)), ("[::1]", ("::1", 80)), (None, ("0.0.0.0", 8000)),
])
def test_server_address_and_port_come_from_the_host_header(host: str | None, expected: tuple[str, int]) -> None:
    from dataclasses import replace

    from glassbox.telemetry.spans import http_attributes

    attributes = http_attributes(replace(HTTP, host=host))
    assert (attributes["server.address"], attributes["server.port"]) == expected
    assert (attributes["client.address"], attributes["network.peer.port"]) == ("10.1.2.3", 51234)


# --- resource -------------------------------------------------------------------------------------------------------
def test_the_resource_names_the_instance_as_prometheus_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    pod = service_resource(settings(port=8123), {"POD_IP": "10.0.0.7", "POD_NAME": "glassbox-7d9f",
                                                 "POD_NAMESPACE": "inference"}).attributes
    assert {key: pod.get(key) for key in ("service.instance.id", "k8s.pod.name", "k8s.namespace.name")} == {
        "service.instance.id": "10.0.0.7:8123", "k8s.pod.name": "glassbox-7d9f", "k8s.namespace.name": "inference"}
    assert pod["host.name"]
    host = service_resource(settings(port=8000), {}).attributes
    assert host["service.instance.id"] == f"{host['host.name']}:8000" and "k8s.pod.name" not in host
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=glassbox:8000")
    told = service_resource(settings(), {"POD_IP": "10.0.0.7"}).attributes
    assert told["service.instance.id"] == "glassbox:8000"


def test_exported_spans_carry_the_instance() -> None:
    with memory_tracing() as mem:
        mem.tracing.observer.on_request(request_record(batch_ids=()))
        resources = {span.resource.attributes.get("service.instance.id") for span in mem.spans()}
    assert len(resources) == 1 and None not in resources


def test_answers_outside_the_classify_path_carry_the_same_http_attributes_and_trace_state(
        tiny_model_dir: Path) -> None:
    # A 404, a 405 and a 401 are recorded by the router's and the API key's handlers, not by classify: their server
    # spans must still say which path was asked for (url.path and url.scheme are required by the conventions), pass
    # on the caller's tracestate, and the answer must name its trace.
    parent = {"traceparent": traceparent(), "tracestate": "vendor=x1"}
    with memory_tracing() as mem:
        app = create_app(app_settings(tiny_model_dir, api_key="k" * 16), observer=mem.tracing.observer)
        with ready_client(app) as client:
            answers = {
                "lost": client.get("/no/such/path?x=1", headers={**parent, "X-Request-Id": "lost",
                                                                 "User-Agent": "probe/1.0"}),
                "wrong": client.delete("/v1/classify", headers={**parent, "X-Request-Id": "wrong"}),
                "nokey": client.post("/v1/classify", json={"text": "good"},
                                     headers={**parent, "X-Request-Id": "nokey"}),
            }
        spans = mem.spans()
    assert {name: r.status_code for name, r in answers.items()} == {"lost": 404, "wrong": 405, "nokey": 401}
    by_id = {str((s.attributes or {})["glassbox.request_id"]): s for s in spans if s.kind == trace.SpanKind.SERVER}
    assert set(by_id) == set(answers)
    paths = {"lost": "/no/such/path", "wrong": "/v1/classify", "nokey": "/v1/classify"}
    for name, span in by_id.items():
        attributes = dict(span.attributes or {})
        assert attributes.get("url.path") == paths[name], name
        assert attributes.get("url.scheme") == "http", name
        assert attributes.get("client.address") == "testclient", name
        assert attributes.get("server.address") == "testserver", name
        assert span.context.trace_state.to_header() == "vendor=x1", name
        context = span.context
        assert answers[name].headers.get("traceresponse") == f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
    assert dict(by_id["lost"].attributes or {})["url.query"] == "x=1"
    assert dict(by_id["lost"].attributes or {})["user_agent.original"] == "probe/1.0"
