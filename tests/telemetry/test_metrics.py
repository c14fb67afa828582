"""telemetry/metrics.py: the catalogue, its documentation, its buckets and its bounded label values."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from glassbox.telemetry import metrics as catalogue_module
from glassbox.telemetry.metrics import (
    EVENT_LOOP_LAG_BUCKETS_S,
    EVENT_LOOP_LAG_SLO_S,
    OTHER,
    REQUEST_BUCKETS_S,
    REQUEST_SLO_S,
    STAGE_BUCKETS_S,
    STAGE_SLO_S,
    MetricSpec,
    build_metrics,
    device_label,
    enum_label,
    length_bucket,
    stage_label,
    status_class,
    status_label,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\|\s*`([a-z_:]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) from the catalogue table of docs/metrics.md."""
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        name, kind, labels = match.groups()
        assert name not in rows, f"{name} is documented twice"
        rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def exposed_name(family_name: str, kind: str) -> str:
    # prometheus_client names a counter family without its _total suffix; the samples and the docs carry it.
    return family_name + "_total" if kind == "counter" else family_name


def registry_families(registry: CollectorRegistry) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, label names seen in samples) for every family the registry exposes now."""
    families = {}
    for family in registry.collect():
        labels = {key for sample in family.samples for key in sample.labels if key not in ("le", "quantile")}
        families[exposed_name(family.name, family.type)] = (family.type, tuple(sorted(labels)))
    return families


def test_every_catalogued_metric_is_documented_with_its_type_and_labels() -> None:
    docs = documented()
    specs = build_metrics(CollectorRegistry()).catalogue
    assert len(specs) >= 40
    for spec in specs:
        assert spec.name in docs, f"{spec.name} is built but not in docs/metrics.md"
        assert docs[spec.name] == (spec.kind, spec.labels), f"{spec.name}: docs say {docs[spec.name]}"


def test_every_documented_metric_exists_and_every_exposed_family_is_documented() -> None:
    docs = documented()
    registry = CollectorRegistry()
    specs = {spec.name for spec in build_metrics(registry).catalogue}
    library = registry_families(registry)  # only the client library's collectors have samples before any event
    for name, (kind, labels) in library.items():
        if name.startswith("glassbox_"):
            continue
        assert docs.get(name) == (kind, tuple(sorted(labels))), f"library metric {name} ({kind}, {labels})"
    for name in docs:
        assert name in specs or name in library, f"docs/metrics.md lists {name}, which nothing builds"


def test_names_follow_the_conventions() -> None:
    for spec in build_metrics(CollectorRegistry()).catalogue:
        assert spec.name.startswith("glassbox_"), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.help.strip(), spec.name
        assert len(set(spec.labels)) == len(spec.labels), spec.name


def test_slo_thresholds_are_bucket_boundaries() -> None:
    specs = {spec.name: spec for spec in build_metrics(CollectorRegistry()).catalogue}
    for name, slos in (("glassbox_request_duration_seconds", REQUEST_SLO_S),
                       ("glassbox_request_duration_by_length_seconds", REQUEST_SLO_S),
                       ("glassbox_stage_duration_seconds", STAGE_SLO_S),
                       ("glassbox_event_loop_lag_seconds", EVENT_LOOP_LAG_SLO_S)):
        for threshold in slos:
            assert threshold in specs[name].buckets, f"{name} has no boundary at {threshold}s"
    assert STAGE_BUCKETS_S[0] == pytest.approx(1e-5)  # stage buckets reach down to 10 microseconds
    for buckets in (REQUEST_BUCKETS_S, STAGE_BUCKETS_S, EVENT_LOOP_LAG_BUCKETS_S):
        assert list(buckets) == sorted(set(buckets))


def p99(buckets: tuple[float, ...], observations: list[float]) -> float:
    """What Prometheus' histogram_quantile(0.99, ...) reports: linear interpolation inside the bucket that holds
    the 99th percentile, from the cumulative bucket counts a Histogram with these bounds exports."""
    rank = 0.99 * len(observations)
    lower, below = 0.0, 0
    for bound in buckets:
        count = sum(1 for seconds in observations if seconds <= bound)
        if count >= rank:
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("the 99th percentile is above the last bucket")


def test_stage_buckets_are_fine_enough_to_see_an_infer_regression() -> None:
    """12 ms against 20 ms of CPU infer (with a little spread): with buckets 1, 2.5, 5 per decade both read as a
    P99 of ~24.7 ms; the stage buckets must tell them apart, and report each within a bucket's width."""
    specs = {spec.name: spec for spec in build_metrics(CollectorRegistry()).catalogue}
    assert specs["glassbox_stage_duration_seconds"].buckets == STAGE_BUCKETS_S
    assert STAGE_BUCKETS_S[0] == pytest.approx(1e-5) and STAGE_BUCKETS_S[-1] == pytest.approx(2.5)
    ratios = [high / low for low, high in itertools.pairwise(STAGE_BUCKETS_S)]
    assert min(ratios) >= 1.25 - 1e-9 and max(ratios) <= 1.5 + 1e-9, ratios
    before = [0.0115 + 0.001 * i / 100 for i in range(100)]  # 11.5..12.5 ms
    after = [0.0195 + 0.001 * i / 100 for i in range(100)]  # 19.5..20.5 ms
    coarse = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
    assert p99(coarse, before) == pytest.approx(p99(coarse, after), rel=0.01)  # the blindness being fixed
    fine_before, fine_after = p99(STAGE_BUCKETS_S, before), p99(STAGE_BUCKETS_S, after)
    assert fine_after / fine_before > 1.3, (fine_before, fine_after)
    assert 0.0125 <= fine_before <= 0.015 and 0.02 < fine_after <= 0.025


def test_two_registries_hold_independent_metrics_and_the_global_one_is_untouched() -> None:
    before = {family.name for family in REGISTRY.collect()}
    first, second = build_metrics(CollectorRegistry()), build_metrics(CollectorRegistry())
    first.requests.labels("/r", "200", "ok").inc()
    assert first.registry.get_sample_value("glassbox_requests_total", {"route": "/r", "status": "200",
                                                                       "code": "ok"}) == 1
    assert second.registry.get_sample_value("glassbox_requests_total", {"route": "/r", "status": "200",
                                                                        "code": "ok"}) is None
    after = {family.name for family in REGISTRY.collect()}
    assert not any(name.startswith("glassbox") for name in after - before)


def test_importing_the_catalogue_creates_no_metric() -> None:
    # Module-level values are plain constants: no prometheus metric object exists until build_metrics runs.
    from prometheus_client.metrics import MetricWrapperBase

    assert not [name for name, value in vars(catalogue_module).items() if isinstance(value, MetricWrapperBase)]


def test_gpu_specs_are_marked_and_scrape_specs_are_not_pushed() -> None:
    specs = {spec.name: spec for spec in build_metrics(CollectorRegistry()).catalogue}
    gpu = {name for name, spec in specs.items() if spec.gpu_only}
    assert {"glassbox_gpu_utilization_ratio", "glassbox_torch_memory_fragmentation_ratio",
            "glassbox_cuda_graph_pool_bytes", "glassbox_torch_alloc_retries_total"} <= gpu
    for name in ("glassbox_queue_requests", "glassbox_queue_tokens", "glassbox_queue_max_requests",
                 "glassbox_queue_max_tokens"):
        assert isinstance(specs[name], MetricSpec) and specs[name].scrape and not specs[name].labels


def test_one_unit_per_metric_and_one_oom_counter() -> None:
    names = {spec.name for spec in build_metrics(CollectorRegistry()).catalogue}
    assert not names & {"glassbox_queue_depth", "glassbox_queue_limit", "glassbox_engine_throughput_texts_per_second",
                        "glassbox_torch_ooms_total"}
    assert [name for name in names if "oom" in name] == ["glassbox_gpu_oom_total"]
    assert "glassbox_engine_busy_seconds_total" in names
    assert all("unit" not in spec.labels for spec in build_metrics(CollectorRegistry()).catalogue)


@pytest.mark.parametrize(("tokens", "bucket"), [(1, "16"), (16, "16"), (17, "32"), (128, "128"), (129, "256"),
                                                (512, "512"), (513, "+Inf")])
def test_length_bucket(tokens: int, bucket: str) -> None:
    assert length_bucket(tokens) == bucket


def test_label_values_are_bounded() -> None:
    assert enum_label("queue_full_requests") == "queue_full_requests"
    assert enum_label("Queue Full!") == OTHER
    assert enum_label("x" * 49) == OTHER
    assert enum_label(None, "ok") == "ok"
    assert enum_label("", "ok") == "ok"
    assert enum_label("Bad Code", "ok") == OTHER
    assert device_label("cuda:0") == "cuda:0"
    assert device_label("cpu,cuda:0") == "cpu,cuda:0"
    assert device_label("/dev/evil device") == OTHER
    assert status_label(499) == "499"
    assert status_label(1234) == OTHER
    assert status_class(503) == "5xx"
    assert status_class(42) == OTHER
    assert stage_label("infer") == "infer"
    assert stage_label("made-up") == OTHER
