"""The metric catalogue: every name, label set and bucket boundary glassbox exports, made by one function.

Nothing is created at import time. `build_metrics(registry)` makes the metrics on the registry it is given (a
fresh `CollectorRegistry` per app and per test, never the global one) and returns them together with their
catalogue, which `docs/metrics.md` is checked against. Metrics whose value is read when Prometheus scrapes (queue
depth, GPU, allocator) are declared here as `ScrapeFamily`s; `telemetry/collectors.py` only fills in values.

Label values are bounded here too: the helpers at the bottom turn whatever a record carries into one of a fixed
set of values, so a bug elsewhere can never explode the number of series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from glassbox.service.model.reference import LENGTH_BOUNDS, REGRESSION_BOUNDS, SCORE_BOUNDS
from glassbox.service.observer import STAGES, UNMATCHED_ROUTE

Kind = Literal["counter", "gauge", "histogram"]
GaugeMode = Literal["livemax", "livesum"]

# SLO thresholds (seconds). Each one is a bucket boundary of the histogram it is judged on, so "share of requests
# under 250 ms" is an exact ratio of two bucket counters, not an interpolation.
REQUEST_SLO_S = (0.1, 0.25, 1.0)
STAGE_SLO_S = (0.001, 0.05, 0.1)  # tokenize under 1 ms, queue wait under 50 ms, infer under 100 ms
EVENT_LOOP_LAG_SLO_S = (0.01,)

REQUEST_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                     0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
# 1, 1.5, 2, 2.5, 3.5, 5, 7 per decade: neighbours 1.25-1.5x apart from 10 us to 2.5 s, with every STAGE_SLO_S on
# a boundary. Twice as coarse (1, 2.5, 5 per decade) put an infer stage of 12 ms and one of 20 ms in one bucket,
# and both read as a P99 of ~24.7 ms; here they land in different buckets and the P99 moves with them.
STAGE_BUCKETS_S = tuple(round(mantissa * 10.0 ** exponent, 12) for exponent in range(-5, 1)
                        for mantissa in (1.0, 1.5, 2.0, 2.5, 3.5, 5.0, 7.0) if mantissa * 10.0 ** exponent <= 2.5)
# The stage buckets from 50 us: a 32-row CUDA graph replays in ~0.5 ms and a CPU batch takes 2-100 ms; the old
# 0.5 -> 1 -> 2.5 ms steps could not tell a 1.1 ms run from a 2.4 ms one.
ENGINE_BUCKETS_S = tuple(bound for bound in STAGE_BUCKETS_S if bound >= 0.00005)
EVENT_LOOP_LAG_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
BATCH_TOKEN_BUCKETS = (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
PADDING_BUCKETS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9)

# The input-length label: the smallest of these at or above a request's longest text, in tokens.
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
# What the model answered (telemetry/predictions.py): the bins of a model's reference (service/model/reference.py).
PREDICTION_SCORE_BUCKETS = SCORE_BOUNDS
REGRESSION_BUCKETS = REGRESSION_BOUNDS
INPUT_TOKEN_BUCKETS = LENGTH_BOUNDS
PREDICTION_LABELS = 64  # a model with more labels has its others counted under OTHER
LENGTH_ABOVE = "+Inf"
UNMATCHED = UNMATCHED_ROUTE  # a route the app does not declare, and requests no route took (404, 405)
OTHER = "other"  # any label value outside its enum


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One row of the catalogue, as docs/metrics.md lists it."""

    name: str  # the exposed name; counters end in _total
    kind: Kind
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()
    scrape: bool = False  # its value is read when Prometheus scrapes, not pushed by the observer
    gpu_only: bool = False  # exported only where glassbox serves from a GPU


@dataclass(frozen=True, slots=True)
class ScrapeFamily:
    """A metric a collector fills at scrape time: `new()` is an empty family to add samples to."""

    spec: MetricSpec

    def new(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.spec.kind == "counter":
            return CounterMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)
        return GaugeMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)

    def new_histogram(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.spec.name, self.spec.help, labels=self.spec.labels)

    def describe(self) -> Metric:
        return self.new_histogram() if self.spec.kind == "histogram" else self.new()


@dataclass(frozen=True, slots=True)
class QueueFamilies:
    requests: ScrapeFamily
    tokens: ScrapeFamily
    max_requests: ScrapeFamily
    max_tokens: ScrapeFamily
    inflight_requests: ScrapeFamily
    engine_inflight_texts: ScrapeFamily
    predicted_wait: ScrapeFamily
    max_wait: ScrapeFamily
    shedding: ScrapeFamily


@dataclass(frozen=True, slots=True)
class PredictionFamilies:
    predictions: ScrapeFamily  # counter {label}
    score: ScrapeFamily  # histogram of each answer's top score
    regression: ScrapeFamily  # histogram of a regression head's outputs
    input_tokens: ScrapeFamily  # histogram of each text's tokens
    drift: ScrapeFamily  # gauge {distribution}: PSI of the recent answers against the reference
    reference_texts: ScrapeFamily  # gauge {source}: the texts the reference was counted from
    reference_share: ScrapeFamily  # gauge {label}: each label's share of the reference's answers


@dataclass(frozen=True, slots=True)
class GpuFamilies:
    utilization: ScrapeFamily
    memory_used: ScrapeFamily
    memory_total: ScrapeFamily
    power: ScrapeFamily
    temperature: ScrapeFamily
    torch_allocated: ScrapeFamily
    torch_reserved: ScrapeFamily
    torch_inactive_split: ScrapeFamily
    torch_fragmentation: ScrapeFamily
    torch_alloc_retries: ScrapeFamily


@dataclass(frozen=True, slots=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    request_duration: Histogram
    request_duration_by_length: Histogram
    requests_by_device: Counter
    texts: Counter
    tokens: Counter
    truncated_texts: Counter
    stage_duration: Histogram
    batch_size: Histogram
    batch_tokens: Histogram
    batch_padding_ratio: Histogram
    engine_runs: Counter
    engine_run_duration: Histogram
    engine_busy: Counter
    rejected: Counter
    dropped: Counter
    http_aborted: Counter
    event_loop_lag: Histogram
    build_info: Gauge
    model_info: Gauge
    fallback_active: Gauge
    fallback_events: Counter
    gpu_ooms: Counter
    cuda_graph_pool: Gauge
    engine_start_mode: Gauge
    chaos_fault_active: Gauge
    telemetry_errors: Counter
    span_export_failures: Counter
    traces: Counter
    process_restarts: Counter
    queue: QueueFamilies
    gpu: GpuFamilies
    predictions: PredictionFamilies
    catalogue: tuple[MetricSpec, ...]


class _Maker:
    """Creates metrics on one registry and writes down each one's spec as it goes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.specs: list[MetricSpec] = []

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        self.specs.append(MetricSpec(name, "counter", labels, help))
        return Counter(name, help, labels, registry=self.registry)

    def gauge(self, name: str, help: str, labels: tuple[str, ...] = (), *, gpu_only: bool = False,
              across: GaugeMode = "livemax") -> Gauge:
        """`across`: how the values of several processes combine in multiprocess mode (live ones only)."""
        self.specs.append(MetricSpec(name, "gauge", labels, help, gpu_only=gpu_only))
        return Gauge(name, help, labels, registry=self.registry, multiprocess_mode=across)

    def histogram(self, name: str, help: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
        self.specs.append(MetricSpec(name, "histogram", labels, help, buckets))
        return Histogram(name, help, labels, registry=self.registry, buckets=buckets)

    def scraped(self, name: str, kind: Kind, help: str, labels: tuple[str, ...] = (), *,
                gpu_only: bool = False, buckets: tuple[float, ...] = ()) -> ScrapeFamily:
        spec = MetricSpec(name, kind, labels, help, buckets, scrape=True, gpu_only=gpu_only)
        self.specs.append(spec)
        return ScrapeFamily(spec)


def new_registry() -> CollectorRegistry:
    """A registry whose `restricted_registry` (`/metrics?name[]=...`) also reads the collectors that do not describe
    their metrics up front (prometheus_client's process, GC and platform collectors, and the multi-process
    exposition and per-process collectors); prometheus_client leaves those out of a filtered scrape by default."""
    return CollectorRegistry(support_collectors_without_names=True)


def build_metrics(registry: CollectorRegistry, *, process_collectors: bool = True) -> Metrics:
    """Every glassbox metric, on `registry`, plus (unless told otherwise: they describe one process, and a
    multiprocess server has several) the client library's process, GC and platform collectors.

    Counters and histograms get no `*_created` series: the client library's switch for it is process-wide, and
    glassbox turns it off before it makes any metric. A series per counter and histogram child that only says when
    the process started doubles what a scrape carries and is read by no panel or rule."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    if process_collectors:
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        PlatformCollector(registry=registry)
    m = _Maker(registry)
    dev = ("device",)
    queue = QueueFamilies(
        requests=m.scraped("glassbox_queue_requests", "gauge", "Requests waiting for the engine."),
        tokens=m.scraped("glassbox_queue_tokens", "gauge", "Real (unpadded) tokens waiting for the engine."),
        max_requests=m.scraped("glassbox_queue_max_requests", "gauge",
                               "Hard cap on queued requests before 429 (--max-queue-requests)."),
        max_tokens=m.scraped("glassbox_queue_max_tokens", "gauge",
                             "Hard cap on queued tokens before 429 (--max-queue-tokens)."),
        inflight_requests=m.scraped("glassbox_inflight_requests", "gauge",
                                    "Requests admitted by the batcher and not yet answered."),
        engine_inflight_texts=m.scraped("glassbox_engine_inflight_texts", "gauge", "Texts inside the engine now."),
        predicted_wait=m.scraped("glassbox_queue_predicted_wait_seconds", "gauge",
                                 "How long a request admitted now would wait for the engine, at its measured rate."),
        max_wait=m.scraped("glassbox_queue_max_wait_seconds", "gauge",
                           "The predicted wait beyond which requests are refused with 429 (--max-queue-wait-ms)."),
        shedding=m.scraped("glassbox_queue_shedding", "gauge",
                           "1 while the server sheds heavy overload (a third of --max-queue-wait-ms bounds the wait, "
                           "two thirds cap the batch), else 0."),
    )
    predictions = PredictionFamilies(
        predictions=m.scraped("glassbox_predictions_total", "counter",
                              "Answers by predicted label: a single-label head's best label, each label a "
                              "multi-label head scores at 0.5 or more.", ("label",)),
        score=m.scraped("glassbox_prediction_score", "histogram",
                        "The top score of each answer (softmax or sigmoid), fine from 0.5 up.",
                        buckets=PREDICTION_SCORE_BUCKETS),
        regression=m.scraped("glassbox_regression_output", "histogram",
                             "The number a regression head answered, per text.", buckets=REGRESSION_BUCKETS),
        input_tokens=m.scraped("glassbox_input_tokens", "histogram",
                               "Tokens of each text the model read (special tokens included, after truncation).",
                               buckets=INPUT_TOKEN_BUCKETS),
        drift=m.scraped("glassbox_prediction_drift", "gauge",
                        "Population stability index of the last minute's answers against the model's reference, "
                        "per distribution (labels, score, output, length); absent below 300 texts.",
                        ("distribution",)),
        reference_texts=m.scraped("glassbox_prediction_reference_texts", "gauge",
                                  "Texts the drift reference was counted from: source file (the model's "
                                  "reference.json) or traffic (the first texts served).", ("source",)),
        reference_share=m.scraped("glassbox_prediction_reference_share", "gauge",
                                  "Each label's share of the answers in the drift reference (0..1), to plot beside "
                                  "the served shares; absent until there is a reference.", ("label",)),
    )
    gpu = GpuFamilies(
        utilization=m.scraped("glassbox_gpu_utilization_ratio", "gauge", "NVML GPU utilisation, 0..1.", dev,
                              gpu_only=True),
        memory_used=m.scraped("glassbox_gpu_memory_used_bytes", "gauge", "NVML device memory in use.", dev,
                              gpu_only=True),
        memory_total=m.scraped("glassbox_gpu_memory_total_bytes", "gauge", "NVML device memory.", dev, gpu_only=True),
        power=m.scraped("glassbox_gpu_power_watts", "gauge", "NVML board power draw.", dev, gpu_only=True),
        temperature=m.scraped("glassbox_gpu_temperature_celsius", "gauge", "NVML GPU core temperature.", dev,
                              gpu_only=True),
        torch_allocated=m.scraped("glassbox_torch_memory_allocated_bytes", "gauge",
                                  "Bytes held by live tensors (torch caching allocator).", dev, gpu_only=True),
        torch_reserved=m.scraped("glassbox_torch_memory_reserved_bytes", "gauge",
                                 "Bytes the caching allocator holds from the driver.", dev, gpu_only=True),
        torch_inactive_split=m.scraped("glassbox_torch_memory_inactive_split_bytes", "gauge",
                                       "Free bytes stranded inside partly used allocator segments.", dev,
                                       gpu_only=True),
        torch_fragmentation=m.scraped("glassbox_torch_memory_fragmentation_ratio", "gauge",
                                      "inactive_split_bytes / reserved_bytes (0 when nothing is reserved).", dev,
                                      gpu_only=True),
        torch_alloc_retries=m.scraped("glassbox_torch_alloc_retries_total", "counter",
                                      "Allocations that had to free the cache and retry.", dev, gpu_only=True),
    )
    return Metrics(
        registry=registry,
        requests=m.counter("glassbox_requests_total", "Classify requests answered.", ("route", "status", "code")),
        request_duration=m.histogram("glassbox_request_duration_seconds", "Time from arrival to response.",
                                     REQUEST_BUCKETS_S, ("route", "status_class")),
        request_duration_by_length=m.histogram(
            "glassbox_request_duration_by_length_seconds",
            "Successful request time by the longest text's length bucket, in tokens.",
            REQUEST_BUCKETS_S, ("length_bucket",)),
        requests_by_device=m.counter("glassbox_requests_by_device_total",
                                     "Successful requests by the device(s) that ran them.", dev),
        texts=m.counter("glassbox_texts_total", "Texts classified.", ("route",)),
        tokens=m.counter("glassbox_tokens_total", "Real (unpadded) tokens classified.", ("route",)),
        truncated_texts=m.counter("glassbox_truncated_texts_total", "Texts cut to the length limit.", ("route",)),
        stage_duration=m.histogram("glassbox_stage_duration_seconds",
                                   "Time spent in each stage of a request; device only on infer (empty elsewhere).",
                                   STAGE_BUCKETS_S, ("stage", "device")),
        batch_size=m.histogram("glassbox_batch_size", "Texts per engine run.", BATCH_SIZE_BUCKETS),
        batch_tokens=m.histogram("glassbox_batch_tokens", "Tokens computed per engine run, padding included.",
                                 BATCH_TOKEN_BUCKETS),
        batch_padding_ratio=m.histogram("glassbox_batch_padding_ratio", "Share of computed tokens that are padding.",
                                        PADDING_BUCKETS),
        engine_runs=m.counter("glassbox_engine_runs_total", "Engine runs by device, mode and graph bucket.",
                              ("device", "mode", "bucket")),
        engine_run_duration=m.histogram("glassbox_engine_run_duration_seconds", "Duration of one engine run.",
                                        ENGINE_BUCKETS_S, ("device", "mode")),
        engine_busy=m.counter("glassbox_engine_busy_seconds_total",
                              "Time the engine spent running batches, by device: its rate is the busy share.", dev),
        rejected=m.counter("glassbox_rejected_total", "Requests refused at admission (429/503).", ("reason",)),
        dropped=m.counter("glassbox_dropped_total", "Queued texts dropped before they ran.", ("reason",)),
        http_aborted=m.counter("glassbox_http_aborted_total", "Connections closed by the protocol guard.",
                               ("reason",)),
        event_loop_lag=m.histogram("glassbox_event_loop_lag_seconds", "How late a timer fired on the event loop.",
                                   EVENT_LOOP_LAG_BUCKETS_S),
        build_info=m.gauge("glassbox_build_info", "Always 1; the labels say what is running.",
                           ("version", "model", "device", "dtype", "torch")),
        model_info=m.gauge("glassbox_model_info", "Always 1; the labels say what kind of model is served.",
                           ("model", "family", "model_type", "problem_type")),
        fallback_active=m.gauge("glassbox_fallback_active", "1 while batches run on the CPU fallback."),
        fallback_events=m.counter("glassbox_fallback_events_total", "Switches between GPU and CPU fallback.",
                                  ("reason",)),
        gpu_ooms=m.counter("glassbox_gpu_oom_total",
                           "CUDA out-of-memory errors the fallback engine caught on its GPU, probes included.", dev),
        cuda_graph_pool=m.gauge("glassbox_cuda_graph_pool_bytes", "Memory reserved by CUDA graph capture.", dev,
                                gpu_only=True, across="livesum"),
        engine_start_mode=m.gauge("glassbox_engine_start_mode",
                                  "1 for how the engine started: as configured, or degraded at start-up.", ("mode",)),
        chaos_fault_active=m.gauge("glassbox_chaos_fault_active", "1 while an injected fault is on.", ("fault",)),
        telemetry_errors=m.counter("glassbox_telemetry_errors_total", "Observer calls that raised.", ("hook",)),
        span_export_failures=m.counter("glassbox_span_export_failures_total",
                                       "Span exports (a batch of spans each) the OTLP collector never took."),
        traces=m.counter("glassbox_traces_total", "Requests' traces kept for export or dropped, by why (tracing on).",
                         ("decision", "reason")),
        process_restarts=m.counter("glassbox_process_restarts_total",
                                   "Engine or HTTP worker processes started again after one died (multi-process "
                                   "layout).", ("process",)),
        queue=queue,
        gpu=gpu,
        predictions=predictions,
        catalogue=tuple(m.specs),
    )


# --- bounded label values ------------------------------------------------------------------------------------------
_ENUM = re.compile(r"[a-z][a-z0-9_]{0,47}")
_DEVICE = re.compile(r"[a-z0-9:,]{1,32}")


def enum_label(value: str | None, empty: str = OTHER) -> str:
    """An error code or reason as its own label value when it looks like one (snake_case), `empty` when there is
    none, else `other`."""
    if not value:
        return empty
    return value if _ENUM.fullmatch(value) else OTHER


def device_label(value: str) -> str:
    return value if _DEVICE.fullmatch(value) else OTHER


def status_label(status: int) -> str:
    return str(status) if 100 <= status <= 599 else OTHER


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else OTHER


def length_bucket(tokens: int) -> str:
    for bound in LENGTH_BUCKETS:
        if tokens <= bound:
            return str(bound)
    return LENGTH_ABOVE


def stage_label(name: str) -> str:
    return name if name in STAGES else OTHER
