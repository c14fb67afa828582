"""`POST /v1/classify` with a JSON body: `{"text": str}` or `{"texts": [str, ...]}`, text pairs with `"text_pair"` /
`"text_pairs"`, plus `top_k`, `all_scores` and `threshold`.

Unknown fields are refused (`invalid_request`): a misspelt option such as `"topk"` would otherwise be ignored
silently and the client would never learn why it got one score. What a result lists depends on the model's head:

- single-label: `label` and `score` (its probability); `scores` (best first) when `top_k`, `all_scores` or
  `threshold` ask: `top_k` keeps the k best (clamped to the label count), `threshold` drops labels scoring less;
- multi-label: `label` and `score` are the best label and its sigmoid, and `scores` always lists every label with
  its own sigmoid, best first, cut by `threshold` and `top_k` when given;
- regression: `score` is the number the model outputs, with no label; the options are refused.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import numpy as np

from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import InvalidRequestError
from glassbox.service.types import ProblemType
from glassbox.service.wire.common import TOP_K_MAX, ScoreOptions, check_count, check_options, decode_json, ranked


class ClassifyBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    text: str | msgspec.UnsetType = msgspec.UNSET
    texts: list[str] | msgspec.UnsetType = msgspec.UNSET
    text_pair: str | msgspec.UnsetType = msgspec.UNSET  # with "text": the second text of a pair
    text_pairs: list[str | None] | msgspec.UnsetType = msgspec.UNSET  # with "texts": one second text (or null) each
    # JSON Schema counts 2.0 as an integer, so the OpenAPI document would too; accept it, refuse 2.5 below.
    top_k: (
        Annotated[int, msgspec.Meta(ge=1, le=TOP_K_MAX)] | Annotated[float, msgspec.Meta(ge=1, le=TOP_K_MAX)] | None
    ) = None
    all_scores: bool | msgspec.UnsetType = msgspec.UNSET
    threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None


class LabelScore(msgspec.Struct, frozen=True):
    label: str
    score: float


class TextResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One text's result."""

    label: Annotated[str | None, msgspec.Meta(description="absent for a regression model")] = None
    score: Annotated[float, msgspec.Meta(
        description="the score of `label` (probability, or sigmoid for multi-label), or a regression model's number")]
    scores: Annotated[list[LabelScore] | None, msgspec.Meta(
        description="best first; with top_k, all_scores or threshold, and always for a multi-label model")] = None
    tokens: Annotated[int, msgspec.Meta(ge=0)]
    truncated: bool


class ClassifyResponse(msgspec.Struct):
    """One result per text, in the order sent."""

    model: str
    results: list[TextResult]


def _pairs(parsed: ClassifyBody, count: int) -> tuple[str | None, ...] | None:
    if isinstance(parsed.text_pair, str):
        if not isinstance(parsed.text, str):
            raise InvalidRequestError('"text_pair" goes with "text"; with "texts" send "text_pairs"')
        return (parsed.text_pair,)
    if isinstance(parsed.text_pairs, list):
        if not isinstance(parsed.texts, list):
            raise InvalidRequestError('"text_pairs" goes with "texts"; with "text" send "text_pair"')
        if len(parsed.text_pairs) != count:
            raise InvalidRequestError(f'"text_pairs" has {len(parsed.text_pairs)} entries for {count} texts; send one '
                                      "second text (or null) per text")
        return tuple(parsed.text_pairs)
    return None


def decode(
    body: bytes | bytearray | memoryview, *, max_texts: int, options: ScoreOptions | None = None,
    problem: ProblemType = "single_label_classification",
) -> ClassifyRequest:
    """JSON body -> ClassifyRequest. `options` (from the query string) are defaults the body's own fields override."""
    parsed = decode_json(body, ClassifyBody)
    if isinstance(parsed.text, str) == isinstance(parsed.texts, list):
        raise InvalidRequestError('send exactly one of "text" (a string) or "texts" (a list of strings)')
    texts = (parsed.text,) if isinstance(parsed.text, str) else tuple(parsed.texts or ())
    check_count(len(texts), max_texts)
    top_k = parsed.top_k
    if isinstance(top_k, float):
        if not top_k.is_integer():
            raise InvalidRequestError(f"top_k must be a whole number, got {top_k}")
        top_k = int(top_k)
    defaults = options or ScoreOptions()
    return check_options(ClassifyRequest(
        texts=texts,
        pairs=_pairs(parsed, len(texts)),
        top_k=top_k if top_k is not None else defaults.top_k,
        all_scores=parsed.all_scores if isinstance(parsed.all_scores, bool) else defaults.all_scores,
        threshold=parsed.threshold if parsed.threshold is not None else defaults.threshold,
    ), problem)


def score_count(request: ClassifyRequest, num_labels: int, problem: ProblemType) -> int:
    """How many (label, score) pairs each result lists before the threshold: 0 means the `scores` field is left out."""
    if problem == "regression":
        return 0
    if request.top_k is not None:
        return min(request.top_k, num_labels)
    listed = request.all_scores or request.threshold is not None or problem == "multi_label_classification"
    return num_labels if listed else 0


def text_results(result: ClassifyResult, request: ClassifyRequest) -> list[TextResult]:
    """One TextResult per row of `result`. Shared by the JSON and the frames responses."""
    probs = result.probs  # [n, L]
    n = result.size
    tokens = result.tokens.tolist()
    truncated = result.truncated.tolist()
    if result.problem == "regression":
        values = probs[:, 0].tolist() if n else []
        return [TextResult(score=values[i], tokens=tokens[i], truncated=truncated[i]) for i in range(n)]
    rows = np.arange(n)
    best = probs.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)  # [n]
    # One tolist() per array: converting numpy scalars one at a time costs more than the rest of encoding.
    best_index = best.tolist()
    best_score = probs[rows, best].tolist()
    labels = result.labels
    k = score_count(request, len(labels), result.problem)
    if k == 0:
        return [
            TextResult(label=labels[best_index[i]], score=best_score[i], tokens=tokens[i], truncated=truncated[i])
            for i in range(n)
        ]
    order = ranked(probs, k)  # [n, k]
    sorted_scores = np.take_along_axis(probs, order, axis=1).tolist()
    order_list = order.tolist()
    floor = request.threshold if request.threshold is not None else -np.inf
    return [
        TextResult(
            label=labels[best_index[i]],
            score=best_score[i],
            scores=[LabelScore(labels[j], s)
                    for j, s in zip(order_list[i], sorted_scores[i], strict=True) if s >= floor],
            tokens=tokens[i],
            truncated=truncated[i],
        )
        for i in range(n)
    ]


def encode(result: ClassifyResult, request: ClassifyRequest, model_name: str) -> bytes:
    return msgspec.json.encode(ClassifyResponse(model=model_name, results=text_results(result, request)))
