"""`POST /v1/classify` with a JSON body: `{"text": str}` or `{"texts": [str, ...]}`, plus `top_k` and `all_scores`.

Unknown fields are refused (`invalid_request`): a misspelt option such as `"topk"` would otherwise be ignored
silently and the client would never learn why it got one score. `top_k` lists the k best labels (clamped to
the label count) and wins over `all_scores`, which lists every label; both sort by probability, highest first.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import numpy as np

from service.errors import InvalidRequestError
from service.wire.common import (
    TOP_K_MAX,
    ClassifyRequest,
    ClassifyResult,
    ScoreOptions,
    check_count,
    decode_json,
    ranked,
)


class ClassifyBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    text: str | msgspec.UnsetType = msgspec.UNSET
    texts: list[str] | msgspec.UnsetType = msgspec.UNSET
    # JSON Schema counts 2.0 as an integer, so the OpenAPI document would too; accept it, refuse 2.5 below.
    top_k: (
        Annotated[int, msgspec.Meta(ge=1, le=TOP_K_MAX)] | Annotated[float, msgspec.Meta(ge=1, le=TOP_K_MAX)] | None
    ) = None
    all_scores: bool | msgspec.UnsetType = msgspec.UNSET


class LabelScore(msgspec.Struct, frozen=True):
    label: str
    score: float


class TextResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    label: str
    score: float  # probability of `label`
    scores: list[LabelScore] | None = None  # only when top_k or all_scores asked for them
    tokens: int
    truncated: bool


class ClassifyResponse(msgspec.Struct):
    model: str
    results: list[TextResult]


def decode(
    body: bytes | bytearray | memoryview, *, max_texts: int, options: ScoreOptions | None = None
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
    return ClassifyRequest(
        texts=texts,
        top_k=top_k if top_k is not None else defaults.top_k,
        all_scores=parsed.all_scores if isinstance(parsed.all_scores, bool) else defaults.all_scores,
    )


def score_count(request: ClassifyRequest, num_labels: int) -> int:
    """How many (label, score) pairs each result lists: 0 means the `scores` field is left out."""
    if request.top_k is not None:
        return min(request.top_k, num_labels)
    return num_labels if request.all_scores else 0


def text_results(result: ClassifyResult, request: ClassifyRequest) -> list[TextResult]:
    """One TextResult per row of `result`. Shared by the JSON and the frames responses."""
    probs = result.probs  # [n, L]
    n = result.size
    rows = np.arange(n)
    best = probs.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)  # [n]
    # One tolist() per array: converting numpy scalars one at a time costs more than the rest of encoding.
    best_index = best.tolist()
    best_score = probs[rows, best].tolist()
    tokens = result.tokens.tolist()
    truncated = result.truncated.tolist()
    labels = result.labels
    k = score_count(request, len(labels))
    if k == 0:
        return [
            TextResult(label=labels[best_index[i]], score=best_score[i], tokens=tokens[i], truncated=truncated[i])
            for i in range(n)
        ]
    order = ranked(probs, k)  # [n, k]
    sorted_scores = np.take_along_axis(probs, order, axis=1).tolist()
    order_list = order.tolist()
    return [
        TextResult(
            label=labels[best_index[i]],
            score=best_score[i],
            scores=[LabelScore(labels[j], s) for j, s in zip(order_list[i], sorted_scores[i], strict=True)],
            tokens=tokens[i],
            truncated=truncated[i],
        )
        for i in range(n)
    ]


def encode(result: ClassifyResult, request: ClassifyRequest, model_name: str) -> bytes:
    return msgspec.json.encode(ClassifyResponse(model=model_name, results=text_results(result, request)))
