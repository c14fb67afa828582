"""Trace export from Settings: a TracerProvider owned by the app (never the global one), a sampler, an OTLP
exporter (HTTP/protobuf or gRPC) behind a BatchSpanProcessor, and one object that flushes and shuts them down.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes
from prometheus_client import Counter

from glassbox.service.settings import Settings
from glassbox.telemetry.otlpwire import WireEncoder
from glassbox.telemetry.spans import ItemSpanExporter
from glassbox.telemetry.tracing import RefusalBudget, TracingObserver, decision_counter

log = logging.getLogger("glassbox.telemetry")

TRACES_PATH = "/v1/traces"


class LinkedOrRatio(Sampler):
    """Root-span sampler: keep a span that links to a sampled span, else sample by trace-id ratio.

    A batch span is a root that links to its requests; with this rule every sampled request can find its batch,
    and a batch of only unsampled requests costs no more than the ratio says."""

    def __init__(self, ratio: float) -> None:
        self._ratio = TraceIdRatioBased(ratio)

    def keeps_root(self, trace_id: int) -> bool:
        """should_sample's answer for a root span with no links (the common case, asked per request and per batch):
        the ratio's rule on the trace id, without building its SamplingResult."""
        return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < self._ratio.bound

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if links and any(link.context.trace_flags.sampled for link in links):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self._ratio.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"LinkedOrRatio{{{self._ratio.get_description()}}}"


class KeepSampler(ParentBased):
    """ParentBased with LinkedOrRatio for roots and unsampled remote parents; `roots` is that rule, which the tracing
    observer asks directly for a span with no parent and no links."""

    def __init__(self, ratio: float) -> None:
        self.roots = LinkedOrRatio(ratio)
        super().__init__(root=self.roots, remote_parent_not_sampled=self.roots)


def build_sampler(ratio: float) -> Sampler:
    """The up-front half of the keep decision (telemetry/tracing.py adds the outcome): a sampled remote parent
    keeps the trace; an unsampled one cannot turn it off, so it goes by the ratio like a root (LinkedOrRatio)."""
    return KeepSampler(ratio)


def _with_scheme(endpoint: str) -> str:
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def span_exporter(settings: Settings, *, resource: Resource | None = None, timeout_s: float = 10.0,
                  on_failure: Callable[[str], None] | None = None) -> SpanExporter | None:
    """The OTLP exporter of span items (telemetry/exporters.py) that `otlp_endpoint`/`otlp_protocol` ask for; None
    when no endpoint is set. `resource` is what the spans are sent as (default: the one build_tracer_provider makes);
    `on_failure` hears of every batch that could not be delivered.

    The endpoint is the collector's base address (`http://host:4318`, or `http://host:4317` for gRPC); for HTTP the
    full signal URL is wanted, so `/v1/traces` is added unless it is already there."""
    endpoint = settings.otlp_endpoint.strip()
    if not endpoint:
        return None
    endpoint = _with_scheme(endpoint)
    resource = resource if resource is not None else service_resource(settings)
    wire = WireEncoder(resource.attributes, resource.schema_url)
    if settings.otlp_protocol == "grpc":
        from glassbox.telemetry.exporters_grpc import GrpcItemExporter  # here: grpcio is heavy, and optional

        # An http:// endpoint means plaintext; https:// gets TLS.
        return GrpcItemExporter(wire, resource, endpoint=endpoint, timeout_s=timeout_s, on_failure=on_failure)
    from glassbox.telemetry.exporters import HttpItemExporter

    url = endpoint if endpoint.rstrip("/").endswith(TRACES_PATH) else endpoint.rstrip("/") + TRACES_PATH
    return HttpItemExporter(wire, resource, endpoint=url, timeout_s=timeout_s, on_failure=on_failure)


def _version() -> str:
    try:
        return metadata.version("glassbox-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


def service_resource(settings: Settings, environ: Mapping[str, str] | None = None) -> Resource:
    """service.name and .version, and where this instance runs: `service.instance.id` is `<address>:<port>`, the
    pod's IP (POD_IP, from the Kubernetes downward API) or else the host's name, so a trace matches the `instance`
    label Prometheus gives the scrape target; `k8s.pod.name`/`k8s.namespace.name` (POD_NAME, POD_NAMESPACE) and
    `host.name` where known. OTEL_RESOURCE_ATTRIBUTES overrides any of them."""
    env = os.environ if environ is None else environ
    host = socket.gethostname()
    where: dict[str, str] = {"service.instance.id": f"{env.get('POD_IP') or host}:{settings.port}"}
    if host:
        where["host.name"] = host
    for key, variable in (("k8s.pod.name", "POD_NAME"), ("k8s.namespace.name", "POD_NAMESPACE")):
        if env.get(variable):
            where[key] = env[variable]
    # Resource.create lets the attributes given here win over OTEL_RESOURCE_ATTRIBUTES; for these, the operator's
    # word should (a compose or proxy setup knows the scrape target's name better).
    told = OTELResourceDetector().detect().attributes
    return Resource.create({**{key: value for key, value in where.items() if key not in told},
                            "service.name": settings.service_name, "service.version": _version()})


def build_tracer_provider(settings: Settings) -> TracerProvider:
    """A provider with the service's resource and the sampler from `trace_sample_ratio`. Not registered globally
    and not shut down at interpreter exit: whoever builds it adds its processors and calls shutdown()."""
    return TracerProvider(sampler=build_sampler(settings.trace_sample_ratio), resource=service_resource(settings),
                          shutdown_on_exit=False)


class Tracing:
    """The tracing side of telemetry: the observer, and the provider and BatchSpanProcessor it writes to,
    flushed and shut down together."""

    def __init__(self, provider: TracerProvider, processor: BatchSpanProcessor, observer: TracingObserver) -> None:
        self.provider = provider
        self.processor = processor
        self.observer = observer

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export everything queued; True when the export finished in time."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush, then stop the export thread and close the exporter. Call once, when the app stops."""
        self.provider.shutdown()


def build_tracing(settings: Settings, *, exporter: SpanExporter | None = None,
                  on_export_failure: Callable[[str], None] | None = None,
                  decisions: Counter | None = None, **batching: int) -> Tracing | None:
    """Tracing as the settings ask: None when telemetry is off or there is nowhere to send spans.

    `exporter` replaces the OTLP one: any SpanExporter (tests pass an InMemorySpanExporter), handed ReadableSpans
    built in the export thread, or one with `takes_items = True`, handed the span items themselves. `batching`
    are BatchSpanProcessor keyword options (max_queue_size, schedule_delay_millis, ...); they count queued items,
    one per request or batch (a request's item is six spans). `decisions` (glassbox_traces_total) counts whether each
    request's trace was kept and why."""
    if not settings.telemetry or (exporter is None and not settings.otlp_endpoint.strip()):
        return None
    provider = build_tracer_provider(settings)
    items: SpanExporter | None
    if exporter is None:
        items = span_exporter(settings, resource=provider.resource, on_failure=on_export_failure)
    elif getattr(exporter, "takes_items", False):  # it builds or encodes the spans itself
        items = exporter
    else:
        items = ItemSpanExporter(exporter, provider.resource)
    if items is None:
        return None
    processor = BatchSpanProcessor(items, **batching)  # type: ignore[arg-type]
    provider.add_span_processor(processor)
    observer = TracingObserver(provider, processor, record_text=settings.record_text,
                               slow_s=settings.latency_slo_ms / 1000,
                               refusals=RefusalBudget(settings.trace_refusals_per_s),
                               count=None if decisions is None else decision_counter(decisions))
    return Tracing(provider, processor, observer)
