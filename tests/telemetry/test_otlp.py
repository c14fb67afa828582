"""telemetry/otlp.py over the wire: the real app's spans through the real OTLP exporters (HTTP/protobuf, and gRPC
where grpcio is installed) into a receiver built from opentelemetry-proto (tests/telemetry/otlp_receiver.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from glassbox.service.app import create_app
from glassbox.service.observer import STAGES
from glassbox.telemetry.otlp import build_tracing, span_exporter
from glassbox.telemetry.tracing import BATCH_SPAN
from tests.service.apptools import FakeEngine, app_settings, ready_client
from tests.telemetry.otlp_receiver import (
    ReceivedSpan,
    Receiver,
    http_receiver,
)
from tests.telemetry.tracetools import PARENT_SPAN_ID, TRACE_ID, batch_record, request_record, settings, traceparent

SERVER = "POST /v1/classify"


def test_no_endpoint_means_no_exporter_and_no_tracing() -> None:
    assert span_exporter(settings()) is None
    assert build_tracing(settings()) is None
    assert build_tracing(settings(otlp_endpoint="http://127.0.0.1:4318", telemetry=False)) is None


def test_the_apps_spans_arrive_over_otlp_with_parents_links_and_trace_ids(
    tiny_model_dir: Path, receiver: tuple[str, Receiver]
) -> None:
    protocol, running = receiver
    tracing = build_tracing(app_settings(tiny_model_dir, otlp_endpoint=running.endpoint, otlp_protocol=protocol,
                                         service_name="glassbox-test", trace_sample_ratio=1.0))
    assert tracing is not None
    try:
        app = create_app(app_settings(tiny_model_dir), observer=tracing.observer)
        with ready_client(app) as client:
            plain = client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "plain"})
            remote = client.post("/v1/classify", json={"texts": ["bad", "great fun"]},
                                 headers={"traceparent": traceparent(), "X-Request-Id": "remote"})
        assert [plain.status_code, remote.status_code] == [200, 200]
        assert tracing.flush(10.0)
    finally:
        tracing.shutdown()
    spans = running.spans()
    assert running.store.requests >= 1
    if protocol == "http/protobuf":
        assert set(running.store.content_types) == {"application/x-protobuf"}
    assert {span.resource["service.name"] for span in spans} == {"glassbox-test"}

    servers = {span.attributes["glassbox.request_id"]: span for span in spans if span.name == SERVER}
    assert set(servers) == {"plain", "remote"}
    assert servers["plain"].parent_span_id == "" and servers["plain"].trace_id != TRACE_ID
    assert (servers["remote"].trace_id, servers["remote"].parent_span_id) == (TRACE_ID, PARENT_SPAN_ID)
    for server in servers.values():
        assert server.kind == "SPAN_KIND_SERVER"
        stages = sorted((s for s in spans if s.parent_span_id == server.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in stages] == list(STAGES)
        assert all(s.trace_id == server.trace_id for s in stages)
        assert server.start_ns <= stages[0].start_ns and stages[-1].end_ns <= server.end_ns
        for batch_id in server.attributes["glassbox.batch.ids"]:
            [batch] = [s for s in spans if s.name == BATCH_SPAN and s.attributes["glassbox.batch.id"] == batch_id]
            assert (server.trace_id, server.span_id) in {(link.trace_id, link.span_id) for link in batch.links}
            assert batch.parent_span_id == ""


def batch_links(spans: list[ReceivedSpan]) -> list[tuple[str, str]]:
    return [(link.trace_id, link.span_id) for span in spans if span.name == BATCH_SPAN for link in span.links]


@pytest.mark.parametrize("endpoint", ["{base}/v1/traces", "{host}"], ids=["full-url", "no-scheme"])
def test_http_endpoint_spellings_and_shutdown_flushes(endpoint: str) -> None:
    with http_receiver() as running:
        given = endpoint.format(base=running.endpoint, host=running.endpoint.removeprefix("http://"))
        tracing = build_tracing(settings(otlp_endpoint=given, trace_sample_ratio=1.0))
        assert tracing is not None
        tracing.observer.on_request(request_record("r1", batch_ids=()))
        tracing.shutdown()  # no flush first: shutdown must export what is queued
        assert sorted(span.name for span in running.spans()) == sorted([SERVER, *STAGES])


def test_the_sample_ratio_applies_to_new_traces_not_to_sampled_parents() -> None:
    with http_receiver() as running:
        tracing = build_tracing(settings(otlp_endpoint=running.endpoint, trace_sample_ratio=0.0))
        assert tracing is not None
        observer = tracing.observer
        new, continued = observer.open_request(None), observer.open_request(traceparent())
        observer.on_batch(batch_record(1, ("new",), spans=(new,)))
        observer.on_batch(batch_record(2, ("continued",), spans=(continued,)))
        observer.on_request(request_record("new", batch_ids=(1,), span=new))
        observer.on_request(request_record("continued", batch_ids=(2,), traceparent=traceparent(), span=continued))
        assert tracing.flush(10.0)
        tracing.shutdown()
        spans = running.spans()
    assert {span.attributes.get("glassbox.request_id") for span in spans if span.name == SERVER} == {"continued"}
    [server] = [span for span in spans if span.name == SERVER]
    assert server.trace_id == TRACE_ID
    assert batch_links(spans) == [(server.trace_id, server.span_id)]


def test_each_kept_class_reaches_the_receiver_and_a_fast_200_builds_nothing(tiny_model_dir: Path) -> None:
    """The defaults' keep rule over the real OTLP/HTTP exporter (the ratio at 0 so that chance keeps nothing): a 5xx,
    an answer slower than the SLO, a 429 within the refusal budget and a sampled parent arrive; a fast 200 and a 429
    beyond the budget do not, and the dropped 200 queued nothing for the export thread."""
    with http_receiver() as running:
        tracing = build_tracing(app_settings(tiny_model_dir, otlp_endpoint=running.endpoint, trace_sample_ratio=0.0,
                                             trace_refusals_per_s=1.0))
        assert tracing is not None
        engine = FakeEngine()
        engine.fail_with[2] = RuntimeError("boom")  # the third batch: the request "failed"
        queued: list[object] = []
        processor_on_end = tracing.processor.on_end
        tracing.processor.on_end = lambda item: (queued.append(item), processor_on_end(item))[1]  # type: ignore[method-assign]
        try:
            app = create_app(app_settings(tiny_model_dir), engine=engine, observer=tracing.observer)
            with ready_client(app) as client:
                fast = client.post("/v1/classify", json={"text": "fast"}, headers={"X-Request-Id": "fast"})
                assert fast.status_code == 200 and fast.headers["traceresponse"].endswith("-00")
                assert queued == []  # a dropped trace: nothing built, nothing queued
                sampled = client.post("/v1/classify", json={"text": "asked"},
                                      headers={"X-Request-Id": "sampled", "traceparent": traceparent()})
                failed = client.post("/v1/classify", json={"text": "boom"}, headers={"X-Request-Id": "failed"})
                engine.run_gate.clear()  # the next run waits until the timer opens the gate: over the 250 ms SLO
                opener = threading.Timer(0.4, engine.run_gate.set)
                opener.start()
                slow = client.post("/v1/classify", json={"text": "slow"}, headers={"X-Request-Id": "slow"})
                opener.join()
            assert [sampled.status_code, failed.status_code, slow.status_code] == [200, 500, 200]
            for number in range(2):  # a budget of 1 a second: the first refusal kept, the second dropped
                tracing.observer.on_request(request_record(f"refused-{number}", status=429, error_code="overloaded",
                                                           batch_ids=()))
            assert tracing.flush(10.0)
        finally:
            tracing.shutdown()
        kept = {span.attributes["glassbox.request_id"] for span in running.spans() if span.name.startswith("POST")}
    assert kept == {"sampled", "failed", "slow", "refused-0"}
