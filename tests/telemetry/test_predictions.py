"""telemetry/predictions.py: what the model answered, counted per batch from its logits, read at scrape time; and the
same families through the real app, where they add up to the answers clients got."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from service.app import create_app
from service.classification import softmax
from service.observer import BatchRecord
from service.types import EngineTiming, ProblemType
from telemetry import build_metrics
from telemetry.metrics import PREDICTION_LABELS, PREDICTION_SCORE_BUCKETS
from telemetry.predictions import PredictionStats
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
