"""Small builders shared by the wire-format tests: results from logits, JSON value strategies, error checks."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from glassbox.service.classification import ClassifyResult
from glassbox.service.errors import GlassboxError, status_for
from glassbox.service.types import ProblemType

LABELS = ("negative", "neutral", "positive")

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=25,
)


def objects_with(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects whose keys are mostly the ones a decoder knows, so values reach its deeper checks."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), json_values, max_size=len(keys) + 1)


def result_for(
    logits: Any, labels: tuple[str, ...] = LABELS, tokens: Any = None, truncated: Any = None,
    problem: ProblemType = "single_label_classification",
) -> ClassifyResult:
    values = np.asarray(logits, dtype=np.float32)
    n = values.shape[0]
    lengths = np.full(n, 5, dtype=np.int64) if tokens is None else np.asarray(tokens, dtype=np.int64)
    cut = np.zeros(n, dtype=np.bool_) if truncated is None else np.asarray(truncated, dtype=np.bool_)
    return ClassifyResult.from_logits(labels, values, cut, lengths, problem)


def only_client_errors(decode: Callable[[bytes], Any], body: bytes) -> GlassboxError | None:
    """Run `decode`; anything but a glassbox 4xx error fails the test (the exception propagates)."""
    try:
        decode(body)
    except GlassboxError as error:
        status = status_for(error)
        assert 400 <= status < 500, f"{type(error).__name__} maps to {status}"
        assert error.code and error.message
        return error
    return None


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def infer_rules_hold(body: Any) -> bool:
    """The infer rules the OpenAPI document states in prose: data count = shape product, each output named once,
    the input "text" present and each input named once, "text_pair" as many strings as "text"."""
    try:
        counts = {tensor["name"]: len(tensor["data"]) for tensor in body["inputs"]}
        shapes_hold = all(math.prod(tensor["shape"]) == len(tensor["data"]) for tensor in body["inputs"])
        names = [output["name"] for output in body.get("outputs", [])]
        inputs_hold = len(counts) == len(body["inputs"]) and "text" in counts and (
            counts.get("text_pair", counts["text"]) == counts["text"])
        return bool(shapes_hold and inputs_hold and len(names) == len(set(names)))
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def pairs_match(body: Any) -> bool:
    """The /v1/classify rule the OpenAPI document states in prose: "text_pairs" has as many entries as "texts"."""
    try:
        return "text_pairs" not in body or len(body["text_pairs"]) == len(body["texts"])
    except (KeyError, TypeError):
        return False
