from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError, status_for
from glassbox.service.wire import tei
from tests.service.wire.builders import dumps, json_values, objects_with, only_client_errors, result_for


def decode(value: Any, max_texts: int = 4) -> ClassifyRequest:
    return tei.decode(dumps(value), max_texts=max_texts)


def test_a_string_or_a_one_string_list_is_one_input() -> None:
    assert decode({"inputs": "great film"}) == ClassifyRequest(texts=("great film",), single=True)
    assert decode({"inputs": ["great film"]}) == ClassifyRequest(texts=("great film",), single=True)


def test_a_list_of_one_string_lists_is_a_batch() -> None:
    request = decode({"inputs": [["a"], ["b"], [""]]})
    assert request.texts == ("a", "b", "") and request.single is False


def test_options_pass_through_and_unknown_fields_are_ignored_like_tei() -> None:
    body = {
        "inputs": "a",
        "raw_scores": True,
        "truncate": False,
        "truncation_direction": "Right",
        "parameters": {"x": 1},
    }
    request = decode(body)
    assert (request.raw_scores, request.truncate) == (True, False)
    assert decode({"inputs": "a", "truncate": None}).truncate is None
    assert decode({"inputs": "a", "truncation_direction": "right"}).texts == ("a",)


def test_a_two_string_list_is_one_pair_as_in_tei() -> None:
    request = decode({"inputs": ["question", "passage"]})
    assert (request.texts, request.pairs, request.single) == (("question",), ("passage",), True)


def test_a_batch_mixes_singles_and_pairs() -> None:
    request = decode({"inputs": [["a"], ["question", "passage"], ["b"]]})
    assert request.texts == ("a", "question", "b") and request.pairs == (None, "passage", None)
    assert not request.single
    assert decode({"inputs": [["a"], ["b"]]}).pairs is None  # no pair at all: a plain batch


@pytest.mark.parametrize("inputs, words", [
    (["a", "b", "c"], "list of 3 strings"),
    ([["a", "b", "c"]], "inputs[0] holds 3 strings"),
    ([["a"], []], "inputs[1] holds 0 strings"),
])
def test_more_than_two_texts_in_one_input_is_refused(inputs: Any, words: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode({"inputs": inputs})
    assert error.value.code == "invalid_request" and words in error.value.message


def test_left_truncation_is_refused_with_its_own_code() -> None:
    with pytest.raises(tei.TruncationDirectionError) as error:
        decode({"inputs": "a", "truncation_direction": "Left"})
    assert error.value.code == "truncation_direction_unsupported" and status_for(error.value) == 400


@pytest.mark.parametrize(
    "body",
    [
        {"inputs": ["a", "b", "c"]},
        {"inputs": [["a"], "b"]},
        {"inputs": ["a", ["b"]]},
        {"inputs": [[]]},
        {"inputs": [["a", "b", "c"]]},
        {"inputs": [1]},
        {"inputs": [[1]]},
        {"inputs": None},
        {"inputs": 3},
        {"text": "a"},
        {"inputs": "a", "raw_scores": "yes"},
        {"inputs": "a", "truncation_direction": "Up"},
        ["a"],
    ],
)
def test_malformed_inputs_are_400(body: Any) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(body)
    assert status_for(error.value) == 400


def test_empty_and_oversized_batches() -> None:
    with pytest.raises(EmptyInputError) as empty:
        decode({"inputs": []})
    assert status_for(empty.value) == 422
    with pytest.raises(TooManyTextsError) as many:
        decode({"inputs": [["a"]] * 5}, max_texts=4)
    assert status_for(many.value) == 413


@settings(max_examples=300, deadline=None)
@given(json_values | objects_with(["inputs", "raw_scores", "truncate", "truncation_direction"]))
def test_any_json_value_gives_a_request_or_a_client_error(value: object) -> None:
    only_client_errors(lambda b: tei.decode(b, max_texts=4), dumps(value))


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.text(max_size=5) | st.integers(), lambda c: st.lists(c, max_size=4), max_leaves=10))
def test_any_nesting_of_inputs_gives_a_request_or_a_client_error(inputs: object) -> None:
    only_client_errors(lambda b: tei.decode(b, max_texts=4), dumps({"inputs": inputs}))


def test_single_input_answers_one_list_of_every_label_best_first() -> None:
    result = result_for([[0.0, 2.0, 1.0]])
    body = json.loads(tei.encode(result, ClassifyRequest(texts=("a",), single=True)))
    assert [p["label"] for p in body] == ["neutral", "positive", "negative"]
    assert list(body[0]) == ["score", "label"]  # TEI's key order
    assert body[0]["score"] == pytest.approx(float(result.probs[0, 1]))
    assert sum(p["score"] for p in body) == pytest.approx(1.0, rel=1e-6)


def test_batch_answers_a_list_per_input_and_raw_scores_are_logits() -> None:
    result = result_for([[0.0, 2.0, 1.0], [3.0, -1.0, 0.5]])
    body = json.loads(tei.encode(result, ClassifyRequest(texts=("a", "b"), raw_scores=True)))
    assert len(body) == 2
    assert [p["score"] for p in body[1]] == [3.0, 0.5, -1.0]
    assert [p["label"] for p in body[1]] == ["negative", "positive", "neutral"]


def test_a_one_logit_head_scores_with_a_sigmoid_as_tei_does() -> None:
    result = result_for([[0.0]], labels=("relevant",))
    body = json.loads(tei.encode(result, ClassifyRequest(texts=("a",), single=True)))
    assert body == [{"score": 0.5, "label": "relevant"}]
