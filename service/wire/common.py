"""The few pieces every wire format shares: limits, JSON decoding, score options, ranking.

Decoders turn request bytes into a `ClassifyRequest` (service/classification.py) or raise a `glassbox.service.errors`
type; encoders turn a `ClassifyResult` into response bytes. Nothing here does I/O or knows about Starlette.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import numpy as np

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError
from glassbox.service.types import FloatArray, IntArray, ProblemType

T = TypeVar("T")

# A top_k beyond the label count is clamped, so the bound only keeps the integer in a sane range.
TOP_K_MAX = 2**31 - 1


class InvalidJsonError(InvalidRequestError):
    """The body is not JSON at all (as opposed to JSON of the wrong shape, which is `invalid_request`)."""

    code = "invalid_json"


class InvalidUtf8Error(InvalidRequestError):
    code = "invalid_utf8"


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    """How many scores a response lists per text, when the request body cannot say (frames) or as defaults."""

    top_k: int | None = None
    all_scores: bool = False
    threshold: float | None = None


def ranked(scores: FloatArray, k: int) -> IntArray:
    """Label indices of each row, highest score first, the first k of them. [n, L] -> [n, min(k, L)].

    A stable sort on the negated scores keeps ties in label order, so the answer never depends on the sort."""
    order = np.argsort(-scores, axis=1, kind="stable")  # [n, L]
    return order[:, : max(0, k)].astype(np.int64, copy=False)


def check_count(count: int, max_texts: int, what: str = "texts") -> None:
    if count == 0:
        raise EmptyInputError(f"no {what} to classify: send at least one")
    if count > max_texts:
        # A KServe shape may claim a count hundreds of digits long: the message names it only while it is readable.
        said = str(count) if count < 10**12 else "more than 10^12"
        raise TooManyTextsError(f"{said} {what} in one request; the limit is {max_texts} "
                                f"(--max-texts-per-request)")


# An escape (an odd run of backslashes, then u) of a high surrogate that no low one follows. JSON's "\\ud800"
# is the text \ud800, not an escape.
_LONE_HIGH_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")


def decode_json(body: bytes | bytearray | memoryview, kind: type[T]) -> T:
    """msgspec-decode `body` as `kind`, mapping msgspec's errors onto ours (its ValidationError is a DecodeError)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(f"request body has the wrong shape: {exc}") from None
    except msgspec.DecodeError as exc:
        if str(exc) == "Input data was truncated" and _LONE_HIGH_SURROGATE.search(bytes(body)):
            # msgspec says "truncated" for a high surrogate escape with no low one after it
            raise InvalidJsonError("request body is not valid JSON: a \\u escape is half of a UTF-16 surrogate pair "
                                   "(a lone \\ud800-\\udbff)") from None
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
