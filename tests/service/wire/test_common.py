from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from glassbox.service.classification import probabilities, sigmoid, softmax
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError, status_for
from glassbox.service.wire.common import InvalidJsonError, check_count, decode_json, parse_query_options, ranked
from glassbox.service.wire.json_api import ClassifyBody


def test_softmax_matches_the_definition_and_is_float32() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    probs = softmax(logits)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    np.testing.assert_allclose(probs[1], [1 / 3] * 3, rtol=1e-6)


def test_softmax_survives_huge_logits_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = softmax(np.array([[1000.0, -1000.0, 999.0]], dtype=np.float32))
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)
    assert probs[0, 0] > probs[0, 2] > probs[0, 1]


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 6), st.integers(2, 8)),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_softmax_rows_are_distributions_that_keep_the_argmax(logits: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = softmax(logits)
    assert probs.shape == logits.shape and probs.dtype == np.float32
    assert ((probs >= 0) & (probs <= 1)).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    rows = np.arange(len(logits))
    # The largest logit always gets the largest probability (ties may pick a different index).
    assert (probs[rows, logits.argmax(axis=1)] == probs.max(axis=1)).all()


def test_probabilities_use_a_sigmoid_for_a_single_logit_head() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = probabilities(np.array([[0.0], [2.0], [-200.0]], dtype=np.float32))
    np.testing.assert_allclose(probs[:, 0], [0.5, 1 / (1 + np.exp(-2.0)), 0.0], atol=1e-6)
    np.testing.assert_allclose(probabilities([[1.0, 1.0]]), [[0.5, 0.5]])
    np.testing.assert_allclose(sigmoid([0.0]), [0.5])


def test_ranked_is_best_first_keeps_ties_in_label_order_and_clamps_k() -> None:
    scores = np.array([[0.1, 0.5, 0.5, 0.2], [0.9, 0.0, 0.05, 0.05]], dtype=np.float32)
    assert ranked(scores, 3).tolist() == [[1, 2, 3], [0, 2, 3]]
    assert ranked(scores, 99).shape == (2, 4)
    assert ranked(scores, 0).shape == (2, 0)


def test_check_count_maps_to_the_right_statuses() -> None:
    check_count(3, 3)
    with pytest.raises(EmptyInputError) as empty:
        check_count(0, 3)
    with pytest.raises(TooManyTextsError) as many:
        check_count(4, 3)
    assert (status_for(empty.value), status_for(many.value)) == (422, 413)
    assert "limit is 3" in many.value.message


def test_decode_json_separates_bad_json_from_bad_shapes() -> None:
    with pytest.raises(InvalidJsonError) as bad_json:
        decode_json(b"{not json", ClassifyBody)
    assert bad_json.value.code == "invalid_json" and status_for(bad_json.value) == 400
    with pytest.raises(InvalidRequestError) as bad_shape:
        decode_json(b'{"texts": [1]}', ClassifyBody)
    assert bad_shape.value.code == "invalid_request" and "$.texts[0]" in bad_shape.value.message


def test_decode_json_refuses_deep_nesting_as_a_client_error() -> None:
    deep = b'{"texts": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(InvalidRequestError) as error:
        decode_json(deep, ClassifyBody)
    assert status_for(error.value) == 400


def test_query_options_parse_and_refuse_garbage() -> None:
    assert parse_query_options({}).top_k is None
    options = parse_query_options({"top_k": "3", "all_scores": "TRUE"})
    assert (options.top_k, options.all_scores) == (3, True)
    assert parse_query_options({"all_scores": "0"}).all_scores is False
    for bad in (
        {"top_k": "0"},
        {"top_k": "-1"},
        {"top_k": "x"},
        {"top_k": "²"},
        {"top_k": "9" * 30},
        {"all_scores": "yes please"},
    ):
        with pytest.raises(InvalidRequestError):
            parse_query_options(bad)
