from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError, status_for
from glassbox.service.wire import json_api
from glassbox.service.wire.common import InvalidJsonError, ScoreOptions
from tests.service.wire.builders import LABELS, dumps, json_values, objects_with, only_client_errors, result_for


def decode(body: bytes, max_texts: int = 8) -> ClassifyRequest:
    return json_api.decode(body, max_texts=max_texts)


def test_one_text_or_many() -> None:
    assert decode(b'{"text": "fine film"}').texts == ("fine film",)
    request = decode(dumps({"texts": ["a", "", "c"], "top_k": 2, "all_scores": True}))
    assert request == ClassifyRequest(texts=("a", "", "c"), top_k=2, all_scores=True)
    assert decode(b'{"text": "x", "top_k": null}').top_k is None
    assert decode(b'{"text": "x", "top_k": 2.0}').top_k == 2  # JSON Schema's integer includes 2.0


@pytest.mark.parametrize(
    "body",
    [b"{}", b'{"text": "a", "texts": ["b"]}', b'{"top_k": 1}', b'{"text": null}', b'{"texts": null}'],
)
def test_exactly_one_of_text_or_texts(body: bytes) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(body)
    assert status_for(error.value) == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"text": 3}', "$.text"),
        (b'{"texts": "abc"}', "$.texts"),
        (b'{"texts": ["a", 2]}', "$.texts[1]"),
        (b'{"text": "a", "top_k": 0}', "$.top_k"),
        (b'{"text": "a", "top_k": 1.5}', "top_k"),
        (b'{"text": "a", "top_k": 99999999999999999999}', "$.top_k"),
        (b'{"text": "a", "all_scores": "yes"}', "$.all_scores"),
        (b'{"text": "a", "topk": 3}', "topk"),
        (b"[]", "array"),
    ],
)
def test_wrong_types_and_unknown_fields_say_where(body: bytes, field: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(body)
    assert error.value.code == "invalid_request"
    assert field in error.value.message


@pytest.mark.parametrize("body", [b"", b"{", b'{"text": "a"} x', b'{"text": "\xff"}', b'{"text": "\\ud800"}'])
def test_malformed_json_and_bad_utf8_are_invalid_json(body: bytes) -> None:
    with pytest.raises(InvalidJsonError) as error:
        decode(body)
    assert error.value.code == "invalid_json" and status_for(error.value) == 400


@pytest.mark.parametrize(("body", "says"), [
    (b'{"text": "\\ud800"}', "half of a UTF-16 surrogate pair"),  # msgspec's own message: "truncated"
    (b'{"text": "\\ud83d\\ude00 \\ud800x"}', "half of a UTF-16 surrogate pair"),  # a whole pair, then a half
    (b'{"text": "ab', "truncated"),  # truly cut short
    (b'{"text": "a\\\\ud800 b', "truncated"),  # an escaped backslash, then text: cut short, no surrogate in it
])
def test_a_lone_surrogate_escape_is_named_not_called_truncated(body: bytes, says: str) -> None:
    with pytest.raises(InvalidJsonError) as error:
        decode(body)
    assert says in error.value.message


def test_empty_and_too_many_texts() -> None:
    with pytest.raises(EmptyInputError):
        decode(b'{"texts": []}')
    with pytest.raises(TooManyTextsError) as error:
        decode(dumps({"texts": ["a"] * 9}), max_texts=8)
    assert status_for(error.value) == 413
    assert len(decode(dumps({"texts": ["a"] * 8}), max_texts=8).texts) == 8


def test_query_options_are_defaults_the_body_overrides() -> None:
    options = ScoreOptions(top_k=2, all_scores=True)
    assert json_api.decode(b'{"text": "a"}', max_texts=1, options=options).top_k == 2
    overridden = json_api.decode(b'{"text": "a", "top_k": 1, "all_scores": false}', max_texts=1, options=options)
    assert (overridden.top_k, overridden.all_scores) == (1, False)


@settings(max_examples=300, deadline=None)
@given(json_values | objects_with(["text", "texts", "top_k", "all_scores"]))
def test_any_json_value_gives_a_request_or_a_client_error(value: object) -> None:
    body = dumps(value)
    error = only_client_errors(decode, body)
    if error is None:
        assert isinstance(value, dict) and ("text" in value) != ("texts" in value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_a_request_or_a_client_error(body: bytes) -> None:
    only_client_errors(decode, body)


def test_encode_best_label_only_by_default() -> None:
    result = result_for([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]], tokens=[7, 512], truncated=[False, True])
    body = json.loads(json_api.encode(result, ClassifyRequest(texts=("a", "b")), "tiny"))
    assert body["model"] == "tiny"
    first, second = body["results"]
    assert set(first) == {"label", "score", "tokens", "truncated"}
    assert (first["label"], first["tokens"], first["truncated"]) == ("positive", 7, False)
    assert first["score"] == pytest.approx(float(result.probs[0, 2]))
    assert (second["label"], second["tokens"], second["truncated"]) == ("negative", 512, True)


def test_encode_top_k_sorts_and_clamps_and_all_scores_lists_every_label() -> None:
    result = result_for([[0.0, 1.0, 3.0]])
    top2 = json.loads(json_api.encode(result, ClassifyRequest(texts=("a",), top_k=2), "m"))["results"][0]
    assert [s["label"] for s in top2["scores"]] == ["positive", "neutral"]
    assert top2["scores"][0]["score"] >= top2["scores"][1]["score"]
    clamped = json.loads(json_api.encode(result, ClassifyRequest(texts=("a",), top_k=50), "m"))["results"][0]
    assert len(clamped["scores"]) == len(LABELS)
    every = json.loads(json_api.encode(result, ClassifyRequest(texts=("a",), all_scores=True), "m"))["results"][0]
    assert [s["label"] for s in every["scores"]] == ["positive", "neutral", "negative"]
    assert sum(s["score"] for s in every["scores"]) == pytest.approx(1.0, rel=1e-6)
    # top_k wins over all_scores
    both = json.loads(json_api.encode(result, ClassifyRequest(texts=("a",), top_k=1, all_scores=True), "m"))
    assert len(both["results"][0]["scores"]) == 1


def test_text_pairs_ride_beside_their_texts() -> None:
    assert decode(dumps({"text": "q", "text_pair": "a"})).pairs == ("a",)
    request = decode(dumps({"texts": ["q1", "q2", "q3"], "text_pairs": ["a1", None, "a3"]}))
    assert request.texts == ("q1", "q2", "q3") and request.pairs == ("a1", None, "a3")
    assert decode(dumps({"texts": ["q"]})).pairs is None


@pytest.mark.parametrize(("body", "words"), [
    ({"texts": ["a"], "text_pair": "b"}, '"text_pair" goes with "text"'),
    ({"text": "a", "text_pairs": ["b"]}, '"text_pairs" goes with "texts"'),
    ({"texts": ["a", "b"], "text_pairs": ["c"]}, '"text_pairs" has 1 entries for 2 texts'),
    ({"text": "a", "text_pair": 3}, "$.text_pair"),
    ({"text": "a", "threshold": 1.5}, "$.threshold"),
    ({"text": "a", "threshold": "high"}, "$.threshold"),
])
def test_misplaced_pairs_and_bad_thresholds_are_refused(body: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(dumps(body))
    assert error.value.code == "invalid_request" and words in error.value.message


def results(logits: list[list[float]], body: dict[str, object], problem: str,
            labels: tuple[str, ...] = LABELS) -> list[dict[str, object]]:
    request = json_api.decode(dumps(body), max_texts=8, problem=problem)  # type: ignore[arg-type]
    result = result_for(logits, labels, problem=problem)  # type: ignore[arg-type]
    return json.loads(json_api.encode(result, request, "m"))["results"]  # type: ignore[no-any-return]


def test_single_label_threshold_lists_the_labels_that_reach_it() -> None:
    (row,) = results([[0.0, 0.0, 2.0]], {"text": "x", "threshold": 0.1}, "single_label_classification")
    assert row["label"] == "positive" and [s["label"] for s in row["scores"]] == ["positive", "negative", "neutral"]
    (row,) = results([[0.0, 0.0, 3.0]], {"text": "x", "threshold": 0.5}, "single_label_classification")
    assert [s["label"] for s in row["scores"]] == ["positive"]


def test_multi_label_scores_are_independent_sigmoids_always_listed() -> None:
    (row,) = results([[2.0, -1.0, 0.0]], {"text": "x"}, "multi_label_classification")
    sig = [1 / (1 + 2.718281828459045 ** -v) for v in (2.0, 0.0, -1.0)]
    assert row["label"] == "negative" and row["score"] == pytest.approx(sig[0], rel=1e-6)
    assert [(s["label"], s["score"]) for s in row["scores"]] == [
        ("negative", pytest.approx(sig[0], rel=1e-6)), ("positive", 0.5), ("neutral", pytest.approx(sig[2], rel=1e-6))]
    assert sum(s["score"] for s in row["scores"]) > 1  # not a softmax
    (row,) = results([[2.0, -1.0, 0.0]], {"text": "x", "threshold": 0.5}, "multi_label_classification")
    assert [s["label"] for s in row["scores"]] == ["negative", "positive"]  # 0.5 reaches a threshold of 0.5
    (row,) = results([[2.0, -1.0, 0.0]], {"text": "x", "top_k": 1, "threshold": 0.9}, "multi_label_classification")
    assert row["scores"] == []  # the best label scores 0.88: nothing reaches 0.9


def test_regression_answers_the_number_without_a_label() -> None:
    rows = results([[3.25], [-0.5]], {"texts": ["x", "y"]}, "regression", ("LABEL_0",))
    assert rows == [{"score": 3.25, "tokens": 5, "truncated": False}, {"score": -0.5, "tokens": 5, "truncated": False}]


@pytest.mark.parametrize("options", [{"top_k": 1}, {"all_scores": True}, {"threshold": 0.5}])
def test_regression_refuses_options_that_need_labels(options: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError) as error:
        json_api.decode(dumps({"text": "x", **options}), max_texts=8, problem="regression")
    assert "regression" in error.value.message
    assert json_api.decode(dumps({"text": "x", "all_scores": False}), max_texts=8, problem="regression").texts == ("x",)
