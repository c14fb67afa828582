"""`/tokenize`, `/decode` and `/info` bodies in TEI's shapes."""

from __future__ import annotations

import json

import pytest

from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError
from glassbox.service.tokenizer import TokenInfo
from glassbox.service.wire import tei_tools
from tests.service.wire.builders import dumps


def test_tokenize_takes_one_text_or_a_list() -> None:
    assert tei_tools.decode_tokenize(dumps({"inputs": "a b"}), max_texts=4) == (["a b"], True)
    assert tei_tools.decode_tokenize(dumps({"inputs": ["a", "b"], "add_special_tokens": False}), max_texts=4) == (
        ["a", "b"], False)


@pytest.mark.parametrize(("body", "kind"), [
    ({"inputs": []}, EmptyInputError),
    ({"inputs": ["a"] * 5}, TooManyTextsError),
    ({"inputs": "a", "prompt_name": "query"}, InvalidRequestError),
    ({"inputs": 3}, InvalidRequestError),
])
def test_tokenize_refusals(body: dict[str, object], kind: type[Exception]) -> None:
    with pytest.raises(kind):
        tei_tools.decode_tokenize(dumps(body), max_texts=4)


def test_tokens_are_written_as_tei_does() -> None:
    tokens = [[TokenInfo(2, "[CLS]", True, None, None), TokenInfo(13, "good", False, 0, 4)]]
    assert json.loads(tei_tools.encode_tokens(tokens)) == [[
        {"id": 2, "text": "[CLS]", "special": True, "start": None, "stop": None},
        {"id": 13, "text": "good", "special": False, "start": 0, "stop": 4},
    ]]


def test_decode_takes_one_id_list_or_several() -> None:
    assert tei_tools.decode_ids(dumps({"ids": [1, 2]}), max_texts=4) == ([[1, 2]], True)
    assert tei_tools.decode_ids(dumps({"ids": [3.0]}), max_texts=4) == ([[3]], True)  # JSON Schema's integer
    assert tei_tools.decode_ids(dumps({"ids": [[1], [2, 3]], "skip_special_tokens": False}), max_texts=4) == (
        [[1], [2, 3]], False)


@pytest.mark.parametrize(("ids", "kind"), [
    ([], EmptyInputError), ([[1]] * 5, TooManyTextsError), ([1, [2]], InvalidRequestError),
    ([[1], 2], InvalidRequestError), ([-1], InvalidRequestError), ([True], InvalidRequestError),
    (["1"], InvalidRequestError), ([1.5], InvalidRequestError),
])
def test_decode_refusals(ids: list[object], kind: type[Exception]) -> None:
    with pytest.raises(kind):
        tei_tools.decode_ids(dumps({"ids": ids}), max_texts=4)


def test_info_says_classifier_or_reranker_by_the_output_count() -> None:
    def info(labels: tuple[str, ...]) -> dict[str, object]:
        return tei_tools.info(model_name="m", labels=labels, problem="single_label_classification", dtype="float32",
                              max_input_length=128, settings={"max_batch_tokens": 4096}, version="1", extra={})

    assert info(("neg", "pos"))["model_type"] == {"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                                                 "label2id": {"neg": 0, "pos": 1}}}
    assert list(info(("LABEL_0",))["model_type"]) == ["reranker"]  # type: ignore[call-overload]
    assert info(("a", "b"))["max_batch_tokens"] == 4096 and info(("a", "b"))["max_input_length"] == 128
