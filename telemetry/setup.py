"""Telemetry for one app, assembled from Settings: the observer the app hands its records to, the /metrics route,
and what must start and stop with the app (the event-loop lag sampler, NVML, the span exporter).

The app factory (service/app.py) is the only caller that wires it in:

    telemetry = build_telemetry(settings)
    app = create_app(settings, telemetry=telemetry)   # composes the observer, mounts /metrics, runs start/stop

`create_app` calls `bind` once the runtime exists (batcher, engine, device, route templates) and `warmed_up` with
the engine's warm-up report; everything read at scrape time is registered then.

With several processes (`multiprocess_dir`, see telemetry/multiproc.py) the same object plays one of two roles: in
the engine process `bind` registers the scrape-time collectors and `scrape_text` renders them for the workers; in an
HTTP worker `bind_remote` says how to ask the engine for them, and /metrics shows every process's files.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import RestrictedRegistry
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from glassbox.service.model.reference import Reference
from glassbox.service.observer import Observer, RequestRecord
from glassbox.service.settings import Settings
from glassbox.service.types import START_MODES, ProblemType, WarmupReport, engine_dtype
from glassbox.telemetry.collectors import (
    AllocatorSample,
    BatcherView,
    EventLoopLagSampler,
    GpuCollector,
    NvmlReader,
    QueueCollector,
    build_info_labels,
    cuda_index,
    torch_allocator_reader,
)
from glassbox.telemetry.fanout import HOOKS, CompositeObserver
from glassbox.telemetry.metrics import Metrics, build_metrics, device_label, enum_label, new_registry
from glassbox.telemetry.multiproc import ExemplarBook, render_text, scrape_registry, use_cached_pid
from glassbox.telemetry.observer import MetricsObserver, trace_id_of
from glassbox.telemetry.predictions import REFERENCE_FROM_TRAFFIC, PredictionStats
from glassbox.telemetry.processes import Roster

if TYPE_CHECKING:  # opentelemetry is imported only when tracing is on
    from glassbox.telemetry.tracing import TracingObserver

log = logging.getLogger("glassbox.telemetry")

METRICS_PATH = "/metrics"
GpuReaders = tuple[NvmlReader | None, Callable[[], AllocatorSample] | None]
RemoteScrape = Callable[[], Awaitable[bytes]]
# The longest a scrape waits for the engine process's families. A stopped or hung engine must cost a scrape its
# engine-side values, never the scrape itself: Prometheus gives up on the whole target at its scrape_timeout (4 s in
# deploy/prometheus, 10 s by default), and then every series of the replica goes stale at once.
REMOTE_SCRAPE_TIMEOUT_S = 1.0


def remote_scrape_budget_s(scrape_timeout_header: str | None) -> float:
    """How long one scrape may wait for the engine's families: REMOTE_SCRAPE_TIMEOUT_S, or a quarter of the scrape
    timeout Prometheus announces (X-Prometheus-Scrape-Timeout-Seconds) when that is shorter."""
    try:
        announced = float(scrape_timeout_header) if scrape_timeout_header else math.inf
    except ValueError:
        announced = math.inf
    if not announced > 0:  # 0, negative or NaN: not a usable announcement
        announced = math.inf
    return min(REMOTE_SCRAPE_TIMEOUT_S, announced / 4)


@runtime_checkable
class FallbackView(Protocol):
    """What telemetry needs of glassbox.service.engines.fallback.FallbackEngine (structurally): a call for every CUDA
    out-of-memory error it catches on its primary, probe batches included. glassbox_gpu_oom_total counts those: the
    one OOM counter (torch's allocator count, `num_ooms`, also counts allocations that were meant to probe for room:
    chaos `fill`, graph capture at start-up, which cost no batch anything). A counter, not a tally read at scrape
    time: in the multi-process layout its file outlives an engine process that dies, so it never goes backwards."""

    def on_oom(self, callback: Callable[[], None]) -> None: ...


def cuda_readers(device: str) -> GpuReaders:
    """The real readers for `device`. NVML that cannot start (no driver library, no permission) is logged and left
    out; the allocator readings still come from torch."""
    index = cuda_index(device)
    nvml = NvmlReader(index, _cuda_uuid(index))
    try:
        nvml.open()
    except Exception as exc:
        log.warning("NVML unavailable, GPU utilisation/power/temperature will not be exported: %s", exc)
        return None, torch_allocator_reader(device)
    return nvml, torch_allocator_reader(device)


def _cuda_uuid(index: int) -> str:
    """torch's UUID for the device, as torch writes it: a whole GPU's or a MIG instance's (NvmlReader matches it)."""
    try:
        import torch

        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return ""


class Telemetry:
    """One app's telemetry: its registry and metrics, the observers records go to, /metrics, and start/stop."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        before: Sequence[Observer] = (),
        after: Sequence[Observer] = (),
        trace_ids: Callable[[RequestRecord], str | None] | None = None,
        lag_interval_s: float = 0.1,
        gpu_readers: Callable[[str], GpuReaders] = cuda_readers,
        on_stop: Sequence[Callable[[], None]] = (),
        multiprocess_dir: str | None = None,
        tracing: TracingObserver | None = None,
        drift_window_s: float = 60.0,
    ) -> None:
        """Observers in `before` run ahead of the metrics observer (tracing, so that exemplars can carry its span's
        trace id), those in `after` behind it. `trace_ids` gives a request's sampled trace id (default: from its
        traceparent header). With `multiprocess_dir`, values live in that directory's files (the metrics must have
        been built with PROMETHEUS_MULTIPROC_DIR set) and `registry` holds only the scrape-time collectors.
        `tracing` is the tracing observer among `before`, if any (batch spans held back are released through it).
        `drift_window_s`: the window of answers the drift figures compare with the model's reference."""
        self.metrics = metrics
        self.tracing = tracing
        self._multiprocess_dir = multiprocess_dir
        self._book = ExemplarBook() if multiprocess_dir else None
        self.registry: CollectorRegistry = new_registry() if multiprocess_dir else metrics.registry
        self._remote: RemoteScrape | None = None
        self._processes: Roster | None = None
        self.metrics_observer = MetricsObserver(metrics, trace_ids=trace_ids or _traceparent_id,
                                                exemplar_book=self._book)
        self.predictions = PredictionStats(metrics.predictions, window_s=drift_window_s)
        # An observer of batches only (the fan-out calls the hooks an observer has).
        self._observers = (*before, self.metrics_observer, cast(Observer, self.predictions), *after)
        self.lag_sampler = EventLoopLagSampler(metrics.event_loop_lag.observe, lag_interval_s)
        self._gpu_readers = gpu_readers
        self._on_stop = list(on_stop)
        self._nvml: NvmlReader | None = None
        self._device = ""
        self._bound = False

    # -- wiring, called by the app factory -----------------------------------------------------------------------
    def compose(self, observer: Observer | None = None) -> CompositeObserver:
        """The one observer the app and batcher call: the caller's own (if any), then telemetry's."""
        extra = (observer,) if observer is not None else ()
        errors = self.metrics.telemetry_errors
        return CompositeObserver((*extra, *self._observers), on_error=lambda hook: errors.labels(hook).inc())

    @property
    def routes(self) -> list[Route]:
        return [Route(METRICS_PATH, self.metrics_endpoint, methods=["GET"])]

    def bind(self, *, batcher: BatcherView, engine: object, model_name: str, device: str,
             routes: Iterable[str], reasons: Mapping[str, Iterable[str]] | None = None,
             model_kind: Mapping[str, str] | None = None, labels: Sequence[str] = (),
             problem: ProblemType = "single_label_classification", reference: Reference | None = None) -> None:
        """Register what is read at scrape time. GPU readers only when `device` (the serving device glassbox
        chose) is a CUDA device: on a CPU machine no GPU metric exists at all. `labels` (the model's, in logit order)
        and `problem` (its head) start the prediction families (telemetry/predictions.py); without labels there are
        none. `reference` is the model's reference.json (None: drift is measured against the first texts served).

        `reasons` names the values the rare-event counters can take ("rejected", "dropped", "aborted",
        "fallback"): their series are created at 0 here, because rate() and increase() count from a series'
        first sample, and a series born at its first event would hide that event from every panel."""
        if self._bound:
            raise RuntimeError("telemetry is already bound to an app")
        self._bound = True
        self._device = device
        m = self.metrics
        routes = list(routes)
        self.metrics_observer.allow_routes(routes)
        self._zero_rare_counters(routes, reasons or {})
        dtype = engine_dtype(str(getattr(engine, "kind", "")), device)
        m.build_info.labels(**build_info_labels(model_name, device, dtype)).set(1)
        m.engine_busy.labels(device_label(device))  # at 0 before the first batch, so its first batch shows in rate()
        if model_kind is not None:
            self.describe_model(model_name, model_kind)
        self.registry.register(QueueCollector(m.queue, batcher))
        if labels or problem == "regression":
            refused = self.predictions.configure(labels, problem, reference)
            if reference is not None and not refused:
                log.info("drift reference: %d texts from %s", reference.texts, reference.source)
            else:
                log.info("drift reference: %sthe first %d texts served (`glassbox model reference` writes one)",
                         f"not the model directory's ({refused}): " if refused else "", REFERENCE_FROM_TRAFFIC)
            self.registry.register(self.predictions)
        if isinstance(engine, FallbackView):
            engine.on_oom(m.gpu_ooms.labels(device_label(device)).inc)  # the series at 0 from the start
        if device.startswith("cuda"):
            self._nvml, allocator = self._gpu_readers(device)
            self.registry.register(GpuCollector(m.gpu, device, self._nvml, allocator))

    def bind_remote(self, scrape: RemoteScrape, *, routes: Iterable[str],
                    reasons: Mapping[str, Iterable[str]] | None = None,
                    keep_batches: Callable[[tuple[int, ...]], None] | None = None,
                    processes: Roster | None = None) -> None:
        """An HTTP worker's binding: its own request metrics, and the engine's scrape-time families fetched with
        `scrape` (the engine link) at every scrape. `keep_batches` asks the engine process to export the batch
        spans it held back for a request this worker's tracing kept on its outcome. `processes` gives the server's
        processes by role (supervisor, engine, worker-N), whose process_* metrics every scrape then shows."""
        if self._bound:
            raise RuntimeError("telemetry is already bound to an app")
        self._bound = True
        self._remote = scrape
        self._processes = processes
        if self.tracing is not None and keep_batches is not None:
            self.tracing.forward_kept = keep_batches
        routes = list(routes)
        self.metrics_observer.allow_routes(routes)
        self._zero_rare_counters(routes, reasons or {})

    def keep_batches(self, batch_ids: tuple[int, ...]) -> None:
        """In the engine process: a worker kept a request that rode in these batches; export their spans."""
        if self.tracing is not None:
            self.tracing.keep_batches(batch_ids)

    def describe_model(self, model_name: str, model_kind: Mapping[str, str]) -> None:
        """glassbox_model_info: family, model_type, problem_type (values config.json parsing already bounded)."""
        self.metrics.model_info.labels(model=model_name[:128], **{k: v[:64] for k, v in model_kind.items()}).set(1)

    def process_started(self, process: str, restart: bool) -> None:
        """In the multi-process layout: this process ("engine" or "worker") started, as a replacement or not. The
        series exists at 0 from the first start, so the first restart shows in increase()."""
        self.metrics.process_restarts.labels(enum_label(process)).inc(1.0 if restart else 0.0)

    def scrape_text(self) -> bytes:
        """The scrape-time families (queue, GPU, allocator, fallback OOMs) in the Prometheus text format: what the
        engine process hands a worker that is answering a scrape; then, as comment lines, this process's exemplars
        (the engine run histogram's), which the worker puts on the engine's samples it reads from the files."""
        text = render_text(self.registry)
        return text + self._book.comment_lines() if self._book is not None else text

    def _zero_rare_counters(self, routes: list[str], reasons: Mapping[str, Iterable[str]]) -> None:
        m = self.metrics
        counters = {"rejected": m.rejected, "dropped": m.dropped, "aborted": m.http_aborted,
                    "fallback": m.fallback_events}
        for kind, values in reasons.items():
            for value in values:
                counters[kind].labels(enum_label(value))
        for route in routes:
            m.truncated_texts.labels(route)
        for hook in HOOKS:
            m.telemetry_errors.labels(hook)

    def warmed_up(self, report: WarmupReport) -> None:
        for mode in START_MODES:  # every mode's series exists, so a degraded start shows as a change, not a new series
            self.metrics.engine_start_mode.labels(mode).set(1.0 if mode == report.start_mode else 0.0)
        if self._device.startswith("cuda") and report.graph_pool_bytes > 0:
            self.metrics.cuda_graph_pool.labels(device_label(self._device)).set(report.graph_pool_bytes)

    def set_chaos_fault(self, fault: str, active: bool) -> None:
        """For the chaos module (through the composition root): an injected fault turned on or off."""
        self.metrics.chaos_fault_active.labels(enum_label(fault)).set(1.0 if active else 0.0)

    # -- lifespan ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.lag_sampler.start()

    async def stop(self) -> None:
        self.lag_sampler.stop()
        for hook in self._on_stop:  # exporters flush over the network: not on the event loop
            try:
                await asyncio.to_thread(hook)
            except Exception:
                log.exception("telemetry shutdown step failed")
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    # -- /metrics ---------------------------------------------------------------------------------------------------
    async def metrics_endpoint(self, request: Request) -> Response:
        """OpenMetrics (with exemplars) when the scraper's Accept asks for it, else the Prometheus text format.
        `?name[]=SAMPLE` (repeatable; sample names, such as `glassbox_requests_total`) keeps only those samples, as
        prometheus_client's own handler does: a watcher that reads a few series every half second (`glassbox chaos
        run`) then does not hold the GIL for a whole exposition's rendering each time."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        registry = self.registry
        if self._multiprocess_dir is not None and self._book is not None:
            budget_s = remote_scrape_budget_s(request.headers.get("x-prometheus-scrape-timeout-seconds"))
            registry = scrape_registry(self._multiprocess_dir, self._book, await self._remote_families(budget_s),
                                       self._processes)
        names = request.query_params.getlist("name[]")
        chosen: CollectorRegistry | RestrictedRegistry = registry.restricted_registry(names) if names else registry
        # Rendering reads every collector (NVML, or every process's files); keep it off the event loop.
        body = await asyncio.to_thread(encoder, chosen)
        headers = {"Content-Type": content_type, "Cache-Control": "no-store"}
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return Response(body, 200, headers=headers)


    async def _remote_families(self, budget_s: float) -> bytes:
        if self._remote is None:
            return b""
        try:
            async with asyncio.timeout(budget_s):
                return await self._remote()
        except Exception as exc:  # the engine is restarting: its families are left out, the rest is served
            log.debug("engine scrape-time families unavailable: %s", exc)
            return b""


def build_telemetry(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    span_exporter: Any = None,
    gpu_readers: Callable[[str], GpuReaders] = cuda_readers,
    lag_interval_s: float = 0.1,
    multiprocess_dir: str | None = None,
) -> Telemetry:
    """Metrics always (on a fresh registry unless one is given); spans when `settings.otlp_endpoint` is set (or a
    test hands in `span_exporter`); a log line per notable request (--log-requests). Logging itself is configured by
    the caller.
    `multiprocess_dir`: this process is one of several writing metric files there (PROMETHEUS_MULTIPROC_DIR must
    have named it before prometheus_client was imported)."""
    from glassbox.telemetry.logs import LogObserver
    from glassbox.telemetry.otlp import build_tracing

    if multiprocess_dir is not None:
        use_cached_pid()
    metrics = build_metrics(registry if registry is not None else new_registry(),
                            process_collectors=multiprocess_dir is None)
    failures = metrics.span_export_failures
    # The reason is free text (an HTTP status, a gRPC code, an exception): logged by the exporter, never a label.
    tracing = build_tracing(settings, exporter=span_exporter, on_export_failure=lambda reason: failures.inc(),
                            decisions=metrics.traces)
    observers: list[Observer] = []
    on_stop: list[Callable[[], None]] = []
    trace_ids: Callable[[RequestRecord], str | None] | None = None
    if tracing is not None:
        tracing_observer = tracing.observer
        observers.append(tracing_observer)
        on_stop.append(tracing.shutdown)

        def trace_ids(record: RequestRecord) -> str | None:
            ids = tracing_observer.ids_for(record)
            if ids is None:
                return _traceparent_id(record)
            return ids.trace_id if ids.sampled else None

    ids_for = tracing.observer.ids_for if tracing is not None else None
    log_observer = LogObserver(record_text=settings.record_text, ids=ids_for, requests=settings.log_requests,
                               slow_s=settings.latency_slo_ms / 1000)
    # The log line last: it may use the span's ids too.
    return Telemetry(metrics, before=observers, after=(log_observer,), trace_ids=trace_ids,
                     lag_interval_s=lag_interval_s, gpu_readers=gpu_readers, on_stop=on_stop,
                     multiprocess_dir=multiprocess_dir, tracing=tracing.observer if tracing is not None else None,
                     drift_window_s=settings.drift_window_s)


def _traceparent_id(record: RequestRecord) -> str | None:
    return trace_id_of(record.traceparent)
