"""The core of the classify path: what a request asks (`ClassifyRequest`), what the model answered
(`ClassifyResult`), and how logits become the scores answers carry (softmax, sigmoid, `probabilities`).

Every wire format decodes into a ClassifyRequest and encodes from a ClassifyResult, and the pipeline
(service/pipeline.py) runs one into the other; none of them is a wire format's own, so they live here, beside the
pipeline, and `glassbox.service.wire` imports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from glassbox.service.types import BoolArray, FloatArray, IntArray, ProblemType


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    texts: tuple[str, ...]
    user_ids: tuple[int, ...] | None = None  # frames only, one per text
    top_k: int | None = None  # None: best label only (plus every score when all_scores)
    all_scores: bool = False
    threshold: float | None = None  # list only labels scoring at least this much
    pairs: tuple[str | None, ...] | None = None  # the second text of each input (None: a single text); None: no pairs
    raw_scores: bool = False  # TEI: logits instead of probabilities
    truncate: bool | None = None  # TEI: per-request override; None = the server's oversize setting
    request_id: str | None = None  # KServe "id", echoed in the response
    single: bool = False  # TEI: the input was one bare text, so the response is one list, not a list per text


@dataclass(frozen=True, slots=True)
class ClassifyResult:
    """Row i belongs to request text i."""

    labels: tuple[str, ...]  # id2label, in logit order
    logits: FloatArray  # [n, L] float32
    probs: FloatArray  # [n, L] float32, from `probabilities(logits, problem)`: the scores answers carry
    truncated: BoolArray  # [n] bool
    tokens: IntArray  # [n] int64 token counts, special tokens included
    problem: ProblemType = "single_label_classification"

    @classmethod
    def from_logits(
        cls, labels: tuple[str, ...], logits: FloatArray, truncated: BoolArray, tokens: IntArray,
        problem: ProblemType = "single_label_classification",
    ) -> ClassifyResult:
        return cls(labels=labels, logits=logits, probs=probabilities(logits, problem), truncated=truncated,
                   tokens=tokens, problem=problem)

    @property
    def size(self) -> int:
        return int(self.logits.shape[0])


def softmax(logits: npt.ArrayLike) -> FloatArray:
    """Softmax over the last axis, in float32; subtracting the row maximum keeps exp() from overflowing."""
    values = np.asarray(logits, dtype=np.float32)  # [n, L]
    if values.size == 0:
        return values.copy()
    shifted = values - values.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    probs: FloatArray = (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32, copy=False)
    return probs


def sigmoid(logits: npt.ArrayLike) -> FloatArray:
    values = np.asarray(logits, dtype=np.float32)
    # The tanh form never overflows, unlike 1 / (1 + exp(-x)) for very negative x.
    probs: FloatArray = (0.5 * (1.0 + np.tanh(0.5 * values))).astype(np.float32, copy=False)
    return probs


def probabilities(logits: npt.ArrayLike, problem: ProblemType = "single_label_classification") -> FloatArray:
    """The scores of a head, as the transformers text-classification pipeline computes them: softmax over labels for
    a single-label head (a sigmoid when it has one output: a softmax of one logit is always 1; TEI does the same),
    one independent sigmoid per label for a multi-label head, and the raw number for a regression head."""
    values = np.asarray(logits, dtype=np.float32)  # [n, L]
    if problem == "regression":
        return values.copy()
    if problem == "multi_label_classification" or (values.ndim == 2 and values.shape[1] == 1):
        return sigmoid(values)
    return softmax(values)
