"""What the model answered, counted per batch from the batch's logits: the predicted labels, the confidence of each
answer, a regression head's outputs and the length of each text, as Prometheus families read at scrape time; and
how far the last minute's answers are from the model's reference (drift).

The batcher hands each batch's record, its logits and its rows' lengths with it, to the observers on the event loop,
after the answers went out (service/batching/handback.py). Everything here is a handful of numpy calls per batch,
whatever its size (glassbox.service.model.reference.count): softmax or sigmoid over the whole array, one argmax, a
bincount per distribution. Nothing runs per text in Python, and nothing at all on a request's own path.

A single-label head counts each answer's best label (argmax, as the answer gives it; a one-output head's only label,
its score the sigmoid), a multi-label head each label it scores at 0.5 or more (none, for an answer that scores all
below). Models with more than PREDICTION_LABELS labels count the rest under `other`, so the series stay bounded.

Drift: the answers also go into WINDOW_SLOTS slots that together span the window (--drift-window-s, a minute by
default); at a scrape the slots of the last window are added up and compared with the reference, distribution by
distribution, as a population stability index (glassbox.service.model.reference.psi). Below MIN_DRIFT_TEXTS texts in the
window there is no figure: a few answers say nothing about a distribution. The reference is the model directory's
reference.json; a model without one takes it from the first REFERENCE_FROM_TRAFFIC texts it serves (said in a log
line).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric

from glassbox.service.model.reference import (
    LENGTH_BOUNDS,
    REGRESSION_BOUNDS,
    SCORE_BOUNDS,
    Counted,
    Reference,
    count,
    psi,
)
from glassbox.service.observer import BatchRecord
from glassbox.service.types import ProblemType
from glassbox.telemetry.metrics import OTHER, PREDICTION_LABELS, PredictionFamilies, ScrapeFamily

log = logging.getLogger("glassbox.telemetry")

WINDOW_S = 60.0  # the drift window's default (--drift-window-s)
WINDOW_SLOTS = 12  # the window is kept in this many slots; it moves a slot at a time
MIN_DRIFT_TEXTS = 300
REFERENCE_FROM_TRAFFIC = 1000
PENDING_ROWS = 4096  # batches wait to be counted until this many rows at most (a slot's end or a scrape comes first)


class _Histogram:
    """Bucket counts (non-cumulative, +Inf last) and the sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.sum = 0.0

    def add(self, counts: Any, values: Any) -> None:
        self.counts += counts
        self.sum += float(np.sum(values))

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        cumulative = np.cumsum(self.counts).tolist()
        buckets = [(repr(float(bound)), float(total)) for bound, total in zip(self.bounds, cumulative[:-1],
                                                                              strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        return buckets, self.sum


class _Window:
    """Counts per distribution in time slots; `total` adds up the slots of the last WINDOW_S seconds."""

    def __init__(self, sizes: dict[str, int], clock: Callable[[], float], window_s: float) -> None:
        self._clock = clock
        self._slot_s = window_s / WINDOW_SLOTS
        self._slots = {name: np.zeros((WINDOW_SLOTS, size), dtype=np.int64) for name, size in sizes.items()}
        self._epochs = np.full(WINDOW_SLOTS, -1, dtype=np.int64)  # which slot-long stretch of time each slot holds

    def epoch(self) -> int:
        """The slot-long stretch of time now."""
        return int(self._clock() // self._slot_s)

    def add(self, counts: dict[str, Any], epoch: int | None = None) -> None:
        """Add `counts` to the slot of `epoch` (default: now); one that has left the window is dropped."""
        now = self.epoch()
        epoch = now if epoch is None else epoch
        if epoch <= now - WINDOW_SLOTS:
            return
        slot = epoch % WINDOW_SLOTS
        if self._epochs[slot] != epoch:  # a stretch that left the window: start the slot afresh
            self._epochs[slot] = epoch
            for slots in self._slots.values():
                slots[slot] = 0
        for name, values in counts.items():
            if name in self._slots:
                self._slots[name][slot] += values

    def total(self) -> dict[str, Any]:
        epoch = int(self._clock() // self._slot_s)
        live = (self._epochs > epoch - WINDOW_SLOTS) & (self._epochs >= 0)
        return {name: slots[live].sum(axis=0) for name, slots in self._slots.items()}


class PredictionStats:
    """An observer (`on_batch`) and a collector (`collect`) at once. Counts nothing until `configure` names the
    model's labels and head; the families appear from then on, every label's series at 0."""

    def __init__(self, families: PredictionFamilies, clock: Callable[[], float] = time.monotonic,
                 window_s: float = WINDOW_S) -> None:
        self._f = families
        self._clock = clock
        self._window_s = window_s
        self._lock = threading.Lock()
        self._labels: tuple[str, ...] = ()
        self._problem: ProblemType | None = None
        self._predicted = np.zeros(0, dtype=np.int64)
        self._score = _Histogram(SCORE_BOUNDS)
        self._regression = _Histogram(REGRESSION_BOUNDS)
        self._tokens = _Histogram(LENGTH_BOUNDS)
        self._window: _Window | None = None
        self._pending: list[tuple[Any, Any]] = []  # (logits, lengths) of batches not counted yet, one window slot's
        self._pending_rows = 0
        self._pending_epoch = 0
        self._reference: dict[str, Any] = {}  # distribution -> reference counts
        self._reference_source = ""  # "file" | "traffic"
        self._reference_texts = 0
        self._forming: dict[str, Any] | None = None  # the traffic reference, while it is being counted
        self._forming_texts = 0

    def configure(self, labels: Sequence[str], problem: ProblemType, reference: Reference | None = None) -> str:
        """The model's labels (in logit order) and head, and its reference (None: take one from traffic). Returns
        why a reference was not used (it names other labels or another head), or ""."""
        refused = ""
        if reference is not None and (reference.problem != problem or reference.labels != tuple(labels)):
            refused = (f"its reference ({reference.source}) was counted for a {reference.problem} head labelled "
                       f"{', '.join(reference.labels)}, not this one")
            reference = None
        named = tuple(label[:128] for label in labels[:PREDICTION_LABELS])
        if len(labels) > PREDICTION_LABELS:
            named += (OTHER,)
        sizes = {"length": len(LENGTH_BOUNDS) + 1}
        if problem == "regression":
            sizes["output"] = len(REGRESSION_BOUNDS) + 1
        else:
            sizes |= {"labels": len(named), "score": len(SCORE_BOUNDS) + 1}
        with self._lock:
            self._pending, self._pending_rows = [], 0  # counted for another head, if any: dropped
            self._labels, self._problem = named, problem
            self._predicted = np.zeros(len(named), dtype=np.int64)
            self._window = _Window(sizes, self._clock, self._window_s)
            if reference is not None:
                self._reference = {name: self._fold(np.asarray(values, dtype=np.int64)) if name == "labels" else
                                   np.asarray(values, dtype=np.int64)
                                   for name, values in reference.distributions.items() if name in sizes}
                self._reference_source, self._reference_texts = "file", reference.texts
                self._forming = None
            else:
                self._reference, self._reference_source, self._reference_texts = {}, "traffic", 0
                self._forming = {name: np.zeros(size, dtype=np.int64) for name, size in sizes.items()}
                self._forming_texts = 0
        return refused

    # -- the observer ----------------------------------------------------------------------------------------------
    def on_batch(self, record: BatchRecord) -> None:
        """Keep the batch's logits (a reference, no copy) until its window slot ends, a scrape comes or PENDING_ROWS
        are waiting: the counting then runs once over all of them, a few numpy calls whatever the number of batches,
        instead of ~25 us of fixed cost for each small batch on the event loop."""
        logits, problem = record.logits, self._problem
        if logits is None or problem is None or logits.ndim != 2 or not logits.shape[0]:
            return
        done = False
        with self._lock:
            window = self._window
            if window is None:
                return
            epoch = window.epoch()
            if self._pending and (epoch != self._pending_epoch or logits.shape[1] != self._pending[0][0].shape[1]):
                done = self._count_pending()
            self._pending.append((logits, record.lengths))
            self._pending_epoch = epoch
            self._pending_rows += int(logits.shape[0])
            if self._pending_rows >= PENDING_ROWS:
                done = self._count_pending() or done
        if done:
            self._said_reference()

    def _said_reference(self) -> None:
        log.info("drift reference taken from the first %d texts served (the model directory has no "
                 "reference.json: `glassbox model reference` writes one)", self._reference_texts)

    def _count_pending(self) -> bool:
        """Under the lock: count the waiting batches into the totals and their window slot; True when that completed
        the traffic reference."""
        pending, problem, window = self._pending, self._problem, self._window
        self._pending, self._pending_rows = [], 0
        if not pending or problem is None or window is None:
            return False
        logits = pending[0][0] if len(pending) == 1 else np.concatenate([batch for batch, _ in pending])
        known = [lengths for _, lengths in pending if lengths is not None]
        lengths = None if not known else known[0] if len(known) == 1 else np.concatenate(known)
        counted = count(logits, lengths, problem)
        binned = self._binned(counted, problem, lengths is not None)
        if problem == "regression":
            self._regression.add(counted.outputs, counted.top)
        elif len(binned["labels"]) == len(self._predicted):
            self._predicted += binned["labels"]
            self._score.add(counted.score, counted.top)
        if lengths is not None:
            self._tokens.add(counted.length, lengths)
        window.add(binned, self._pending_epoch)
        return self._take_reference(binned, int(logits.shape[0]))

    def _binned(self, counted: Counted, problem: ProblemType, has_lengths: bool) -> dict[str, Any]:
        binned: dict[str, Any] = {}
        if has_lengths:
            binned["length"] = counted.length
        if problem == "regression":
            binned["output"] = counted.outputs
        else:
            binned["labels"] = self._fold(counted.labels)
            binned["score"] = counted.score
        return binned

    def _take_reference(self, binned: dict[str, Any], rows: int) -> bool:
        """Under the lock: count the first texts served into the traffic reference; True when it is complete."""
        forming = self._forming
        if forming is None:
            return False
        for name, values in binned.items():
            forming[name] += values
        self._forming_texts += rows
        if self._forming_texts < REFERENCE_FROM_TRAFFIC:
            return False
        self._reference, self._reference_texts, self._forming = forming, self._forming_texts, None
        return True

    def _fold(self, per_label: Any) -> Any:
        """Counts per label folded into the exported labels (the last one `other` when the model has more)."""
        slots = len(self._labels)
        if len(per_label) <= slots:
            return per_label
        return np.concatenate([per_label[:slots - 1], [per_label[slots - 1:].sum()]])

    # -- the collector ---------------------------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        f = self._f
        for family in (f.predictions, f.score, f.regression, f.input_tokens, f.drift, f.reference_texts,
                       f.reference_share):
            yield family.describe()

    def collect(self) -> Iterator[Metric]:
        f = self._f
        with self._lock:
            done = self._count_pending()  # what waits is counted before it is shown
            problem, labels, predicted = self._problem, self._labels, self._predicted.tolist()
            score, regression, tokens = self._score.samples(), self._regression.samples(), self._tokens.samples()
            window = self._window.total() if self._window is not None else {}
            reference = dict(self._reference)
            source, reference_texts = self._reference_source, self._reference_texts
        if done:
            self._said_reference()
        if problem is None:
            return
        if problem == "regression":
            yield _histogram(f.regression, *regression)
        else:
            counts = f.predictions.new()
            for label, total in zip(labels, predicted, strict=True):
                counts.add_metric([label], float(total))
            yield counts
            yield _histogram(f.score, *score)
        yield _histogram(f.input_tokens, *tokens)
        drift = f.drift.new()
        # Texts in the window: a multi-label head's label counts are not texts (an answer has 0 to all labels).
        in_window = int(window["length" if "length" in window else next(iter(window))].sum()) if window else 0
        if problem == "multi_label_classification" and "score" in window:
            in_window = int(window["score"].sum())
        for name, expected in reference.items():
            observed = window.get(name)
            if observed is not None and in_window >= MIN_DRIFT_TEXTS and expected.sum() > 0:
                drift.add_metric([name], psi(observed, expected))
        yield drift
        reference_size = f.reference_texts.new()
        reference_size.add_metric([source], float(reference_texts))
        yield reference_size
        shares = f.reference_share.new()
        expected_labels = reference.get("labels")
        if expected_labels is not None and problem != "regression" and expected_labels.sum() > 0:
            for label, share in zip(labels, (expected_labels / expected_labels.sum()).tolist(), strict=True):
                shares.add_metric([label], share)
        yield shares


def _histogram(family: ScrapeFamily, buckets: list[tuple[str, float]], total: float) -> Metric:
    metric = family.new_histogram()
    metric.add_metric([], buckets, total)
    return metric
