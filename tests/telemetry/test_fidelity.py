"""Telemetry that does not lie (issue 4, item 7), in one run against the real app under uvicorn on 127.0.0.1:

- the P99 that `histogram_quantile` computes from the scraped request histogram agrees with the P99 the client
  measured, within one bucket width;
- the five stage durations of each request add up to its total within 5 % or 0.5 ms.

The client runs in its own process (tests/telemetry/loadclient.py), so its work never competes with the server for
the GIL and what it measures is what a real client sees.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from glassbox.service.app import create_app
from glassbox.service.observer import RequestRecord
from glassbox.telemetry import build_telemetry
from tests.service.apptools import BOUND_S, RecordingObserver, app_settings, live_server, wait_until

REQUESTS, CONNECTIONS = 400, 4
CLIENT = Path(__file__).with_name("loadclient.py")


@dataclass(frozen=True)
class Run:
    client_latencies: list[float]  # seconds, one per request
    records: list[RequestRecord]  # what the server observed
    buckets: list[tuple[float, float]]  # (le, cumulative count) of the /v1/classify 2xx request histogram


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float, float]:
    """PromQL's histogram_quantile over cumulative (le, count) buckets: find the bucket holding rank q * total and
    interpolate linearly inside it (the first bucket starts at 0). Returns (estimate, bucket lower, bucket upper)."""
    buckets = sorted(buckets)
    assert buckets[-1][0] == math.inf, "a histogram ends with the +Inf bucket"
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == math.inf:  # Prometheus answers the last finite bound
                return lower, lower, math.inf
            return lower + (upper - lower) * (rank - below) / (count - below), lower, upper
        lower, below = upper, count
    raise AssertionError("unreachable: the +Inf bucket holds every observation")


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 100 observations: 50 in (0, 1], 40 in (1, 2], 10 in (2, 4]. Rank 50 -> 1.0; rank 90 -> 2.0; rank 95 -> 3.0.
    buckets = [(1.0, 50.0), (2.0, 90.0), (4.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == (1.0, 0.0, 1.0)
    assert histogram_quantile(0.9, buckets)[0] == pytest.approx(2.0)
    assert histogram_quantile(0.95, buckets) == (pytest.approx(3.0), 2.0, 4.0)
    assert histogram_quantile(0.25, buckets)[0] == pytest.approx(0.5)
    assert histogram_quantile(0.99, [(1.0, 0.0), (math.inf, 5.0)]) == (1.0, 1.0, math.inf)
    assert nearest_rank([float(i) for i in range(1, 101)], 0.99) == 99.0


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path) -> Iterator[Run]:
    # The server's default gc.freeze, as `glassbox serve` runs: this server shares the test process, whose heap
    # holds everything the tests before it made, and a full collection of that stalls the loop before a request
    # reaches the app (the client sees it, the server's histogram cannot).
    settings = app_settings(tiny_model_dir, gc_freeze=True)
    recording = RecordingObserver()
    app = create_app(settings, observer=recording, telemetry=build_telemetry(settings))
    try:
        with live_server(app, settings) as server:
            wait_until(lambda: httpx.get(f"{server.base_url}/readyz").status_code == 200, "the app is ready")
            done = subprocess.run([sys.executable, str(CLIENT), str(server.port), str(REQUESTS), str(CONNECTIONS)],
                                  capture_output=True, check=True, timeout=BOUND_S * 4)
            scraped = httpx.get(f"{server.base_url}/metrics", timeout=BOUND_S).text
    finally:
        gc.unfreeze()
    answers = json.loads(done.stdout)
    assert [status for _, status in answers] == [200] * REQUESTS
    (family,) = [f for f in text_string_to_metric_families(scraped) if f.name == "glassbox_request_duration_seconds"]
    series = {"route": "/v1/classify", "status_class": "2xx"}
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples
               if s.name.endswith("_bucket") and all(s.labels[k] == v for k, v in series.items())]
    yield Run([latency for latency, _ in answers], recording.requests, buckets)


def test_histogram_p99_agrees_with_the_client_p99_within_one_bucket(run: Run) -> None:
    assert max(count for _, count in run.buckets) == REQUESTS  # every request is in the histogram, once
    estimate, lower, upper = histogram_quantile(0.99, run.buckets)
    client_p99 = nearest_rank(run.client_latencies, 0.99)
    server_p99 = nearest_rank([r.duration_s for r in run.records], 0.99)
    assert upper != math.inf, f"P99 {server_p99 * 1e3:.2f} ms fell beyond the last bucket"
    # The exact server-side P99 lies in the bucket the estimate came from (a check of the quantile arithmetic).
    assert lower <= server_p99 <= upper
    width = upper - lower
    assert abs(client_p99 - estimate) <= width, (
        f"client P99 {client_p99 * 1e3:.2f} ms vs histogram_quantile {estimate * 1e3:.2f} ms "
        f"(bucket {lower * 1e3:g}-{upper * 1e3:g} ms, server P99 {server_p99 * 1e3:.2f} ms)"
    )


def test_stage_durations_add_up_to_each_request(run: Run) -> None:
    assert len(run.records) == REQUESTS
    worst = []
    for record in run.records:
        assert [span.name for span in record.stages] == ["parse", "tokenize", "queue", "infer", "postprocess"]
        stages_s = sum(span.duration_s for span in record.stages)
        allowed = max(0.05 * record.duration_s, 0.0005)
        missing = record.duration_s - stages_s
        if not -allowed <= missing <= allowed:
            gaps = [round((b.start_ns - a.end_ns) / 1e6, 3) for a, b in itertools.pairwise(record.stages)]
            edges = (round((record.stages[0].start_ns - record.start_ns) / 1e6, 3),
                     round((record.end_ns - record.stages[-1].end_ns) / 1e6, 3))
            worst.append((round(missing * 1e3, 3), round(record.duration_s * 1e3, 3), gaps, edges))
    assert not worst, f"{len(worst)} requests whose stages do not add up, (missing ms, total ms): {worst[:10]}"
