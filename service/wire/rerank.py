"""`POST /rerank`: TEI's reranking route, for cross-encoders (a head with one output).

Request: `{"query": str, "texts": [str, ...], "truncate": bool | null, "truncation_direction": "Right",
"raw_scores": bool, "return_text": bool}`, unknown fields ignored as TEI's serde does. Each text is scored as the
pair (query, text). Response: `[{"index", "text"?, "score"}, ...]`, highest score first (ties keep input order):
the sigmoid of the logit (the raw number for a regression head), or the logit with `raw_scores`; `text` only with
`return_text`. A model with more than one output is no reranker: 424 `not_a_reranker`, as TEI answers.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import numpy as np

from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import NotARerankerError
from glassbox.service.wire.common import check_count, decode_json
from glassbox.service.wire.tei import check_direction


class RerankBody(msgspec.Struct, frozen=True):
    query: str
    texts: list[str]
    truncate: bool | None = None
    truncation_direction: str = "Right"
    raw_scores: bool = False
    return_text: bool = False


class Rank(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One text's rank, as TEI answers /rerank."""

    index: Annotated[int, msgspec.Meta(ge=0)]
    text: Annotated[str | None, msgspec.Meta(description="with return_text")] = None
    score: float


def check_reranker(labels: tuple[str, ...]) -> None:
    if len(labels) != 1:
        raise NotARerankerError(
            f"this model has {len(labels)} outputs ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''}); "
            "a reranker (cross-encoder) has one score per pair: classify pairs on /predict or /v1/classify instead"
        )


def decode(body: bytes | bytearray | memoryview, *, max_texts: int) -> tuple[ClassifyRequest, bool]:
    """-> (one (query, text) pair per text, whether the answer repeats the texts)."""
    parsed = decode_json(body, RerankBody)
    check_direction(parsed.truncation_direction)
    check_count(len(parsed.texts), max_texts)
    texts = tuple(parsed.texts)
    request = ClassifyRequest(texts=(parsed.query,) * len(texts), pairs=texts, raw_scores=parsed.raw_scores,
                              truncate=parsed.truncate)
    return request, parsed.return_text


def encode(result: ClassifyResult, request: ClassifyRequest, return_text: bool) -> bytes:
    scores = (result.logits if request.raw_scores else result.probs)[:, 0]  # [n]
    order = np.argsort(-scores, kind="stable").tolist()
    values = scores.tolist()
    documents = request.pairs or ()
    ranks = [Rank(index=i, text=documents[i] if return_text else None, score=values[i]) for i in order]
    return msgspec.json.encode(ranks)
