"""`POST /predict`: Hugging Face text-embeddings-inference's classification route, so TEI clients work unchanged.

Request (as TEI's router reads it): `{"inputs": ..., "truncate": bool | null, "truncation_direction":
"Right" | "Left", "raw_scores": bool}`, unknown fields ignored (serde's default, which clients rely on:
huggingface_hub sends a `parameters` object TEI never reads). `inputs` is, exactly as in TEI:

- `"text"` or `["text"]`: one text; the response is one list of `{"score", "label"}`;
- `["first", "second"]`: one *pair* (a cross-encoder's input), not a batch of two; the response is one list;
- `[["text"], ["first", "second"], ...]`: a batch of singles and pairs; the response is one list per input.

Where glassbox differs from TEI: `truncation_direction` "Left" is refused (`truncation_direction_unsupported`, 400;
the tokenizer keeps the start of a text); pairs for a model whose tokenizer cannot join two texts are refused
(`pairs_unsupported`, 400); an empty list answers 422 `empty_input` and a batch over the limit 413
`too_many_texts` (TEI: 422 and 413); error bodies are glassbox's `{"error": {"code", "message"}}`, not TEI's
`{"error", "error_type"}`. Scores are the head's (softmax; a sigmoid for a one-logit or multi-label head; the
number itself for regression) or, with `raw_scores`, the logits; every label is listed, highest score first.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import InvalidRequestError
from glassbox.service.wire.common import check_count, decode_json, ranked

_SHAPES = ('a string, a pair ["text", "second text"], or a batch of singles and pairs '
           '[["text"], ["text", "second text"], ...]')


class TruncationDirectionError(InvalidRequestError):
    code = "truncation_direction_unsupported"


class PredictBody(msgspec.Struct, frozen=True):
    inputs: str | list[Any]
    truncate: bool | None = None
    truncation_direction: str = "Right"
    raw_scores: bool = False


class Prediction(msgspec.Struct, frozen=True):
    """One label's score, as TEI answers /predict."""

    score: float  # TEI puts score before label
    label: str


Inputs = tuple[tuple[str, ...], tuple[str | None, ...]]  # texts, and the second text of each (None: a single text)


def _inputs_of(inputs: str | list[Any], max_texts: int) -> tuple[Inputs, bool]:
    """TEI's `inputs` -> ((texts, second texts), single). The first element decides, as in TEI: a string means one
    input (a text, or a pair of two strings)."""
    if isinstance(inputs, str):
        return ((inputs,), (None,)), True
    if not inputs:
        check_count(0, max_texts, "inputs")
    if isinstance(inputs[0], str):
        if not all(isinstance(item, str) for item in inputs):
            raise InvalidRequestError(f"inputs mixes strings with other values; send {_SHAPES}")
        if len(inputs) > 2:
            raise InvalidRequestError(
                f"inputs is a list of {len(inputs)} strings; one input is a text or a pair of two, and a batch is a "
                'list of lists [["text"], ["text", "second text"], ...]'
            )
        return ((inputs[0],), (inputs[1] if len(inputs) == 2 else None,)), True
    check_count(len(inputs), max_texts, "inputs")
    texts: list[str] = []
    seconds: list[str | None] = []
    for index, item in enumerate(inputs):
        if not isinstance(item, list) or not all(isinstance(part, str) for part in item):
            raise InvalidRequestError(f"inputs[{index}] is not a list of strings; send {_SHAPES}")
        if len(item) not in (1, 2):
            raise InvalidRequestError(f"inputs[{index}] holds {len(item)} strings; each batch entry holds a text "
                                      "or a pair of two")
        texts.append(item[0])
        seconds.append(item[1] if len(item) == 2 else None)
    return (tuple(texts), tuple(seconds)), False


def check_direction(direction: str) -> None:
    if direction.lower() == "left":
        raise TruncationDirectionError('truncation_direction "Left" is not supported: texts are cut at the end')
    if direction.lower() != "right":
        raise InvalidRequestError(f'truncation_direction must be "Right" or "Left", got {direction[:40]!r}')


def decode(body: bytes | bytearray | memoryview, *, max_texts: int) -> ClassifyRequest:
    parsed = decode_json(body, PredictBody)
    check_direction(parsed.truncation_direction)
    (texts, seconds), single = _inputs_of(parsed.inputs, max_texts)
    pairs = seconds if any(second is not None for second in seconds) else None
    return ClassifyRequest(texts=texts, pairs=pairs, raw_scores=parsed.raw_scores, truncate=parsed.truncate,
                           single=single)


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
