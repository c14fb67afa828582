"""What every wire format decodes into and encodes from, and the few pieces they share.

Decoders turn request bytes into a `ClassifyRequest` or raise a `service.errors` type; encoders turn a
`ClassifyResult` into response bytes. Nothing here does I/O or knows about Starlette.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError
from service.types import BoolArray, FloatArray, IntArray, ProblemType

T = TypeVar("T")

# A top_k beyond the label count is clamped, so the bound only keeps the integer in a sane range.
TOP_K_MAX = 2**31 - 1


class InvalidJsonError(InvalidRequestError):
    """The body is not JSON at all (as opposed to JSON of the wrong shape, which is `invalid_request`)."""

    code = "invalid_json"


class InvalidUtf8Error(InvalidRequestError):
    code = "invalid_utf8"


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


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    """How many scores a response lists per text, when the request body cannot say (frames) or as defaults."""

    top_k: int | None = None
    all_scores: bool = False
    threshold: float | None = None


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


def ranked(scores: FloatArray, k: int) -> IntArray:
    """Label indices of each row, highest score first, the first k of them. [n, L] -> [n, min(k, L)].

    A stable sort on the negated scores keeps ties in label order, so the answer never depends on the sort."""
    order = np.argsort(-scores, axis=1, kind="stable")  # [n, L]
    return order[:, : max(0, k)].astype(np.int64, copy=False)


def check_count(count: int, max_texts: int, what: str = "texts") -> None:
    if count == 0:
        raise EmptyInputError(f"no {what} to classify: send at least one")
    if count > max_texts:
        raise TooManyTextsError(f"{count} {what} in one request; the limit is {max_texts} "
                                f"(--max-texts-per-request)")


def decode_json(body: bytes | bytearray | memoryview, kind: type[T]) -> T:
    """msgspec-decode `body` as `kind`, mapping msgspec's errors onto ours (its ValidationError is a DecodeError)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"request body has the wrong shape: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidJsonError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec guards its recursive decoder with the interpreter's recursion limit (about 1000 levels).
        raise InvalidRequestError("request body nests arrays or objects too deeply") from None


def check_threshold(value: float | None) -> float | None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise InvalidRequestError(f"threshold must be a number from 0 to 1, got {value}")
    return value


def check_options(request: ClassifyRequest, problem: ProblemType) -> ClassifyRequest:
    """Refuse options that mean nothing for the served head: a regression model answers one number per text."""
    if problem == "regression" and (request.top_k is not None or request.all_scores or request.threshold is not None):
        raise InvalidRequestError("this model is a regression model: it answers one score per text, without labels, "
                                  "so top_k, all_scores and threshold do not apply")
    return request


def parse_query_options(params: Mapping[str, str]) -> ScoreOptions:
    """`?top_k=3&all_scores=true&threshold=0.5` -> ScoreOptions; the frames body has no room for options, so they
    ride here."""
    top_k: int | None = None
    raw_k = params.get("top_k")
    if raw_k is not None:
        if not raw_k.isascii() or not raw_k.isdigit() or len(raw_k) > 10 or not 1 <= int(raw_k) <= TOP_K_MAX:
            raise InvalidRequestError(f"top_k must be an integer from 1 to {TOP_K_MAX}, got {raw_k[:40]!r}")
        top_k = int(raw_k)
    all_scores = False
    raw_all = params.get("all_scores")
    if raw_all is not None:
        lowered = raw_all.lower()
        if lowered not in ("true", "false", "1", "0"):
            raise InvalidRequestError(f"all_scores must be true or false, got {raw_all[:40]!r}")
        all_scores = lowered in ("true", "1")
    threshold: float | None = None
    raw_threshold = params.get("threshold")
    if raw_threshold is not None:
        try:
            threshold = float(raw_threshold) if len(raw_threshold) <= 40 else float("nan")
        except ValueError:
            threshold = float("nan")
        if not 0.0 <= threshold <= 1.0:  # NaN fails this too
            raise InvalidRequestError(f"threshold must be a number from 0 to 1, got {raw_threshold[:40]!r}")
    return ScoreOptions(top_k=top_k, all_scores=all_scores, threshold=threshold)
