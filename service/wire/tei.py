"""`POST /predict`: Hugging Face text-embeddings-inference's classification route, so TEI clients work unchanged.

Request (as TEI's router reads it): `{"inputs": ..., "truncate": bool | null, "truncation_direction":
"Right" | "Left", "raw_scores": bool}`, unknown fields ignored (serde's default, which clients rely on:
huggingface_hub sends a `parameters` object TEI never reads). `inputs` is, exactly as in TEI:

- `"text"` or `["text"]`: one text; the response is one list of `{"score", "label"}`;
- `["first", "second"]`: a *pair* (cross-encoder input), not a batch of two;
- `[["text"], ["first", "second"], ...]`: a batch of singles and pairs; the response is one list per input.

Where glassbox differs from TEI: pairs are refused (`pairs_unsupported`, 400; our models classify single
texts); `truncation_direction` "Left" is refused (`truncation_direction_unsupported`, 400; the tokenizer keeps
the start of a text); an empty list answers 422 `empty_input` and a batch over the limit 413 `too_many_texts`
(TEI: 422 and 413); error bodies are glassbox's `{"error": {"code", "message"}}`, not TEI's
`{"error", "error_type"}`. Scores are probabilities (softmax; a sigmoid for a one-logit head, as TEI) or,
with `raw_scores`, the logits; every label is listed, highest score first, as TEI does.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from service.errors import InvalidRequestError
from service.wire.common import ClassifyRequest, ClassifyResult, check_count, decode_json, ranked

_SHAPES = 'a string, a one-string list ["text"] or a batch [["text"], ["text"], ...]'


class PairInputError(InvalidRequestError):
    code = "pairs_unsupported"


class TruncationDirectionError(InvalidRequestError):
    code = "truncation_direction_unsupported"


class PredictBody(msgspec.Struct, frozen=True):
    inputs: str | list[Any]
    truncate: bool | None = None
    truncation_direction: str = "Right"
    raw_scores: bool = False


class Prediction(msgspec.Struct, frozen=True):
    score: float  # TEI puts score before label
    label: str


def _pair_error(where: str) -> PairInputError:
    return PairInputError(f"{where} is a pair of texts; this server classifies single texts only. Send {_SHAPES}")


def _texts_of(inputs: str | list[Any], max_texts: int) -> tuple[tuple[str, ...], bool]:
    """TEI's `inputs` -> (texts, single). The first element decides, as in TEI: a string means one input."""
    if isinstance(inputs, str):
        return (inputs,), True
    if not inputs:
        check_count(0, max_texts, "inputs")
    first = inputs[0]
    if isinstance(first, str):
        if not all(isinstance(item, str) for item in inputs):
            raise InvalidRequestError(f"inputs mixes strings with other values; send {_SHAPES}")
        if len(inputs) == 2:
            raise _pair_error("inputs")
        if len(inputs) > 2:
            raise InvalidRequestError(
                f"inputs is a list of {len(inputs)} strings; a batch is a list of one-string lists "
                '[["text"], ["text"], ...]'
            )
        return (first,), True
    check_count(len(inputs), max_texts, "inputs")
    texts: list[str] = []
    for index, item in enumerate(inputs):
        if not isinstance(item, list) or not all(isinstance(part, str) for part in item):
            raise InvalidRequestError(f"inputs[{index}] is not a list of strings; send {_SHAPES}")
        if len(item) == 2:
            raise _pair_error(f"inputs[{index}]")
        if len(item) != 1:
            raise InvalidRequestError(f"inputs[{index}] holds {len(item)} strings; each batch entry holds one")
        texts.append(item[0])
    return tuple(texts), False


def decode(body: bytes | bytearray | memoryview, *, max_texts: int) -> ClassifyRequest:
    parsed = decode_json(body, PredictBody)
    direction = parsed.truncation_direction
    if direction.lower() == "left":
        raise TruncationDirectionError('truncation_direction "Left" is not supported: texts are cut at the end')
    if direction.lower() != "right":
        raise InvalidRequestError(f'truncation_direction must be "Right" or "Left", got {direction[:40]!r}')
    texts, single = _texts_of(parsed.inputs, max_texts)
    return ClassifyRequest(texts=texts, raw_scores=parsed.raw_scores, truncate=parsed.truncate, single=single)


def encode(result: ClassifyResult, request: ClassifyRequest) -> bytes:
    """All labels per text, highest score first: one list for a single input, a list of lists for a batch."""
    scores = result.logits if request.raw_scores else result.probs  # [n, L]
    order = ranked(scores, scores.shape[1])  # [n, L]
    labels = result.labels
    sorted_scores = np.take_along_axis(scores, order, axis=1).tolist()
    rows = [
        [Prediction(score=s, label=labels[j]) for j, s in zip(order_row, score_row, strict=True)]
        for order_row, score_row in zip(order.tolist(), sorted_scores, strict=True)
    ]
    if request.single:
        return msgspec.json.encode(rows[0])
    return msgspec.json.encode(rows)
