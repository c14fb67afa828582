"""telemetry/setup.py and its wiring into the app: /metrics through the real app (content negotiation, exemplars,
gzip), no GPU metric on the CPU, bounded labels, the caller's observer kept, scrape-time collectors bound, the
lifespan hooks, and `glassbox serve` exporting metrics for real."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.observer import BatchRecord, RequestRecord
from glassbox.service.types import START_MODES, WarmupReport
from glassbox.telemetry import Telemetry, build_metrics, build_telemetry
from glassbox.telemetry.collectors import AllocatorSample, NvmlReader
from glassbox.telemetry.setup import REMOTE_SCRAPE_TIMEOUT_S, GpuReaders, remote_scrape_budget_s
from tests.service.apptools import BOUND_S, RecordingObserver, app_settings, live_server, ready_client, wait_until
from tests.telemetry.test_collectors import MEMORY_STATS, FakeBatcher, FakeNvml

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"


def telemetry_for_tests(**kwargs: Any) -> Telemetry:
    # No OTLP endpoint in app_settings: metrics and request logs only, on a fresh registry.
    return build_telemetry(app_settings(Path(".")), lag_interval_s=0.05, **kwargs)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[TestClient, Telemetry, RecordingObserver]]:
    telemetry, recording = telemetry_for_tests(), RecordingObserver()
    app = create_app(app_settings(tiny_model_dir), observer=recording, telemetry=telemetry)
    with ready_client(app) as client:
        yield client, telemetry, recording


def sample(telemetry: Telemetry, name: str, **labels: str) -> float | None:
    return telemetry.registry.get_sample_value(name, labels)


def test_metrics_negotiates_openmetrics_with_exemplars_else_text(
    served: tuple[TestClient, Telemetry, RecordingObserver]
) -> None:
    client, _, _ = served
    response = client.post("/v1/classify", json={"text": "a good movie"}, headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    om = client.get("/metrics", headers={"Accept": OPENMETRICS})
    assert om.status_code == 200
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(om.text)}
    carried = [s.exemplar.labels for s in families["glassbox_request_duration_seconds"].samples if s.exemplar]
    assert {"trace_id": TRACE} in carried
    stage_exemplars = [s for s in families["glassbox_stage_duration_seconds"].samples if s.exemplar]
    assert {s.labels["stage"] for s in stage_exemplars} >= {"parse", "tokenize", "queue", "infer", "postprocess"}

    text = client.get("/metrics")
    assert text.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert " # {" not in text.text  # the text format has no exemplars
    names = {f.name for f in parse_text(text.text)}
    assert {"glassbox_requests", "glassbox_request_duration_seconds", "glassbox_queue_requests",
            "glassbox_queue_tokens", "process_resident_memory_bytes", "python_gc_collections"} <= names


def test_metrics_is_gzipped_when_the_scraper_accepts_it(
    served: tuple[TestClient, Telemetry, RecordingObserver]
) -> None:
    client, _, _ = served
    response = client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert "glassbox_build_info" in response.text  # httpx decompressed it
    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers


def test_metrics_keeps_only_the_samples_named_in_the_query(
    served: tuple[TestClient, Telemetry, RecordingObserver]
) -> None:
    """`?name[]=` as prometheus_client's own handler takes it: sample names, repeatable, in either format."""
    client, _, _ = served
    client.post("/v1/classify", json={"text": "a good movie"})
    wanted = ["glassbox_requests_total", "glassbox_queue_requests"]
    for accept in ("", OPENMETRICS):
        response = client.get("/metrics", params={"name[]": wanted}, headers={"Accept": accept} if accept else {})
        assert response.status_code == 200
        parse = parse_openmetrics if accept else parse_text
        samples = {s.name for f in parse(response.text) for s in f.samples}
        assert samples == set(wanted)
    assert client.get("/metrics", params={"name[]": "glassbox_no_such_sample"}).text == ""


def test_no_gpu_metric_exists_on_a_cpu_server(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, telemetry, _ = served
    client.post("/v1/classify", json={"text": "warm"})
    exposed = {f.name for f in parse_text(client.get("/metrics").text) if f.samples}
    gpu = [spec.name for spec in telemetry.metrics.catalogue if spec.gpu_only]
    assert len(gpu) == 11
    for name in gpu:
        family = name.removesuffix("_total")
        assert family not in exposed, f"{name} is exported on a CPU server"
    assert "glassbox_gpu_oom_total" not in {f + "_total" for f in exposed}  # no fallback engine here


def build_info(telemetry: Telemetry) -> dict[str, str]:
    (family,) = [f for f in telemetry.registry.collect() if f.name == "glassbox_build_info"]
    (only,) = family.samples
    assert only.value == 1
    return dict(only.labels)


def test_build_info_says_what_runs(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, telemetry, _ = served
    info = build_info(telemetry)
    assert info["device"] == "cpu"
    assert info["dtype"] == "fp32"  # the tiny model has no heldout.jsonl: auto stays fp32
    assert info["model"] == client.app.state.runtime.model_name  # type: ignore[attr-defined]
    assert info["torch"] == torch.__version__


def test_route_labels_are_the_apps_templates(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, telemetry, _ = served
    client.post("/predict", json={"inputs": "fine"})
    model = build_info(telemetry)["model"]
    infer = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]}
    assert client.post(f"/v2/models/{model}/infer", json=infer).status_code == 200
    assert client.post("/v2/models/not-this-one/infer", json=infer).status_code == 404
    client.post("/v1/classify", content=b"{", headers={"Content-Type": "application/json"})
    # Series that something counted (the rare-event counters exist at 0 for every declared route from the start).
    routes = {s.labels["route"] for f in telemetry.registry.collect() for s in f.samples
              if "route" in s.labels and s.value > 0}
    assert routes <= {"/v1/classify", "/predict", "/v2/models/{name}/infer", "unmatched"}
    assert "/v2/models/{name}/infer" in routes
    assert sample(telemetry, "glassbox_requests_total", route="/v2/models/{name}/infer", status="404",
                  code="not_found") == 1
    assert sample(telemetry, "glassbox_requests_total", route="/v1/classify", status="400",
                  code="invalid_json") == 1


def test_queue_gauges_and_the_callers_observer(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, telemetry, recording = served
    before = len(recording.requests)
    client.post("/v1/classify", json={"texts": ["one", "two"]})
    assert len(recording.requests) == before + 1  # the observer given to create_app still sees every record
    assert recording.batches  # and the batcher's records too
    assert sample(telemetry, "glassbox_queue_max_requests") == 1024
    assert (sample(telemetry, "glassbox_queue_max_tokens") or 0) > 0
    assert sample(telemetry, "glassbox_queue_requests") == 0
    assert sample(telemetry, "glassbox_queue_tokens") == 0
    assert sample(telemetry, "glassbox_inflight_requests") == 0
    assert (sample(telemetry, "glassbox_batch_size_count") or 0) >= 1


def test_engine_busy_seconds_grow_by_each_runs_duration(
    served: tuple[TestClient, Telemetry, RecordingObserver]
) -> None:
    client, telemetry, recording = served
    before = sample(telemetry, "glassbox_engine_busy_seconds_total", device="cpu") or 0.0
    ran = len(recording.batches)
    assert client.post("/v1/classify", json={"texts": ["busy", "engine"]}).status_code == 200
    # The engine thread reports a batch (to this test's observer, then to telemetry's) after it has handed out the
    # answers, so the response can come first: wait until the counter has caught up with the recorded runs.

    def counted() -> bool:
        added = sum(batch.timing.duration_s for batch in recording.batches[ran:])
        after = sample(telemetry, "glassbox_engine_busy_seconds_total", device="cpu")
        return added > 0 and after == pytest.approx(before + added)

    wait_until(counted, "the busy-seconds counter grew by the recorded runs' durations")
    assert "glassbox_engine_throughput_texts_per_second" not in client.get("/metrics").text


def test_no_created_series_in_a_scrape(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, _, _ = served
    client.post("/v1/classify", json={"text": "counted"})
    client.get("/no/such/path")
    for accept in ("", OPENMETRICS):
        body = client.get("/metrics", headers={"Accept": accept} if accept else {}).text
        assert "glassbox_requests_total{" in body
        assert "_created" not in body, accept or "text"


def test_unmatched_requests_are_counted_under_one_route(
    served: tuple[TestClient, Telemetry, RecordingObserver]
) -> None:
    client, telemetry, recording = served
    before_404 = sample(telemetry, "glassbox_requests_total", route="unmatched", status="404", code="not_found") or 0
    before_405 = sample(telemetry, "glassbox_requests_total", route="unmatched", status="405",
                        code="method_not_allowed") or 0
    seen = len(recording.requests)
    for path in ("/no/such/path", "/another/made-up/path/123", "/v1/classify/extra"):
        assert client.get(path).status_code == 404
    assert client.get("/v1/classify").status_code == 405  # the route exists, for POST only
    assert sample(telemetry, "glassbox_requests_total", route="unmatched", status="404",
                  code="not_found") == before_404 + 3
    assert sample(telemetry, "glassbox_requests_total", route="unmatched", status="405",
                  code="method_not_allowed") == before_405 + 1
    assert [r.route for r in recording.requests[seen:]] == ["unmatched"] * 4  # every observer sees them
    # However many paths clients make up, the label has the app's templates and one more value.
    routes = {s.labels["route"] for f in telemetry.registry.collect() for s in f.samples if "route" in s.labels}
    assert "unmatched" in routes
    assert not any("made-up" in route or route.startswith("/no/") for route in routes)


def test_a_failing_observer_is_counted_and_the_request_still_succeeds(tiny_model_dir: Path) -> None:
    class Broken(RecordingObserver):
        def on_request(self, record: RequestRecord) -> None:
            raise RuntimeError("exporter down")

        def on_batch(self, record: BatchRecord) -> None:
            raise RuntimeError("exporter down")

    telemetry = telemetry_for_tests()
    with ready_client(create_app(app_settings(tiny_model_dir), observer=Broken(), telemetry=telemetry)) as client:
        assert client.post("/v1/classify", json={"text": "still fine"}).status_code == 200
        assert sample(telemetry, "glassbox_telemetry_errors_total", hook="on_request") == 1
        assert (sample(telemetry, "glassbox_telemetry_errors_total", hook="on_batch") or 0) >= 1
        assert sample(telemetry, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == 1


def test_the_lifespan_starts_and_stops_telemetry(tiny_model_dir: Path) -> None:
    stopped: list[str] = []
    telemetry = Telemetry(build_metrics(CollectorRegistry()), on_stop=[lambda: stopped.append("flushed")])
    app = create_app(app_settings(tiny_model_dir), telemetry=telemetry)
    with ready_client(app):
        assert telemetry.lag_sampler.running
    assert not telemetry.lag_sampler.running
    assert stopped == ["flushed"]


def test_exemplars_carry_the_server_spans_trace_id_when_tracing_is_on(tiny_model_dir: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(app_settings(tiny_model_dir, trace_sample_ratio=1.0), span_exporter=exporter)
    with ready_client(create_app(app_settings(tiny_model_dir), telemetry=telemetry)) as client:
        assert client.post("/v1/classify", json={"text": "no traceparent sent"}).status_code == 200
        scraped = client.get("/metrics", headers={"Accept": OPENMETRICS}).text
    # Leaving the client ran the lifespan's shutdown, which flushed the spans.
    (server_span,) = [span for span in exporter.get_finished_spans() if span.name == "POST /v1/classify"]
    trace_id = format(server_span.context.trace_id, "032x")
    (family,) = [f for f in parse_openmetrics(scraped) if f.name == "glassbox_request_duration_seconds"]
    assert [s.exemplar.labels for s in family.samples if s.exemplar] == [{"trace_id": trace_id}]


def test_without_telemetry_there_is_no_metrics_route(tiny_model_dir: Path) -> None:
    with ready_client(create_app(app_settings(tiny_model_dir))) as client:
        assert client.get("/metrics").status_code == 404


def fake_gpu(device: str) -> GpuReaders:
    nvml = NvmlReader(0, nvml=FakeNvml())
    nvml.open()
    return nvml, lambda: AllocatorSample.from_memory_stats(MEMORY_STATS)


def test_bind_on_a_cuda_device_registers_the_gpu_collectors() -> None:
    telemetry = telemetry_for_tests(gpu_readers=fake_gpu)
    telemetry.bind(batcher=FakeBatcher(), engine=object(), model_name="m", device="cuda:0", routes=["/v1/classify"])
    telemetry.warmed_up(WarmupReport("cuda:0", "cuda-graphs", (), 1.0, graph_pool_bytes=123_456))
    assert sample(telemetry, "glassbox_gpu_memory_total_bytes", device="cuda:0") == 80 * 2**30
    assert sample(telemetry, "glassbox_torch_memory_fragmentation_ratio", device="cuda:0") == pytest.approx(0.125)
    assert sample(telemetry, "glassbox_cuda_graph_pool_bytes", device="cuda:0") == 123_456
    with pytest.raises(RuntimeError):
        telemetry.bind(batcher=FakeBatcher(), engine=object(), model_name="m", device="cuda:0", routes=[])


def test_bind_on_the_cpu_never_touches_gpu_readers() -> None:
    def must_not_run(device: str) -> GpuReaders:
        raise AssertionError("GPU readers built for a CPU server")

    telemetry = telemetry_for_tests(gpu_readers=must_not_run)
    telemetry.bind(batcher=FakeBatcher(), engine=object(), model_name="m", device="cpu", routes=[])
    telemetry.warmed_up(WarmupReport("cpu", "eager", (), 1.0, graph_pool_bytes=999))
    assert sample(telemetry, "glassbox_cuda_graph_pool_bytes", device="cpu") is None


def test_the_start_mode_is_one_of_a_fixed_set_of_series() -> None:
    telemetry = telemetry_for_tests()
    telemetry.warmed_up(WarmupReport("cpu", "fallback(graph-fp16, eager-fp32)", (), 1.0, start_mode="cpu_fallback"))
    modes = {mode: sample(telemetry, "glassbox_engine_start_mode", mode=mode) for mode in START_MODES}
    assert modes == {"as_configured": 0.0, "fewer_buckets": 0.0, "eager_cuda": 0.0, "cpu_fallback": 1.0}


def test_gpu_oom_total_counts_each_oom_the_fallback_engine_reports() -> None:
    class Fallback:
        def __init__(self) -> None:
            self.callbacks: list[Any] = []

        def on_oom(self, callback: Any) -> None:
            self.callbacks.append(callback)

    engine = Fallback()
    telemetry = telemetry_for_tests()
    telemetry.bind(batcher=FakeBatcher(), engine=engine, model_name="m", device="cpu", routes=[])
    assert sample(telemetry, "glassbox_gpu_oom_total", device="cpu") == 0
    for _ in range(3):  # e.g. one batch and two probe batches that ran out of memory
        for callback in engine.callbacks:
            callback()
    assert sample(telemetry, "glassbox_gpu_oom_total", device="cpu") == 3
    # The one OOM counter: the allocator's own count is not exported as a second one.
    assert all(spec.name != "glassbox_torch_ooms_total" for spec in telemetry.metrics.catalogue)


def test_chaos_fault_setter() -> None:
    telemetry = telemetry_for_tests()
    telemetry.set_chaos_fault("gpu_oom", True)
    assert sample(telemetry, "glassbox_chaos_fault_active", fault="gpu_oom") == 1
    telemetry.set_chaos_fault("gpu_oom", False)
    telemetry.set_chaos_fault("Weird Fault", True)
    assert sample(telemetry, "glassbox_chaos_fault_active", fault="gpu_oom") == 0
    assert sample(telemetry, "glassbox_chaos_fault_active", fault="other") == 1


def test_guard_aborts_reach_the_metrics_through_a_live_server(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir, max_header_bytes=1024)
    telemetry = telemetry_for_tests()
    app = create_app(settings, telemetry=telemetry)
    with live_server(app, settings, on_abort=app.state.observer.on_aborted) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S) as sock:
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"x" * 4096 + b"\r\n\r\n")
            reply = sock.recv(64)
        assert reply.startswith(b"HTTP/1.1 431"), reply
        body = httpx.get(f"{server.base_url}/metrics", timeout=BOUND_S).text
    (aborted,) = [f for f in parse_text(body) if f.name == "glassbox_http_aborted"]
    assert [(s.labels["reason"], s.value) for s in aborted.samples if s.name.endswith("_total") and s.value] == [
        ("header_too_large", 1.0)]


def test_glassbox_serve_exports_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
            "--port", str(port), "--threads", "1", "--max-length", "32", "--length-buckets", "16,32",
            "--batch-buckets", "1,8", "--log-level", "warning"]
    log = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=Path(__file__).resolve().parents[2])
    try:
        wait_until(lambda: _ready(base) or proc.poll() is not None, "serve answered /readyz 200")
        assert proc.poll() is None, log.read_text()
        assert httpx.post(f"{base}/v1/classify", json={"text": "hi"}, timeout=BOUND_S).status_code == 200
        body = httpx.get(f"{base}/metrics", headers={"Accept": OPENMETRICS}, timeout=BOUND_S).text
    finally:
        proc.terminate()
        proc.wait(BOUND_S)
    families = {f.name: f for f in parse_openmetrics(body)}
    (info,) = families["glassbox_build_info"].samples
    assert info.labels["device"] == "cpu" and info.labels["model"]
    assert families["glassbox_requests"].samples[0].value == 1


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        time.sleep(0.02)  # a poll step while the port is not open yet, bounded by wait_until
        return False


def test_rare_event_series_exist_at_zero_before_the_first_event(
    served: tuple[TestClient, Telemetry, RecordingObserver],
) -> None:
    """rate() counts from a series' first sample: a series born at its first event would hide that event."""
    _, telemetry, _ = served
    from glassbox.service.batching import DROP_REASONS, REJECT_REASONS
    from glassbox.service.http.guard import ABORT_REASONS

    for metric, reasons in (("glassbox_rejected_total", REJECT_REASONS), ("glassbox_dropped_total", DROP_REASONS),
                            ("glassbox_http_aborted_total", ABORT_REASONS)):
        for reason in reasons:
            assert sample(telemetry, metric, reason=reason) is not None, (metric, reason)
    assert sample(telemetry, "glassbox_truncated_texts_total", route="/v1/classify") is not None


def test_model_info_says_which_family_and_head_answer(served: tuple[TestClient, Telemetry, RecordingObserver]) -> None:
    client, telemetry, _ = served
    (family,) = [f for f in telemetry.registry.collect() if f.name == "glassbox_model_info"]
    (only,) = family.samples
    assert only.value == 1
    assert dict(only.labels) == {"model": client.app.state.runtime.model_name,  # type: ignore[attr-defined]
                                 "family": "bert", "model_type": "bert",
                                 "problem_type": "single_label_classification"}


@pytest.mark.parametrize(("header", "budget"), [
    (None, REMOTE_SCRAPE_TIMEOUT_S),  # no announcement: the fixed bound
    ("10", REMOTE_SCRAPE_TIMEOUT_S),  # a long scrape timeout does not stretch it
    ("2", 0.5),  # a short one: a quarter of it, so the rest of the scrape still fits
    ("0.4", 0.1),
    ("0", REMOTE_SCRAPE_TIMEOUT_S), ("-3", REMOTE_SCRAPE_TIMEOUT_S), ("nan", REMOTE_SCRAPE_TIMEOUT_S),
    ("soon", REMOTE_SCRAPE_TIMEOUT_S),  # not a number: ignored
])
def test_a_scrape_waits_for_the_engine_at_most_a_quarter_of_its_announced_timeout(header: str | None,
                                                                                  budget: float) -> None:
    assert remote_scrape_budget_s(header) == pytest.approx(budget)
