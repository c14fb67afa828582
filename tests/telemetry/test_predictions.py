"""telemetry/predictions.py: what the model answered, counted per batch from its logits, read at scrape time; and the
same families through the real app, where they add up to the answers clients got."""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from glassbox.service.app import create_app
from glassbox.service.classification import softmax
from glassbox.service.model.reference import Reference, compute_reference, count, reference_of, write_reference
from glassbox.service.observer import BatchRecord
from glassbox.service.types import EngineTiming, ProblemType
from glassbox.telemetry import build_metrics
from glassbox.telemetry.metrics import PREDICTION_LABELS, PREDICTION_SCORE_BUCKETS
from glassbox.telemetry.predictions import PredictionStats
from tests.service.apptools import app_settings, ready_client
from tests.telemetry.test_setup import telemetry_for_tests

TIMING = EngineTiming(0, 1, "cpu", "eager", 1, 1, 1, None)


def stats(labels: Sequence[str], problem: ProblemType = "single_label_classification") -> tuple[PredictionStats,
                                                                                                 CollectorRegistry]:
    registry = CollectorRegistry()
    predictions = PredictionStats(build_metrics(CollectorRegistry(), process_collectors=False).predictions)
    predictions.configure(labels, problem)
    registry.register(predictions)
    return predictions, registry


def batch(logits: Any, lengths: Sequence[int] | None = None) -> BatchRecord:
    rows = np.asarray(logits, dtype=np.float32)
    return BatchRecord(1, TIMING, (), 0, logits=rows,
                       lengths=None if lengths is None else np.asarray(lengths, dtype=np.int64))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_single_label_head_counts_each_answers_best_label_and_its_score() -> None:
    predictions, registry = stats(("negative", "positive", "neutral"))
    assert value(registry, "glassbox_predictions_total", label="neutral") == 0.0  # every label exists at 0
    logits = [[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.0, 5.0]]
    predictions.on_batch(batch(logits, lengths=[5, 12, 40, 600]))
    predictions.on_batch(batch([[0.0, 4.0, 0.0]], lengths=[7]))
    assert [value(registry, "glassbox_predictions_total", label=name) for name in ("negative", "positive", "neutral")] \
        == [1.0, 3.0, 1.0]
    top = softmax(np.array([*logits, [0.0, 4.0, 0.0]], dtype=np.float32)).max(axis=1)
    assert value(registry, "glassbox_prediction_score_count") == 5.0
    assert value(registry, "glassbox_prediction_score_sum") == pytest.approx(float(top.sum()), rel=1e-6)
    for bound in PREDICTION_SCORE_BUCKETS:  # cumulative, `le` as Prometheus means it
        assert value(registry, "glassbox_prediction_score_bucket", le=repr(bound)) == float((top <= bound).sum())
    assert value(registry, "glassbox_input_tokens_bucket", le="8.0") == 2.0
    assert value(registry, "glassbox_input_tokens_bucket", le="512.0") == 4.0
    assert value(registry, "glassbox_input_tokens_bucket", le="+Inf") == 5.0
    assert value(registry, "glassbox_regression_output_count") is None  # no regression family for a classifier


def test_a_multi_label_head_counts_every_label_over_one_half_and_its_top_sigmoid() -> None:
    predictions, registry = stats(("toxic", "insult", "threat"), "multi_label_classification")
    predictions.on_batch(batch([[2.0, 1.0, -3.0], [-2.0, -2.0, -2.0], [0.0, 3.0, 3.0]]))
    counts = [value(registry, "glassbox_predictions_total", label=name) for name in ("toxic", "insult", "threat")]
    assert counts == [2.0, 2.0, 1.0]  # sigmoid(0) is exactly 0.5: counted; the second answer has no label
    assert value(registry, "glassbox_prediction_score_count") == 3.0
    assert value(registry, "glassbox_prediction_score_bucket", le="0.2") == 1.0  # sigmoid(-2) = 0.12


def test_a_regression_head_has_a_histogram_of_its_outputs_and_no_labels() -> None:
    predictions, registry = stats(("LABEL_0",), "regression")
    predictions.on_batch(batch([[0.25], [3.5], [-20.0], [150.0]]))
    # Its bounds go below 0, so (as OpenMetrics has it) no _sum and no _count: the +Inf bucket counts.
    assert value(registry, "glassbox_regression_output_bucket", le="+Inf") == 4.0
    assert value(registry, "glassbox_regression_output_sum") is None
    assert value(registry, "glassbox_regression_output_bucket", le="-10.0") == 1.0
    assert value(registry, "glassbox_regression_output_bucket", le="0.5") == 2.0
    assert value(registry, "glassbox_regression_output_bucket", le="4.0") == 3.0
    assert value(registry, "glassbox_regression_output_bucket", le="100.0") == 3.0
    assert value(registry, "glassbox_predictions_total", label="LABEL_0") is None
    assert value(registry, "glassbox_prediction_score_count") is None


def test_a_model_with_many_labels_counts_the_rest_as_other() -> None:
    labels = [f"class_{i}" for i in range(PREDICTION_LABELS + 10)]
    predictions, registry = stats(labels)
    logits = np.zeros((3, len(labels)), dtype=np.float32)
    logits[0, 0] = logits[1, PREDICTION_LABELS] = logits[2, len(labels) - 1] = 9.0
    predictions.on_batch(batch(logits))
    assert value(registry, "glassbox_predictions_total", label="class_0") == 1.0
    assert value(registry, "glassbox_predictions_total", label="other") == 2.0
    assert value(registry, "glassbox_predictions_total", label=f"class_{PREDICTION_LABELS}") is None
    series = next(m for m in registry.collect() if m.name == "glassbox_predictions").samples
    assert len(series) == PREDICTION_LABELS + 1


def test_nothing_is_counted_or_exported_before_the_model_is_known() -> None:
    registry = CollectorRegistry()
    predictions = PredictionStats(build_metrics(CollectorRegistry(), process_collectors=False).predictions)
    registry.register(predictions)
    predictions.on_batch(batch([[1.0, 0.0]]))
    assert [m.name for m in registry.collect()] == []
    predictions.configure(("a", "b"), "single_label_classification")
    assert value(registry, "glassbox_predictions_total", label="a") == 0.0  # the batch before was not kept


def test_through_the_app_the_counts_add_up_to_the_answers_clients_got(tiny_model_dir: Path) -> None:
    telemetry = telemetry_for_tests()
    app = create_app(app_settings(tiny_model_dir), telemetry=telemetry)
    texts = ["a good movie", "the worst film", "fine", "boring and slow", "great fun", "sad"] * 3
    answered: dict[str, int] = {}
    with ready_client(app) as client:
        for i in range(0, len(texts), 3):
            response = client.post("/v1/classify", json={"texts": texts[i:i + 3]})
            assert response.status_code == 200
            for result in response.json()["results"]:
                answered[result["label"]] = answered.get(result["label"], 0) + 1
        scraped = client.get("/metrics").text
    registry = telemetry.registry
    labels = ("negative", "positive", "neutral")
    assert {name: value(registry, "glassbox_predictions_total", label=name) for name in labels} == \
        {name: float(answered.get(name, 0)) for name in labels}
    assert value(registry, "glassbox_prediction_score_count") == len(texts)
    assert value(registry, "glassbox_input_tokens_count") == len(texts)
    assert 'glassbox_predictions_total{label="positive"}' in scraped
    assert not math.isnan(value(registry, "glassbox_prediction_score_sum") or math.nan)


# -- drift against a reference -----------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def labelled(label: int, rows: int, labels: int = 2, margin: float = 3.0) -> np.ndarray:
    """`rows` answers of `label`, each with the same confident score."""
    logits = np.zeros((rows, labels), dtype=np.float32)
    logits[:, label] = margin
    return logits


def mix(rows: int, shares: Sequence[float]) -> np.ndarray:
    """`rows` answers split between the labels by `shares`, alternating so every batch has the same mix."""
    counts = [round(rows * share) for share in shares]
    parts = [labelled(label, count, len(shares)) for label, count in enumerate(counts)]
    return np.concatenate(parts)


def reference_for(shares: Sequence[float], texts: int = 1000) -> Reference:
    counted = count(mix(texts, shares), np.full(texts, 20), "single_label_classification")
    return reference_of(counted, texts, "single_label_classification", ("negative", "positive"), "test texts")


def drift_stats(reference: Reference | None) -> tuple[PredictionStats, CollectorRegistry, Clock]:
    clock = Clock()
    registry = CollectorRegistry()
    predictions = PredictionStats(build_metrics(CollectorRegistry(), process_collectors=False).predictions, clock)
    assert predictions.configure(("negative", "positive"), "single_label_classification", reference) == ""
    registry.register(predictions)
    return predictions, registry, clock


def serve(predictions: PredictionStats, clock: Clock, shares: Sequence[float], seconds: int, per_second: int) -> None:
    for _ in range(seconds):
        predictions.on_batch(batch(mix(per_second, shares), [20] * per_second))
        clock.now += 1.0


def drift(registry: CollectorRegistry, distribution: str = "labels") -> float | None:
    return value(registry, "glassbox_prediction_drift", distribution=distribution)


def test_answers_like_the_reference_show_no_drift_and_a_shift_shows_within_the_window() -> None:
    predictions, registry, clock = drift_stats(reference_for((0.4, 0.6)))
    assert value(registry, "glassbox_prediction_reference_texts", source="file") == 1000.0
    serve(predictions, clock, (0.4, 0.6), seconds=5, per_second=50)
    assert drift(registry) is None  # 250 texts in the window: too few to say anything
    serve(predictions, clock, (0.4, 0.6), seconds=60, per_second=50)
    steady = drift(registry)
    assert steady is not None and steady < 0.01
    assert drift(registry, "length") is not None and drift(registry, "length") < 0.01  # type: ignore[operator]
    serve(predictions, clock, (1.0, 0.0), seconds=30, per_second=50)  # only one label's texts now
    assert drift(registry) > 0.25  # type: ignore[operator]
    serve(predictions, clock, (0.4, 0.6), seconds=61, per_second=50)  # the mix returns: the shift leaves the window
    assert drift(registry) < 0.01  # type: ignore[operator]
    clock.now += 61  # no traffic for a minute: nothing to say
    assert drift(registry) is None


def test_without_a_reference_the_first_texts_served_become_it() -> None:
    predictions, registry, clock = drift_stats(None)
    assert value(registry, "glassbox_prediction_reference_texts", source="traffic") == 0.0
    serve(predictions, clock, (0.4, 0.6), seconds=10, per_second=50)
    assert drift(registry) is None  # 500 texts: the reference is still being counted
    serve(predictions, clock, (0.4, 0.6), seconds=20, per_second=50)
    assert value(registry, "glassbox_prediction_reference_texts", source="traffic") == 1000.0
    assert drift(registry) < 0.01  # type: ignore[operator]
    serve(predictions, clock, (0.0, 1.0), seconds=45, per_second=50)
    assert drift(registry) > 0.25  # type: ignore[operator]


def test_a_reference_counted_for_another_model_is_not_used_and_says_why() -> None:
    predictions = PredictionStats(build_metrics(CollectorRegistry(), process_collectors=False).predictions)
    refused = predictions.configure(("bad", "good"), "single_label_classification", reference_for((0.5, 0.5)))
    assert "negative, positive" in refused and "not this one" in refused


def test_the_server_reads_the_model_directorys_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    write_reference(model, compute_reference(model, ["a good movie", "a bad one", "fine"] * 5, "test texts"))
    telemetry = telemetry_for_tests()
    with ready_client(create_app(app_settings(model), telemetry=telemetry)):
        assert value(telemetry.registry, "glassbox_prediction_reference_texts", source="file") == 15.0


def test_the_reference_shares_are_exported_beside_the_served_ones() -> None:
    _, registry, _ = drift_stats(reference_for((0.25, 0.75)))
    assert value(registry, "glassbox_prediction_reference_share", label="negative") == pytest.approx(0.25)
    assert value(registry, "glassbox_prediction_reference_share", label="positive") == pytest.approx(0.75)
    _, without, _ = drift_stats(None)
    assert value(without, "glassbox_prediction_reference_share", label="positive") is None


def test_batches_wait_to_be_counted_together_in_their_own_window_slot() -> None:
    """on_batch keeps a batch's logits until its window slot ends or a scrape comes, then counts them all at once:
    the totals miss nothing, and the texts land in the slot they were answered in, not the one of the scrape."""
    predictions, registry, clock = drift_stats(reference_for((0.4, 0.6)))
    for _ in range(10):  # 400 texts, all of one label, in one slot
        predictions.on_batch(batch(mix(40, (1.0, 0.0)), [20] * 40))
    clock.now += 61.0  # their slot leaves the window before anything looked
    assert value(registry, "glassbox_predictions_total", label="negative") == 400.0
    assert drift(registry) is None  # not counted into the window as if answered now
    serve(predictions, clock, (1.0, 0.0), seconds=8, per_second=50)  # across a slot's end: counted as it ends
    assert value(registry, "glassbox_predictions_total", label="negative") == 800.0
    assert drift(registry) > 0.25  # type: ignore[operator]
