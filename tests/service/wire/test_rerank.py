"""`POST /rerank` bodies and answers, as TEI documents them."""

from __future__ import annotations

import json

import pytest

from glassbox.service.errors import (
    EmptyInputError,
    InvalidRequestError,
    NotARerankerError,
    TooManyTextsError,
    status_for,
)
from glassbox.service.wire import rerank
from tests.service.wire.builders import dumps, result_for


def test_each_text_is_paired_with_the_query() -> None:
    request, return_text = rerank.decode(dumps({"query": "q", "texts": ["a", "b"], "raw_scores": True,
                                                "return_text": True, "truncate": False, "extra": 1}), max_texts=8)
    assert request.texts == ("q", "q") and request.pairs == ("a", "b")
    assert (request.raw_scores, request.truncate, return_text) == (True, False, True)


def test_answer_is_sorted_by_score_with_sigmoids_and_optional_texts() -> None:
    request, _ = rerank.decode(dumps({"query": "q", "texts": ["low", "high", "tie", "mid"]}), max_texts=8)
    result = result_for([[-2.0], [3.0], [-2.0], [0.0]], ("LABEL_0",))
    ranks = json.loads(rerank.encode(result, request, return_text=False))
    assert [r["index"] for r in ranks] == [1, 3, 0, 2]  # ties keep input order
    assert ranks[1] == {"index": 3, "score": 0.5} and all("text" not in r for r in ranks)
    with_text = json.loads(rerank.encode(result, request, return_text=True))
    assert with_text[0] == {"index": 1, "text": "high", "score": pytest.approx(0.9525741, rel=1e-6)}
    raw_request, _ = rerank.decode(dumps({"query": "q", "texts": ["a", "b"], "raw_scores": True}), max_texts=8)
    raw = json.loads(rerank.encode(result_for([[-2.0], [3.0]], ("LABEL_0",)), raw_request, return_text=False))
    assert raw == [{"index": 1, "score": 3.0}, {"index": 0, "score": -2.0}]


def test_regression_rerankers_rank_by_the_number_itself() -> None:
    request, _ = rerank.decode(dumps({"query": "q", "texts": ["a", "b"]}), max_texts=8)
    result = result_for([[0.25], [4.5]], ("LABEL_0",), problem="regression")
    ranks = json.loads(rerank.encode(result, request, False))
    assert ranks == [{"index": 1, "score": 4.5}, {"index": 0, "score": 0.25}]


@pytest.mark.parametrize(("body", "kind"), [
    ({"query": "q", "texts": []}, EmptyInputError),
    ({"query": "q", "texts": ["a"] * 9}, TooManyTextsError),
    ({"texts": ["a"]}, InvalidRequestError),
    ({"query": "q", "texts": "a"}, InvalidRequestError),
    ({"query": "q", "texts": ["a"], "truncation_direction": "Left"}, InvalidRequestError),
])
def test_bad_bodies_are_client_errors(body: dict[str, object], kind: type[Exception]) -> None:
    with pytest.raises(kind) as error:
        rerank.decode(dumps(body), max_texts=8)
    assert 400 <= status_for(error.value) < 500  # type: ignore[arg-type]


def test_a_classifier_is_no_reranker() -> None:
    rerank.check_reranker(("LABEL_0",))
    with pytest.raises(NotARerankerError) as error:
        rerank.check_reranker(("negative", "neutral", "positive"))
    assert status_for(error.value) == 424 and error.value.code == "not_a_reranker"
    assert "3 outputs (negative, neutral, positive)" in error.value.message
