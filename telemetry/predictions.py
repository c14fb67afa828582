"""What the model answered, counted per batch from the batch's logits: the predicted labels, the confidence of each
answer, a regression head's outputs and the length of each text, as Prometheus families read at scrape time.

The batcher hands each batch's record, its logits and its rows' lengths with it, to the observers on the event loop,
after the answers went out (service/batching/batcher.py). Everything here is a handful of numpy calls per batch,
whatever its size: softmax or sigmoid over the whole array, one argmax, and a bincount per family into arrays that
a scrape reads. Nothing runs per text in Python, and nothing at all on a request's own path.

A single-label head counts each answer's best label (argmax, as the answer gives it; a one-output head's only label,
its score the sigmoid), a multi-label head each label it scores at 0.5 or more (none, for an answer that scores all
below). Models with more than PREDICTION_LABELS labels count the rest under `other`, so the series stay bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric

from service.classification import probabilities
from service.observer import BatchRecord
from service.types import ProblemType
from telemetry.metrics import (
    INPUT_TOKEN_BUCKETS,
    OTHER,
    PREDICTION_LABELS,
    PREDICTION_SCORE_BUCKETS,
    REGRESSION_BUCKETS,
    PredictionFamilies,
    ScrapeFamily,
)

MULTI_LABEL_THRESHOLD = 0.5


class _Histogram:
    """Bucket counts (non-cumulative, +Inf last) and the sum, added to a batch at a time."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.sum = 0.0

    def add(self, values: Any) -> None:
        values = np.asarray(values, dtype=np.float64)
        # searchsorted(side="left") puts v in the first bucket whose bound is >= v: Prometheus's `le`.
        self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
        self.sum += float(values.sum())

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        cumulative = np.cumsum(self.counts)
        buckets = [(_le(bound), float(count)) for bound, count in zip(self.bounds.tolist(), cumulative[:-1].tolist(),
                                                                       strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        return buckets, self.sum


class PredictionStats:
    """An observer (`on_batch`) and a collector (`collect`) at once. Counts nothing until `configure` names the
    model's labels and head; the families appear from then on, every label's series at 0."""

    def __init__(self, families: PredictionFamilies) -> None:
        self._f = families
        self._lock = threading.Lock()
        self._labels: tuple[str, ...] = ()
        self._problem: ProblemType | None = None
        self._predicted = np.zeros(0, dtype=np.int64)
        self._score = _Histogram(PREDICTION_SCORE_BUCKETS)
        self._regression = _Histogram(REGRESSION_BUCKETS)
        self._tokens = _Histogram(INPUT_TOKEN_BUCKETS)

    def configure(self, labels: Sequence[str], problem: ProblemType) -> None:
        named = tuple(label[:128] for label in labels[:PREDICTION_LABELS])
        if len(labels) > PREDICTION_LABELS:
            named += (OTHER,)
        with self._lock:
            self._labels, self._problem = named, problem
            self._predicted = np.zeros(len(named), dtype=np.int64)

    # -- the observer ----------------------------------------------------------------------------------------------
    def on_batch(self, record: BatchRecord) -> None:
        logits, problem = record.logits, self._problem
        if logits is None or not problem or logits.ndim != 2 or not logits.shape[0]:
            return
        predicted = top = None
        if problem == "regression":
            outputs = logits[:, 0]  # [rows]
        else:
            probs = probabilities(logits, problem)  # [rows, labels]
            top = probs.max(axis=1)  # [rows]
            labels = probs.shape[1]
            if problem == "multi_label_classification":
                per_label = (probs >= MULTI_LABEL_THRESHOLD).sum(axis=0)  # [labels]
            else:
                per_label = np.bincount(probs.argmax(axis=1), minlength=labels)  # [labels]
            predicted = _fold(per_label, len(self._predicted))
        with self._lock:
            if problem == "regression":
                self._regression.add(outputs)
            elif predicted is not None and len(predicted) == len(self._predicted):
                self._predicted += predicted
                self._score.add(top)
            if record.lengths is not None:
                self._tokens.add(record.lengths)

    # -- the collector ---------------------------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        f = self._f
        for family in (f.predictions, f.score, f.regression, f.input_tokens):
            yield family.describe()

    def collect(self) -> Iterator[Metric]:
        f = self._f
        with self._lock:
            problem, labels, predicted = self._problem, self._labels, self._predicted.tolist()
            score, regression, tokens = self._score.samples(), self._regression.samples(), self._tokens.samples()
        if not problem:
            return
        if problem == "regression":
            yield _histogram(f.regression, *regression)
        else:
            counts = f.predictions.new()
            for label, count in zip(labels, predicted, strict=True):
                counts.add_metric([label], float(count))
            yield counts
            yield _histogram(f.score, *score)
        yield _histogram(f.input_tokens, *tokens)


def _fold(per_label: Any, slots: int) -> Any:
    """Counts per label folded into `slots` (the last one `other` when the model has more labels than slots)."""
    if len(per_label) <= slots:
        return per_label
    return np.concatenate([per_label[:slots - 1], [per_label[slots - 1:].sum()]])


def _histogram(family: ScrapeFamily, buckets: list[tuple[str, float]], total: float) -> Metric:
    metric = family.new_histogram()
    metric.add_metric([], buckets, total)
    return metric


def _le(bound: float) -> str:
    return repr(float(bound))
