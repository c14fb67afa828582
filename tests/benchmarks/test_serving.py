"""benchmarks.serving reads the mean batch and the mean infer stage from the server's own /metrics exposition."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.serving import MAX_BATCH, _medians, batch_means, batch_ways, parse_totals
from glassbox.telemetry.metrics import build_metrics


def exposition(batches: list[int], infer_s: dict[str, list[float]]) -> str:
    registry = CollectorRegistry()
    metrics = build_metrics(registry, process_collectors=False)
    for rows in batches:
        metrics.batch_size.observe(rows)
    for device, values in infer_s.items():
        for value in values:
            metrics.stage_duration.labels("infer", device).observe(value)
    metrics.stage_duration.labels("tokenize", "").observe(5.0)  # another stage: must not count
    return generate_latest(registry).decode()


def test_totals_take_the_batch_histogram_and_every_devices_infer_stage_only() -> None:
    text = exposition([3, 5], {"cpu": [0.010, 0.020], "cuda:0": [0.003]})
    totals = parse_totals(text)
    assert totals["batch_sum"] == 8 and totals["batch_count"] == 2
    assert totals["infer_count"] == 3
    assert totals["infer_sum"] == pytest.approx(0.033)


def test_means_between_two_readings() -> None:
    before = parse_totals(exposition([4], {"cpu": [0.010]}))
    after = parse_totals(exposition([4, 2, 6], {"cpu": [0.010, 0.030, 0.050]}))
    means = batch_means(before, after)
    assert means["mean_batch"] == pytest.approx(4.0)
    assert means["infer_mean_ms"] == pytest.approx(40.0)


def test_a_server_without_metrics_reads_as_nothing_ran() -> None:
    assert batch_means(parse_totals(""), parse_totals("")) == {"mean_batch": 0.0, "infer_mean_ms": 0.0}


def test_medians_leave_out_a_figure_some_round_lacks() -> None:
    def level(rps: float, outside: float | None) -> dict[str, float]:
        row = {"requests_per_s": rps, "offline_seq_per_s": 100.0, "ratio": rps / 100, "mean_batch": 1.0,
               "p50_ms": 10.0, "p99_ms": 20.0, "non_2xx": 0, "mean_ms": 11.0, "infer_mean_ms": 9.0}
        return row if outside is None else {**row, "outside_engine_ms": outside}

    rounds = [{"batch1_ms": 8.0, "levels": {"1": level(r, o)}, "one_client_overhead_ms": 2.0,
               "one_client_outside_engine_ms": o}
              for r, o in ((90.0, 2.0), (80.0, 3.0), (70.0, 4.0))]
    medians = _medians(rounds)
    assert medians["levels"]["1"]["outside_engine_ms"] == 3.0
    assert medians["one_client_outside_engine_ms"] == 3.0
    del rounds[1]["levels"]["1"]["outside_engine_ms"], rounds[1]["one_client_outside_engine_ms"]
    medians = _medians(rounds)
    assert "outside_engine_ms" not in medians["levels"]["1"] and "one_client_outside_engine_ms" not in medians
    assert medians["levels"]["1"]["requests_per_s"] == 80.0


def test_the_offline_engine_runs_two_batches_side_by_side_only_on_the_cpu() -> None:
    assert batch_ways(8, 2, "cpu") == {1: 8, 2: 4}
    assert batch_ways(8, 1, "cpu") == {1: 8}
    assert batch_ways(1, 2, "cpu") == {1: 1}
    assert batch_ways(256, 16, "cuda") == {1: MAX_BATCH}  # a GPU engine runs one batch at a time, as in the server
