"""Every panel query of every dashboard, run by a real Prometheus that scraped a live glassbox under load.

Two targets, one Prometheus (Debian's binary, scraping every second, exemplar storage on):

- `glassbox`: `python -m glassbox.service serve` on the tiny model, on the CPU, with telemetry on (as `glassbox serve`
  builds it), driven with a few hundred good requests on every route, each carrying a sampled `traceparent` (so
  exemplars carry its trace id), and the bad ones every error series needs (tests/grafana/load.py);
- `glassbox-degraded`: the real app in this process with a stand-in "GPU" that raises CUDA OOMs on demand behind
  the real FallbackEngine, a chaos fault switched on and off, and a failing observer (tests/grafana/degraded.py).

Then each query (panel targets, annotations, variables), with template variables substituted as Grafana would,
goes through /api/v1/query_range (or /api/v1/query for instant targets): it must parse and, unless its panel is in
GPU_ONLY, return at least one finite value. GPU-only panels must parse and return nothing: on a CPU glassbox
exports no GPU series at all, not even zeros. Every target with exemplars on must find exemplars whose trace_id
is one the load sent.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from glassbox.chaos.local import free_port
from glassbox.service.model.reference import compute_reference, write_reference
from tests.grafana.dashboards import TITLES, Query, expansions, load_dashboards, queries, require_tool
from tests.grafana.degraded import DegradedTarget, degraded_target
from tests.grafana.load import TEXTS, Traffic, classify_some, drive
from tests.grafana.prometheus import Prometheus, deploy_rules, poll, running_prometheus, started
from tests.telemetry.otlp_receiver import http_receiver

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 60.0
MODEL_NAME = "tiny"
MAX_TEXTS, MAX_BODY_BYTES, MAX_QUEUE_REQUESTS = 8, 65_536, 4
REQUESTS, CONCURRENCY = 300, 8
# What Grafana would substitute for its built-in variables, for a 1 s scrape interval.
BUILTINS = {"__rate_interval": "5s", "__interval": "1s", "__range": "60s", "__range_s": "60"}

# Panels whose series exist only where glassbox serves from a CUDA device (docs/metrics.md: "GPU only"), with the
# reason. On this CPU run they must parse and come back empty.
GPU_ONLY = {
    ("glassbox / Device", "CUDA graph pool"): "glassbox_cuda_graph_pool_bytes is set after CUDA graph capture",
    ("glassbox / Device", "Graph replays by bucket"): "mode=\"graph\" runs happen only with CUDA graphs",
    ("glassbox / Device", "GPU utilisation"): "NVML",
    ("glassbox / Device", "GPU memory"): "NVML and the torch CUDA allocator",
    ("glassbox / Device", "Memory pressure"): "NVML and the torch CUDA allocator",
    ("glassbox / Device", "GPU memory held by other processes"): "NVML and the torch CUDA allocator",
    ("glassbox / Device", "GPU power"): "NVML",
    ("glassbox / Device", "GPU temperature"): "NVML",
    ("glassbox / Device", "Allocator fragmentation ratio"): "the torch CUDA allocator",
    ("glassbox / Device", "Reserved against allocated"): "the torch CUDA allocator",
    ("glassbox / Device", "Allocation retries"): "the torch CUDA allocator",
}


@dataclass
class Scraped:
    prometheus: Prometheus
    traffic: Traffic
    start: float  # Unix time: Prometheus began scraping
    end: float  # Unix time: everything was scraped


@contextmanager
def served(model_dir: Path, log: Path) -> Iterator[int]:
    """`glassbox serve` in a subprocess, telemetry on (the default) and traces exported to an OTLP receiver (so the
    keep decisions are counted); yields its port once it is ready."""
    with http_receiver() as receiver, _served(model_dir, log, receiver.endpoint) as port:
        yield port


@contextmanager
def _served(model_dir: Path, log: Path, otlp_endpoint: str) -> Iterator[int]:
    port = free_port()
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(model_dir), "--model-name", MODEL_NAME,
            "--device", "cpu", "--port", str(port), "--threads", "1", "--max-length", "64",
            "--length-buckets", "16,32,64", "--batch-buckets", "1,4,8", "--max-texts-per-request", str(MAX_TEXTS),
            "--max-queue-requests", str(MAX_QUEUE_REQUESTS), "--max-body-bytes", str(MAX_BODY_BYTES),
            "--drain-timeout-s", "5", "--log-level", "warning",
            # One batch at a time: with two side by side, a quiet machine could run the tiny model's bursts as fast as
            # the event loop admits them, the 4-request queue would never fill, and the 429 panels would have nothing.
            "--engine-threads", "1", "--otlp-endpoint", otlp_endpoint]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    # On the way out SIGTERM: drain, then exit.
    with started(argv, log, f"http://127.0.0.1:{port}/readyz", "glassbox serve", env=env, cwd=ROOT, bound_s=BOUND_S):
        yield port


def degrade_and_recover(prometheus: Prometheus, target: DegradedTarget) -> None:
    """Chaos fault on; "GPU" OOMs until the CPU serves and Prometheus has seen it, failed probes; then the GPU
    heals, a probe recovers, and the fault goes off. Each step waits for its state, never for a time."""
    job = 'job="glassbox-degraded"'
    target.set_chaos(True)
    target.gpu.failing.set()
    statuses = asyncio.run(classify_some(target.base_url, 5))
    assert statuses == {200: 5}, f"the CPU fallback should answer every request: {statuses}"
    assert target.degraded
    # Two scrapes in each state, so that a 1 s query step cannot fall between them.
    poll(lambda: prometheus.value(f"sum(sum_over_time(glassbox_fallback_active{{{job}}}[1m]))") >= 2
         and prometheus.value(f"sum(sum_over_time(glassbox_chaos_fault_active{{{job}}}[1m]))") >= 2,
         "Prometheus saw the fallback and the chaos fault in two scrapes")
    # Probes while the "GPU" still fails: probe_failed events and more OOMs.
    poll(lambda: bool(asyncio.run(classify_some(target.base_url, 1))) and target.engine.state().probes >= 2,
         "two failed GPU probes")
    target.gpu.failing.clear()
    poll(lambda: bool(asyncio.run(classify_some(target.base_url, 1))) and not target.degraded,
         "a probe brought the GPU back")
    target.set_chaos(False)


@pytest.fixture(scope="module")
def scraped(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    binary = require_tool("prometheus")
    workdir = tmp_path_factory.mktemp("grafana-panels")
    # The served model has a reference, so the drift panels have figures (the load sends ~750 texts a round).
    model = workdir / "model"
    shutil.copytree(tiny_model_dir, model)
    write_reference(model, compute_reference(model, TEXTS * 10, "the load's texts"))
    with served(model, workdir / "serve.log") as port, degraded_target(tiny_model_dir) as degraded:
        targets = {"glassbox": port, "glassbox-degraded": degraded.port}
        # With deploy's rules, so the SLO dashboard's alert list has alerts to list (the load's 429 bursts burn the
        # availability budget).
        with running_prometheus(binary, targets, workdir / "prometheus",
                                rule_files=deploy_rules(workdir / "rules")) as prometheus:
            start = time.time()
            traffic = Traffic()
            # Two rounds with a scrape between them: a series born in the first round (its first observation
            # is its first sample) has grown by the second, so its rate is not zero everywhere.
            for _ in range(2):
                prometheus.wait_for_scrapes_after(time.time(), len(targets))
                asyncio.run(asyncio.wait_for(
                    drive(traffic, f"http://127.0.0.1:{port}", MODEL_NAME, requests=REQUESTS // 2,
                          concurrency=CONCURRENCY, max_texts=MAX_TEXTS, max_body_bytes=MAX_BODY_BYTES), BOUND_S))
            degrade_and_recover(prometheus, degraded)
            prometheus.wait_for_scrapes_after(time.time(), len(targets))
            yield Scraped(prometheus, traffic, start, time.time())


def finite(result: list[dict[str, Any]]) -> bool:
    samples = [value for series in result for value in series.get("values", [series.get("value")]) if value]
    return any(math.isfinite(float(value)) for _, value in samples)


def run_query(scraped: Scraped, query: Query, expr: str) -> list[dict[str, Any]]:
    if query.instant:
        return scraped.prometheus.instant(expr, scraped.end)
    # Whole steps back from the end, so that the last evaluation sees the last scrapes waited for.
    start = scraped.end - math.ceil(scraped.end - scraped.start)
    return scraped.prometheus.range(expr, start, scraped.end)


# --- the load did what the panels need -------------------------------------------------------------------------
def test_the_load_produced_successes_errors_and_rejections(scraped: Scraped) -> None:
    statuses = scraped.traffic.statuses
    assert statuses[200] >= REQUESTS // 2, statuses
    for status in (400, 413, 429, 504):  # bad JSON, too many texts, queue full, expired deadline
        assert statuses[status], f"no {status} answers: {statuses}"

    def values(metric: str, label: str) -> set[str]:
        """Label values of the series that counted something (rare-event series also exist at 0 from the start)."""
        found = scraped.prometheus.instant(f'{metric}{{job="glassbox"}} > 0', scraped.end)
        return {series["metric"][label] for series in found}

    # The series the error, reject and abort panels plot, as Prometheus stored them.
    assert {"invalid_json", "too_many_texts", "overloaded", "deadline_exceeded"} <= values(
        "glassbox_requests_total", "code")
    # The load overflows the request cap on purpose; whether the predicted wait also refuses some depends on how fast
    # the shared machine ran the engine at the time.
    rejected = values("glassbox_rejected_total", "reason")
    assert "queue_full_requests" in rejected and rejected <= {"queue_full_requests", "predicted_wait"}, rejected
    assert values("glassbox_dropped_total", "reason") == {"deadline"}
    assert values("glassbox_http_aborted_total", "reason") == {"header_too_large", "body_too_large"}
    assert values("glassbox_truncated_texts_total", "route") == {"/v1/classify"}
    assert values("glassbox_requests_total", "route") == {"/v1/classify", "/predict", "/v2/models/{name}/infer"}


# --- every query of every dashboard ------------------------------------------------------------------------------
# Panels whose series exist only in the multi-process layout (glassbox serve --workers N); this run serves from one
# process, so they too must parse and come back empty.
MULTIPROCESS_ONLY = {
    ("glassbox / Degradation & chaos", "Engine and worker restarts"): "glassbox_process_restarts_total",
}
# Panels of a regression head's series: the tiny model here is a classifier.
REGRESSION_ONLY = {
    ("glassbox / Model", "Regression outputs"): "glassbox_regression_output",
}
EMPTY_HERE = {**GPU_ONLY, **MULTIPROCESS_ONLY, **REGRESSION_ONLY}


def test_the_gpu_only_list_names_real_panels() -> None:
    titles = {(d["title"], q.title) for d in load_dashboards().values() for q in queries(d) if q.source == "panel"}
    assert set(EMPTY_HERE) <= titles, sorted(set(EMPTY_HERE) - titles)


@pytest.mark.parametrize("name", sorted(TITLES))
def test_every_query_parses_and_returns_data(scraped: Scraped, name: str) -> None:
    dashboard = load_dashboards()[name]
    problems = []
    checked = 0
    for query in queries(dashboard):
        gpu_only = query.source == "panel" and (dashboard["title"], query.title) in EMPTY_HERE
        try:
            exprs = expansions(query, dashboard, BUILTINS)
        except AssertionError as error:
            problems.append(str(error))
            continue
        for expr in exprs:
            checked += 1
            try:
                result = run_query(scraped, query, expr)
            except AssertionError as error:
                problems.append(f"{query.where}: does not run: {error}\n    {expr}")
                continue
            if gpu_only and result:
                problems.append(f"{query.where}: GPU-only or multi-process only, but this run has data\n    {expr}")
            elif not gpu_only and not finite(result):
                problems.append(f"{query.where}: no data\n    {expr}")
    assert checked
    assert not problems, f"{len(problems)} of {checked} queries failed:\n" + "\n".join(problems)


def test_exemplars_carry_the_trace_ids_the_clients_sent(scraped: Scraped) -> None:
    checked = 0
    for dashboard in load_dashboards().values():
        for query in queries(dashboard):
            if not query.exemplar:
                continue
            for expr in expansions(query, dashboard, BUILTINS):
                found = scraped.prometheus.exemplars(expr, scraped.start, scraped.end)
                trace_ids = {e["labels"].get("trace_id") for series in found for e in series["exemplars"]}
                assert trace_ids & scraped.traffic.trace_ids, f"{query.where}: no exemplar with a sent trace id"
                checked += 1
    assert checked >= 3  # request latency (line and heatmap), stage P99, one heatmap per stage
    request_histogram = 'glassbox_request_duration_seconds_bucket{job="glassbox"}'
    found = scraped.prometheus.exemplars(request_histogram, scraped.start, scraped.end)
    assert any(e["labels"]["trace_id"] in scraped.traffic.trace_ids for series in found for e in series["exemplars"])


def test_the_runbook_queries_run(scraped: Scraped) -> None:
    """docs/runbook.md's PromQL, line by line (comments stripped): each must parse and evaluate."""
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    lines = [line.split("#")[0].strip() for block in re.findall(r"```promql\n(.*?)```", runbook, flags=re.S)
             for line in block.splitlines()]
    exprs = [line for line in lines if line]
    assert len(exprs) >= 20
    failures = []
    for expr in exprs:
        try:
            scraped.prometheus.instant(expr, scraped.end)
        except AssertionError as error:
            failures.append(f"{expr}: {error}")
    assert not failures, "\n".join(failures)


# Counters of rare events. A labelled counter's series appears at its first increment, already at 1, and
# rate()/increase() count from a series' first sample: so the first rejection, drop, abort, fallback event or
# telemetry error of each kind is invisible on every panel (and often it is the only one).
RARE_EVENT_COUNTERS = ("glassbox_rejected_total", "glassbox_dropped_total", "glassbox_http_aborted_total",
                       "glassbox_fallback_events_total", "glassbox_telemetry_errors_total",
                       "glassbox_truncated_texts_total")


def test_rare_event_counters_start_at_zero_so_rates_count_the_first_event(scraped: Scraped) -> None:
    born_late = {}
    for metric in RARE_EVENT_COUNTERS:
        found = scraped.prometheus.range(metric, scraped.start, scraped.end)
        assert found, f"the load produced no {metric} series"
        for series in found:
            first = float(series["values"][0][1])
            if first > 0:
                born_late[str(series["metric"])] = first
    assert not born_late, f"series whose first sample was already above 0: {born_late}"
