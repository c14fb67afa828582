"""Read what a target says about itself, as any scraper would: its /metrics (Prometheus text) and /readyz.

Only the few series an experiment judges are kept: the fallback gauge and event counter, the chaos fault gauge, and
the prediction drift gauge.
A target without telemetry has no such series; the snapshot then holds None and the verdict says it could not see.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

LOOK_TIMEOUT_S = 5.0  # each HTTP request of a look (the runner's own and the watch process's)
RECOVERED_REASON = "recovered"  # the fallback counter's reason for a switch back to the primary engine


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    fallback_active: float | None = None  # glassbox_fallback_active
    fallback_entries: float | None = None  # glassbox_fallback_events_total summed over reasons other than recovered
    fallback_recoveries: float | None = None  # glassbox_fallback_events_total{reason="recovered"}
    chaos_faults: dict[str, float] = field(default_factory=dict)  # glassbox_chaos_fault_active by fault
    drift: dict[str, float] = field(default_factory=dict)  # glassbox_prediction_drift by distribution (absent: none)


@dataclass(frozen=True, slots=True)
class Observation:
    """One look at the target during a run; `t_s` is on the load generator's clock (seconds from its start)."""

    t_s: float
    metrics: MetricsSnapshot | None  # None: /metrics could not be read
    ready: str | None  # /readyz "status" field (ready, degraded, loading, ...); None: unreachable
    error: str = ""

    @property
    def fallback_active(self) -> bool | None:
        if self.metrics is None or self.metrics.fallback_active is None:
            return None
        return self.metrics.fallback_active > 0

    @property
    def degraded(self) -> bool | None:
        return None if self.ready is None else self.ready == "degraded"


# The families read below. The rest of the exposition (hundreds of histogram buckets) is dropped before parsing:
# prometheus_client's parser is pure Python and took ~14 ms for a whole /metrics (575 lines), run on the load
# generator's event loop every half second, which delayed the requests due in that time.
WANTED = ("glassbox_fallback_active", "glassbox_fallback_events", "glassbox_chaos_fault_active",
          "glassbox_prediction_drift")
# And only their samples are asked for (`/metrics?name[]=...`, as prometheus_client's own handler takes it): the whole
# exposition took 4.0-4.6 ms to answer, rendered on a thread that holds the GIL, every half second, and the slowest
# refusals clustered around those looks (docs/benchmarks/2026-12-04-lighter-watch.md). A target that ignores the
# parameter answers everything, which the filter above then drops.
WANTED_SAMPLES = ("glassbox_fallback_active", "glassbox_fallback_events_total", "glassbox_chaos_fault_active",
                  "glassbox_prediction_drift")


def wanted_lines(text: str) -> str:
    """The lines of `text` that belong to the WANTED families: their samples and their HELP and TYPE lines."""
    kept = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith(("# HELP ", "# TYPE ")) else line
        if name.startswith(WANTED):
            kept.append(line)
    kept.append("")
    return "\n".join(kept)


def parse_metrics(text: str) -> MetricsSnapshot:
    active: float | None = None
    entries: float | None = None
    recoveries: float | None = None
    faults: dict[str, float] = {}
    drift: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted_lines(text)):
        for sample in family.samples:
            if sample.name == "glassbox_fallback_active":
                active = sample.value
            elif sample.name == "glassbox_fallback_events_total":
                if sample.labels.get("reason") == RECOVERED_REASON:
                    recoveries = (recoveries or 0.0) + sample.value
                else:
                    entries = (entries or 0.0) + sample.value
            elif sample.name == "glassbox_chaos_fault_active":
                faults[sample.labels.get("fault", "")] = sample.value
            elif sample.name == "glassbox_prediction_drift":
                drift[sample.labels.get("distribution", "")] = sample.value
    if active is not None:
        # A counter with no labelled child yet exposes no samples: zero switches, not an unknown.
        entries = 0.0 if entries is None else entries
        recoveries = 0.0 if recoveries is None else recoveries
    return MetricsSnapshot(active, entries, recoveries, faults, drift)


async def observe(client: httpx.AsyncClient, base_url: str, t_s: float) -> Observation:
    """One /metrics and /readyz read; failures become part of the observation, never an exception."""
    errors: list[str] = []
    snapshot: MetricsSnapshot | None = None
    ready: str | None = None
    try:
        response = await client.get(f"{base_url}/metrics", params={"name[]": list(WANTED_SAMPLES)})
        if response.status_code == 200:
            snapshot = parse_metrics(response.text)
        else:
            errors.append(f"/metrics answered {response.status_code}")
    except (httpx.HTTPError, ValueError) as exc:
        errors.append(f"/metrics: {type(exc).__name__}: {exc}")
    try:
        response = await client.get(f"{base_url}/readyz")
        status = response.json().get("status") if response.headers.get("content-type", "").startswith(
            "application/json") else None
        ready = str(status) if status is not None else f"http_{response.status_code}"
    except (httpx.HTTPError, ValueError) as exc:
        errors.append(f"/readyz: {type(exc).__name__}: {exc}")
    return Observation(t_s, snapshot, ready, "; ".join(errors))


async def look_every(client: httpx.AsyncClient, base_url: str, interval_s: float, stop: asyncio.Event,
                     take: Callable[[Observation], object]) -> None:
    """Look (`observe`) every `interval_s` until `stop` is set, handing each look to `take` as it comes: the watch
    process's loop, and the runner's own where that process is not running."""
    while not stop.is_set():
        take(await observe(client, base_url, time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
