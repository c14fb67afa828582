"""telemetry/observer.py: records become the right samples (with exemplars); telemetry/fanout.py: the fan-out isolates
failures."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from glassbox.service.observer import (
    BatchRecord,
    FallbackEvent,
    NullObserver,
    RequestRecord,
    SpanRef,
    StageSpan,
    TurnBuffered,
)
from glassbox.service.types import Bucket, EngineTiming
from glassbox.telemetry.fanout import CompositeObserver
from glassbox.telemetry.metrics import STAGE_BUCKETS_S, Metrics, build_metrics
from glassbox.telemetry.multiproc import ExemplarBook, MultiProcessExposition
from glassbox.telemetry.observer import MetricsObserver, trace_id_of

ROUTES = ("/v1/classify", "/predict", "/v2/models/{name}/infer")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-01"
UNSAMPLED = f"00-{TRACE}-00f067aa0ba902b7-00"
MS = 1_000_000


def request(route: str = "/v1/classify", status: int = 200, code: str | None = None, **extra: Any) -> RequestRecord:
    """A 10 ms request whose five stages take 1, 2, 3, 3 and 1 ms."""
    stages, mark = [], 1_000 * MS
    for name, ms in (("parse", 1), ("tokenize", 2), ("queue", 3), ("infer", 3), ("postprocess", 1)):
        stages.append(StageSpan(name, mark, mark + ms * MS))
        mark += ms * MS
    values: dict[str, Any] = {
        "request_id": "r1", "route": route, "method": "POST", "status": status, "error_code": code,
        "start_ns": 1_000 * MS, "end_ns": 1_010 * MS, "stages": tuple(stages) if status == 200 else (),
        "texts": 3 if status == 200 else 0, "tokens": 70 if status == 200 else 0,
        "max_tokens": 40 if status == 200 else 0, "truncated": 1 if status == 200 else 0,
        "device": "cpu" if status == 200 else "", "engine_mode": "eager" if status == 200 else "",
    }
    values.update(extra)
    return RequestRecord(**values)


def batch(bucket: Bucket | None = None, device: str = "cpu") -> BatchRecord:
    timing = EngineTiming(0, 4 * MS, device, "graph" if bucket else "eager", rows=6, real_tokens=90,
                          padded_tokens=120, bucket=bucket)
    return BatchRecord(batch_id=7, timing=timing, request_ids=("a", "b"), queue_depth_after=0)


@pytest.fixture
def metrics() -> Metrics:
    return build_metrics(CollectorRegistry())


@pytest.fixture
def observer(metrics: Metrics) -> MetricsObserver:
    return MetricsObserver(metrics, ROUTES)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_successful_request_fills_every_request_metric(metrics: Metrics, observer: MetricsObserver) -> None:
    observer.on_request(request())
    assert value(metrics, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == 1
    assert value(metrics, "glassbox_request_duration_seconds_count", route="/v1/classify", status_class="2xx") == 1
    assert value(metrics, "glassbox_request_duration_seconds_sum", route="/v1/classify",
                 status_class="2xx") == pytest.approx(0.010)
    # 10 ms lands in the (7.5 ms, 10 ms] bucket: le="0.0075" has nothing, le="0.01" has it.
    assert value(metrics, "glassbox_request_duration_seconds_bucket", route="/v1/classify", status_class="2xx",
                 le="0.0075") == 0
    assert value(metrics, "glassbox_request_duration_seconds_bucket", route="/v1/classify", status_class="2xx",
                 le="0.01") == 1
    assert value(metrics, "glassbox_request_duration_by_length_seconds_count", length_bucket="64") == 1
    assert value(metrics, "glassbox_requests_by_device_total", device="cpu") == 1
    assert value(metrics, "glassbox_texts_total", route="/v1/classify") == 3
    assert value(metrics, "glassbox_tokens_total", route="/v1/classify") == 70
    assert value(metrics, "glassbox_truncated_texts_total", route="/v1/classify") == 1
    for stage, seconds in (("parse", 0.001), ("tokenize", 0.002), ("queue", 0.003), ("infer", 0.003),
                           ("postprocess", 0.001)):
        device = "cpu" if stage == "infer" else ""  # infer by the device that ran it; the others have none
        assert value(metrics, "glassbox_stage_duration_seconds_count", stage=stage, device=device) == 1
        assert value(metrics, "glassbox_stage_duration_seconds_sum", stage=stage,
                     device=device) == pytest.approx(seconds)


def test_infer_time_is_kept_apart_by_device(metrics: Metrics, observer: MetricsObserver) -> None:
    """A request served by the CPU fallback must not blur the GPU's infer time."""
    observer.on_request(request(device="cuda:0"))
    observer.on_request(request(device="cpu"))
    observer.on_request(request(device="cpu"))
    assert value(metrics, "glassbox_stage_duration_seconds_count", stage="infer", device="cuda:0") == 1
    assert value(metrics, "glassbox_stage_duration_seconds_count", stage="infer", device="cpu") == 2
    assert value(metrics, "glassbox_stage_duration_seconds_count", stage="queue", device="") == 3


def test_a_failed_request_is_counted_by_code_and_not_by_length_or_device(
    metrics: Metrics, observer: MetricsObserver
) -> None:
    observer.on_request(request(status=400, code="invalid_json"))
    observer.on_request(request(status=429, code="overloaded"))
    assert value(metrics, "glassbox_requests_total", route="/v1/classify", status="400", code="invalid_json") == 1
    assert value(metrics, "glassbox_requests_total", route="/v1/classify", status="429", code="overloaded") == 1
    assert value(metrics, "glassbox_request_duration_seconds_count", route="/v1/classify", status_class="4xx") == 2
    assert value(metrics, "glassbox_request_duration_by_length_seconds_count", length_bucket="64") is None
    assert value(metrics, "glassbox_requests_by_device_total", device="cpu") is None


def test_unknown_routes_and_odd_values_map_to_fixed_labels(metrics: Metrics, observer: MetricsObserver) -> None:
    observer.on_request(request(route="/v1/classify/../../etc/passwd", status=404, code="Not Found!"))
    observer.on_request(request(route="/raw/path/12345", status=200, device="gpu 0 (raw)"))
    assert value(metrics, "glassbox_requests_total", route="unmatched", status="404", code="other") == 1
    assert value(metrics, "glassbox_requests_total", route="unmatched", status="200", code="ok") == 1
    assert value(metrics, "glassbox_requests_by_device_total", device="other") == 1
    routes = {s.labels["route"] for f in metrics.registry.collect() for s in f.samples if "route" in s.labels}
    assert routes == {"unmatched"}


def test_allow_routes_replaces_the_known_templates(metrics: Metrics) -> None:
    observer = MetricsObserver(metrics)
    observer.on_request(request(route="/predict"))
    observer.allow_routes(["/predict"])
    observer.on_request(request(route="/predict"))
    assert value(metrics, "glassbox_requests_total", route="unmatched", status="200", code="ok") == 1
    assert value(metrics, "glassbox_requests_total", route="/predict", status="200", code="ok") == 1


def exemplars(metrics: Metrics, family_name: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    """(sample labels, exemplar labels) of every sample of `family_name` that carries an exemplar, as an
    OpenMetrics scraper would parse them."""
    text = generate_latest(metrics.registry).decode()
    found = []
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            found += [(s.labels, s.exemplar.labels) for s in family.samples if s.exemplar is not None]
    return found


def test_sampled_traceparent_becomes_an_exemplar_on_request_and_stage_buckets(
    metrics: Metrics, observer: MetricsObserver
) -> None:
    observer.on_request(request(traceparent=SAMPLED))
    request_exemplars = exemplars(metrics, "glassbox_request_duration_seconds")
    assert [(labels["le"], ex) for labels, ex in request_exemplars] == [("0.01", {"trace_id": TRACE})]
    stage_exemplars = exemplars(metrics, "glassbox_stage_duration_seconds")
    assert {labels["stage"] for labels, _ in stage_exemplars} == {"parse", "tokenize", "queue", "infer",
                                                                   "postprocess"}
    assert all(ex == {"trace_id": TRACE} for _, ex in stage_exemplars)
    assert exemplars(metrics, "glassbox_request_duration_by_length_seconds")


@pytest.mark.parametrize("traceparent", [None, UNSAMPLED, "garbage", f"00-{'0' * 32}-00f067aa0ba902b7-01"])
def test_no_exemplar_without_a_sampled_valid_trace(
    metrics: Metrics, observer: MetricsObserver, traceparent: str | None
) -> None:
    observer.on_request(request(traceparent=traceparent))
    assert exemplars(metrics, "glassbox_request_duration_seconds") == []


def test_a_trace_id_source_overrides_the_header(metrics: Metrics) -> None:
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: "ab" * 16)
    observer.on_request(request(traceparent=SAMPLED))
    assert {ex["trace_id"] for _, ex in exemplars(metrics, "glassbox_request_duration_seconds")} == {"ab" * 16}


def test_each_bucket_takes_a_new_exemplar_once_per_interval(metrics: Metrics) -> None:
    now = [0]
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: record.request_id * 16,
                               exemplar_interval_s=1.0, clock=lambda: now[0])

    def request_exemplars() -> dict[str, str]:
        return {labels["le"]: ex["trace_id"] for labels, ex in exemplars(metrics, "glassbox_request_duration_seconds")}

    observer.on_request(request(request_id="aa"))  # 10 ms: the le=0.01 bucket
    observer.on_request(request(request_id="bb"))  # the same bucket, too soon: keeps aa's
    observer.on_request(request(request_id="cc", end_ns=1_040 * MS))  # 40 ms: another bucket takes its own at once
    assert request_exemplars() == {"0.01": "aa" * 16, "0.05": "cc" * 16}
    now[0] += 999_999_999
    observer.on_request(request(request_id="dd"))
    assert request_exemplars()["0.01"] == "aa" * 16
    now[0] += 1
    observer.on_request(request(request_id="ee"))
    assert request_exemplars()["0.01"] == "ee" * 16
    # Every observation is still counted, exemplar or not.
    assert value(metrics, "glassbox_request_duration_seconds_count", route="/v1/classify", status_class="2xx") == 5


@pytest.mark.parametrize("bound", STAGE_BUCKETS_S)
def test_the_gate_sees_the_bucket_prometheus_counts_in(metrics: Metrics, bound: float) -> None:
    # A value on a bound belongs to that bound's bucket ("le"), one a nanosecond above it to the next: the gate
    # must see them in different buckets, or the second would go without the exemplar its bucket should get.
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: record.request_id * 16, clock=lambda: 0)
    on = round(bound * 1e9)
    assert on / 1e9 == bound
    observer.on_request(request(request_id="aa", stages=(StageSpan("parse", 0, on),)))
    observer.on_request(request(request_id="bb", stages=(StageSpan("parse", 0, on + 1),)))
    stage_exemplars = exemplars(metrics, "glassbox_stage_duration_seconds")
    found = {float(labels["le"]): ex["trace_id"] for labels, ex in stage_exemplars}
    above = STAGE_BUCKETS_S[STAGE_BUCKETS_S.index(bound) + 1] if bound != STAGE_BUCKETS_S[-1] else float("inf")
    assert found == {bound: "aa" * 16, above: "bb" * 16}


def test_an_interval_of_zero_puts_an_exemplar_on_every_observation(metrics: Metrics) -> None:
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: record.request_id * 16,
                               exemplar_interval_s=0.0, clock=lambda: 5)
    observer.on_request(request(request_id="aa"))
    observer.on_request(request(request_id="bb"))
    assert {ex["trace_id"] for _, ex in exemplars(metrics, "glassbox_request_duration_seconds")} == {"bb" * 16}


@pytest.mark.parametrize(("header", "expected"), [
    (SAMPLED, TRACE),
    (f"  {SAMPLED} ", TRACE),
    (UNSAMPLED, None),
    (f"00-{TRACE}-00f067aa0ba902b7-03", TRACE),  # other flag bits set, sampled bit too
    (f"01-{TRACE}-00f067aa0ba902b7-01-future", TRACE),  # a later version may append fields
    (f"00-{TRACE}-00f067aa0ba902b7-01-extra", None),  # version 00 may not
    (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE}-{'0' * 16}-01", None),
    ("", None),
    (None, None),
])
def test_trace_id_of(header: str | None, expected: str | None) -> None:
    assert trace_id_of(header) == expected


def test_batches_fill_the_batch_and_engine_metrics(metrics: Metrics, observer: MetricsObserver) -> None:
    observer.on_batch(batch())
    observer.on_batch(batch(Bucket(8, 16), device="cuda:0"))
    assert value(metrics, "glassbox_batch_size_count") == 2
    assert value(metrics, "glassbox_batch_size_sum") == 12
    assert value(metrics, "glassbox_batch_tokens_sum") == 240
    assert value(metrics, "glassbox_batch_padding_ratio_sum") == pytest.approx(0.5)  # 1 - 90/120, twice
    assert value(metrics, "glassbox_engine_runs_total", device="cpu", mode="eager", bucket="none") == 1
    assert value(metrics, "glassbox_engine_runs_total", device="cuda:0", mode="graph", bucket="8x16") == 1
    assert value(metrics, "glassbox_engine_run_duration_seconds_sum", device="cpu",
                 mode="eager") == pytest.approx(0.004)


def test_engine_busy_seconds_add_each_runs_duration_by_device(metrics: Metrics, observer: MetricsObserver) -> None:
    for _ in range(3):
        observer.on_batch(batch())
    observer.on_batch(batch(Bucket(8, 16), device="cuda:0"))
    assert value(metrics, "glassbox_engine_busy_seconds_total", device="cpu") == pytest.approx(0.012)
    assert value(metrics, "glassbox_engine_busy_seconds_total", device="cuda:0") == pytest.approx(0.004)
    observer.on_batch(batch(device="cuda 0 (raw)"))
    assert value(metrics, "glassbox_engine_busy_seconds_total", device="other") == pytest.approx(0.004)


def test_a_kept_batch_span_is_the_engine_run_exemplar(metrics: Metrics, observer: MetricsObserver) -> None:
    kept, dropped = SpanRef("ab" * 16, "cd" * 8, True), SpanRef("ef" * 16, "01" * 8, False)
    observer.on_batch(dataclasses.replace(batch(), span=dropped))  # held back, maybe never exported: no exemplar
    assert exemplars(metrics, "glassbox_engine_run_duration_seconds") == []
    observer.on_batch(dataclasses.replace(batch(), span=kept))
    [(labels, exemplar)] = exemplars(metrics, "glassbox_engine_run_duration_seconds")
    assert (labels["le"], labels["device"], exemplar) == ("0.005", "cpu", {"trace_id": "ab" * 16})
    assert value(metrics, "glassbox_engine_run_duration_seconds_count", device="cpu", mode="eager") == 2


def test_a_5xx_counts_with_its_trace_as_exemplar(metrics: Metrics) -> None:
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: record.request_id * 16)
    observer.on_request(request(request_id="aa"))
    observer.on_request(request(status=429, code="overloaded", request_id="bb"))
    observer.on_request(request(status=500, code="engine_error", request_id="cc"))
    counted = exemplars(metrics, "glassbox_requests")
    assert counted == [({"route": "/v1/classify", "status": "500", "code": "engine_error"}, {"trace_id": "cc" * 16})]
    assert value(metrics, "glassbox_requests_total", route="/v1/classify", status="500", code="engine_error") == 1


def test_multiprocess_exemplars_reach_the_5xx_counter_sample(metrics: Metrics) -> None:
    book = ExemplarBook()
    observer = MetricsObserver(metrics, ROUTES, trace_ids=lambda record: "dd" * 16, exemplar_book=book)
    observer.on_request(request(status=503, code="engine_restarting"))
    labels = {"route": "/v1/classify", "status": "503", "code": "engine_restarting"}
    with tempfile.TemporaryDirectory() as empty:
        exposition = MultiProcessExposition(empty, book)
        sample = exposition._with_exemplar(Sample("glassbox_requests_total", labels, 1.0))
    assert sample.exemplar is not None and sample.exemplar.labels == {"trace_id": "dd" * 16}


def test_the_engine_process_hands_its_exemplars_to_the_worker_that_answers_a_scrape() -> None:
    # The engine process records the engine run exemplar in its own book; a worker's scrape gets it as comment
    # lines after the engine's scrape-time families, and puts it on the sample it reads from the files.
    engine_book = ExemplarBook()
    observer = MetricsObserver(build_metrics(CollectorRegistry()), ROUTES, exemplar_book=engine_book)
    observer.on_batch(dataclasses.replace(batch(), span=SpanRef("ab" * 16, "cd" * 8, True)))
    remote = (b"# HELP glassbox_queue_requests Queued.\n# TYPE glassbox_queue_requests gauge\n"
              b"glassbox_queue_requests 3.0\n")
    remote += engine_book.comment_lines()
    labels = {"device": "cpu", "mode": "eager", "le": "0.005"}
    with tempfile.TemporaryDirectory() as empty:
        exposition = MultiProcessExposition(empty, ExemplarBook(), remote)
        families = {family.name: family for family in exposition.collect()}
        sample = exposition._with_exemplar(Sample("glassbox_engine_run_duration_seconds_bucket", labels, 1.0))
    assert families["glassbox_queue_requests"].samples[0].value == 3.0  # the comment lines do not disturb the parse
    assert sample.exemplar is not None and sample.exemplar.labels == {"trace_id": "ab" * 16}
    assert sample.exemplar.value == pytest.approx(0.004)
    assert ExemplarBook.from_comment_lines(b"# glassbox_exemplar {not json\n").get(("x", frozenset())) is None


def test_rejections_drops_aborts_and_fallbacks(metrics: Metrics, observer: MetricsObserver) -> None:
    observer.on_rejected("queue_full_tokens")
    observer.on_dropped("deadline", 5)
    observer.on_dropped("deadline", 0)
    observer.on_aborted("body_timeout")
    assert value(metrics, "glassbox_rejected_total", reason="queue_full_tokens") == 1
    assert value(metrics, "glassbox_dropped_total", reason="deadline") == 5
    assert value(metrics, "glassbox_http_aborted_total", reason="body_timeout") == 1
    assert value(metrics, "glassbox_fallback_active") == 0
    observer.on_fallback(FallbackEvent(True, "oom", "cpu"))
    assert value(metrics, "glassbox_fallback_active") == 1
    observer.on_fallback(FallbackEvent(True, "probe_failed", "cpu"))
    observer.on_fallback(FallbackEvent(False, "recovered", "cuda:0"))
    assert value(metrics, "glassbox_fallback_active") == 0
    for reason in ("oom", "probe_failed", "recovered"):
        assert value(metrics, "glassbox_fallback_events_total", reason=reason) == 1


class Exploding:
    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, hook: str) -> Any:
        if not hook.startswith("on_"):
            raise AttributeError(hook)

        def fail(*args: Any) -> None:
            self.calls += 1
            raise RuntimeError(f"{hook} broke")

        return fail


class Counting(NullObserver):
    def __init__(self) -> None:
        self.requests = 0

    def on_request(self, record: RequestRecord) -> None:
        self.requests += 1


def test_composite_isolates_a_failing_observer_and_reports_it(caplog: pytest.LogCaptureFixture) -> None:
    broken, counting, errors = Exploding(), Counting(), []
    composite = CompositeObserver([broken, counting], on_error=errors.append)
    with caplog.at_level(logging.ERROR, logger="glassbox.telemetry"):
        for _ in range(12):
            composite.on_request(request())
        composite.on_fallback(FallbackEvent(True, "oom", "cpu"))
    assert counting.requests == 12
    assert broken.calls == 13
    assert errors == ["on_request"] * 12 + ["on_fallback"]
    assert composite.failures() == {(0, "on_request"): 12, (0, "on_fallback"): 1}
    logged = [r.getMessage() for r in caplog.records]
    # The 1st and 10th failure of a hook are logged, not all twelve.
    assert [m for m in logged if "on_request" in m] == [
        "observer Exploding.on_request failed (1 failures so far)",
        "observer Exploding.on_request failed (10 failures so far)",
    ]


class Buffering(NullObserver):
    """Says, for each record, whether a block was open when it came; its block may fail as it opens or ends."""

    def __init__(self, fail_on: str = "") -> None:
        self.open = False
        self.seen: list[bool] = []
        self.blocks = 0
        self.fail_on = fail_on

    def on_request(self, record: RequestRecord) -> None:
        self.seen.append(self.open)

    @contextlib.contextmanager
    def buffered(self) -> Iterator[None]:
        if self.fail_on == "enter":
            raise OSError("cannot open")
        self.open, self.blocks = True, self.blocks + 1
        try:
            yield
        finally:
            self.open = False
            if self.fail_on == "exit":
                raise OSError("cannot write")


def test_composite_opens_every_buffering_observers_block_and_survives_a_failing_one() -> None:
    first, failing_exit, failing_enter, plain = Buffering(), Buffering("exit"), Buffering("enter"), Counting()
    errors: list[str] = []
    composite = CompositeObserver([first, failing_exit, failing_enter, plain], on_error=errors.append)
    assert isinstance(composite, TurnBuffered)
    with composite.buffered():
        composite.on_request(request())
        composite.on_request(request())
    composite.on_request(request())
    assert first.seen == failing_exit.seen == [True, True, False]  # held inside the block, not after it
    assert failing_enter.seen == [False, False, False]  # its block never opened; its records still came
    assert plain.requests == 3
    assert (first.blocks, first.open, failing_exit.open) == (1, False, False)  # every block that opened ended
    assert composite.failures() == {(1, "on_request"): 1, (2, "on_request"): 1}
    assert errors == ["on_request", "on_request"]


class _Opener(NullObserver):
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def open_request(self, traceparent: str | None, tracestate: str | None = None) -> SpanRef:
        if self.fail:
            raise RuntimeError("no ids")
        return SpanRef("ab" * 16, "cd" * 8, tracestate == "k=v")

    def open_batch(self, spans: tuple[SpanRef | None, ...]) -> SpanRef:
        if self.fail:
            raise RuntimeError("no ids")
        return SpanRef("ef" * 16, "01" * 8, len(spans) == 2)

    def trace_response(self, record: RequestRecord) -> str | None:
        if self.fail:
            raise RuntimeError("no ids")
        return "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


def test_composite_names_spans_through_its_first_opener_and_survives_a_failing_one() -> None:
    composite = CompositeObserver([_Opener(fail=False)])
    assert composite.open_request(None, "k=v") == SpanRef("ab" * 16, "cd" * 8, True)
    assert composite.open_batch((None, None)) == SpanRef("ef" * 16, "01" * 8, True)
    assert composite.trace_response(request()) == "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    errors: list[str] = []
    broken = CompositeObserver([_Opener(fail=True)], on_error=errors.append)
    assert (broken.open_request(None), broken.open_batch(()), broken.trace_response(request())) == (None, None, None)
    assert errors == ["open_request", "open_batch", "trace_response"]
    assert CompositeObserver([NullObserver()]).open_batch(()) is None  # no opener at all


def test_composite_skips_observers_without_a_hook() -> None:
    class OnlyRequests:
        def __init__(self) -> None:
            self.seen = 0

        def on_request(self, record: RequestRecord) -> None:
            self.seen += 1

    partial = OnlyRequests()
    composite = CompositeObserver([partial])  # type: ignore[list-item]
    composite.on_batch(batch())
    composite.on_request(request())
    assert partial.seen == 1


def test_observer_is_thread_safe_under_concurrent_calls(metrics: Metrics) -> None:
    observer = CompositeObserver([MetricsObserver(metrics, ROUTES)])
    threads, per_thread = 8, 250
    start = threading.Barrier(threads)

    def hammer() -> None:
        start.wait()
        for i in range(per_thread):
            observer.on_request(request(traceparent=SAMPLED if i % 2 else None))
            observer.on_batch(batch(Bucket(8, 16) if i % 2 else None))
            observer.on_dropped("deadline", 2)

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    total = threads * per_thread
    assert value(metrics, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == total
    assert value(metrics, "glassbox_stage_duration_seconds_count", stage="infer", device="cpu") == total
    assert value(metrics, "glassbox_texts_total", route="/v1/classify") == 3 * total
    assert value(metrics, "glassbox_batch_size_count") == total
    assert value(metrics, "glassbox_engine_runs_total", device="cpu", mode="eager", bucket="none") == total / 2
    assert value(metrics, "glassbox_dropped_total", reason="deadline") == 2 * total
    assert value(metrics, "glassbox_request_duration_seconds_sum", route="/v1/classify",
                 status_class="2xx") == pytest.approx(0.010 * total)


def test_observing_without_an_exemplar_counts_as_prometheus_clients_own_observe() -> None:
    # MetricsObserver adds to a histogram child's values itself (a binary search for the bucket); the samples must be
    # the ones Histogram.observe would have made, at the bounds, between them, below the first and past the last.
    from prometheus_client import Histogram

    from glassbox.telemetry.observer import _observe, histogram_values

    values = [0.0, 1e-6, *STAGE_BUCKETS_S, *(b * 1.0001 for b in STAGE_BUCKETS_S),
              *(b * 0.9999 for b in STAGE_BUCKETS_S), 123.0, 1e9]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    stage = MetricsObserver(build_metrics(ours), ["/v1/classify"])._stage("tokenize")
    for value in values:
        _observe(stage, value, None, 0, None, None)  # the path on_request takes for a record without a sampled trace
    reference = Histogram("glassbox_stage_duration_seconds", "x", ["stage", "device"], buckets=STAGE_BUCKETS_S,
                          registry=theirs).labels("tokenize", "")
    for value in values:
        reference.observe(value)
    total, buckets, bounds = histogram_values(reference)
    assert bounds == STAGE_BUCKETS_S and len(buckets) == len(bounds) + 1 and total.get() == sum(values)

    def samples(registry: CollectorRegistry) -> list[tuple[str, str, float]]:
        return [(s.name, s.labels.get("le", ""), s.value) for family in registry.collect()
                if family.name == "glassbox_stage_duration_seconds" for s in family.samples
                if s.labels.get("stage") == "tokenize" and not s.name.endswith("_created")]

    assert len(samples(ours)) == len(STAGE_BUCKETS_S) + 3 and samples(ours) == samples(theirs)


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return sorted(((s.name, s.labels, s.value) for family in registry.collect() for s in family.samples
                   if s.name.startswith("glassbox_") and not s.name.endswith("_created")), key=repr)


def test_a_turns_increments_are_held_until_its_block_ends_and_add_up_to_the_same_samples() -> None:
    # The server observes the requests answered in one loop turn inside `buffered`: their increments are summed per
    # value and written as the block ends. The samples must be those of the same records observed one by one.
    records = [request(), request(status=429, code="overloaded"), request(device="cuda:0"),
               request(status=500, code="internal"), request(end_ns=1_900 * MS)]
    direct, turned = build_metrics(CollectorRegistry()), build_metrics(CollectorRegistry())
    one_by_one, in_turn = MetricsObserver(direct, ROUTES), MetricsObserver(turned, ROUTES)
    for record in records:
        one_by_one.on_request(record)
    one_by_one.on_batch(batch())
    assert isinstance(in_turn, TurnBuffered)
    with in_turn.buffered():
        for record in records:
            in_turn.on_request(record)
        in_turn.on_batch(batch())
        assert value(turned, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == 0
        assert value(turned, "glassbox_batch_size_count") == 0  # held, not yet written
        # Another thread (the engine's, a bulk job's) is not held by this thread's block.
        other = threading.Thread(target=in_turn.on_request, args=(request(route="/predict"),))
        other.start()
        other.join(10)
        assert value(turned, "glassbox_requests_total", route="/predict", status="200", code="ok") == 1
        with in_turn.buffered():  # a block inside another changes nothing: the outer one writes
            in_turn.on_request(request())
        assert value(turned, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == 0
    one_by_one.on_request(request(route="/predict"))
    one_by_one.on_request(request())
    assert value(turned, "glassbox_requests_total", route="/v1/classify", status="200", code="ok") == 4
    assert _samples(direct.registry) == _samples(turned.registry)


def test_counter_value_is_what_counter_inc_adds_to() -> None:
    from prometheus_client import Counter

    from glassbox.telemetry.observer import counter_value

    registry = CollectorRegistry()
    child = Counter("things", "x", ["kind"], registry=registry).labels("a")
    counter_value(child).inc(2.5)
    child.inc(1)
    assert registry.get_sample_value("things_total", {"kind": "a"}) == 3.5
