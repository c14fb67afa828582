from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError, status_for
from glassbox.service.wire import kserve
from glassbox.service.wire.common import InvalidJsonError, InvalidUtf8Error
from tests.service.wire.builders import LABELS, dumps, json_values, objects_with, only_client_errors, result_for

TEXTS = ["great film", "héllo wörld ✓", ""]
LOGITS = [[0.0, 2.0, 1.0], [3.0, -1.0, 0.5], [0.0, 0.0, 0.0]]


def triton_body(
    texts: list[str],
    *,
    binary_input: bool,
    outputs: list[Any] | None,
    request_id: str = "",
    shape: list[int] | None = None,
) -> tuple[bytes, str | None]:
    """What tritonclient's InferenceServerClient.infer would put on the wire (body and header value)."""
    tensor = triton.InferInput("text", shape or [len(texts)], "BYTES")
    tensor.set_data_from_numpy(
        np.array(texts, dtype=np.object_).reshape(shape or [len(texts)]), binary_data=binary_input
    )
    body, json_size = _get_inference_request([tensor], request_id, outputs, 0, False, False, 0, None, None)
    return body, None if json_size is None else str(json_size)


def triton_result(body: bytes, headers: dict[str, str]) -> triton.InferResult:
    length = headers.get(kserve.HEADER_LENGTH)
    return triton.InferResult.from_response_body(body, header_length=None if length is None else int(length))


def decode(
    body: bytes, header: str | None = None, max_texts: int = 8
) -> tuple[ClassifyRequest, tuple[kserve.OutputRequest, ...]]:
    return kserve.decode_infer(body, header, max_texts=max_texts)


@pytest.mark.parametrize("binary_input", [True, False])
def test_tritonclient_default_call_round_trips_every_output_in_binary(binary_input: bool) -> None:
    body, header = triton_body(TEXTS, binary_input=binary_input, outputs=None, request_id="req-1")
    request, outputs = decode(body, header)
    assert request.texts == tuple(TEXTS) and request.request_id == "req-1"
    # tritonclient names no outputs and sets binary_data_output, so every output comes back binary
    assert outputs == tuple(kserve.OutputRequest(name, True) for name in kserve.OUTPUT_NAMES)

    result = result_for(LOGITS)
    out_body, headers = kserve.encode_infer(result, request, outputs, "tiny")
    assert kserve.HEADER_LENGTH in headers
    parsed = triton_result(out_body, headers)
    assert parsed.get_response()["model_name"] == "tiny" and parsed.get_response()["id"] == "req-1"
    assert parsed.as_numpy("label").tolist() == [b"neutral", b"negative", b"negative"]
    np.testing.assert_array_equal(parsed.as_numpy("probabilities"), result.probs)
    np.testing.assert_array_equal(parsed.as_numpy("logits"), result.logits)
    assert parsed.as_numpy("probabilities").dtype == np.float32


def test_json_outputs_and_classification_as_tritonclient_asks_for_them() -> None:
    outputs = [
        triton.InferRequestedOutput("label", binary_data=False),
        triton.InferRequestedOutput("probabilities", binary_data=False, class_count=2),
        triton.InferRequestedOutput("logits", binary_data=True),
    ]
    body, header = triton_body(TEXTS, binary_input=False, outputs=outputs)
    assert header is None  # JSON input and no binary: plain JSON body
    request, asked = decode(body, header)
    assert asked == (
        kserve.OutputRequest("label", False),
        kserve.OutputRequest("probabilities", False, 2),
        kserve.OutputRequest("logits", True),
    )
    result = result_for(LOGITS)
    out_body, headers = kserve.encode_infer(result, request, asked, "tiny")
    parsed = triton_result(out_body, headers)
    assert parsed.as_numpy("label").tolist() == ["neutral", "negative", "negative"]
    top2 = parsed.as_numpy("probabilities")
    assert top2.shape == (3, 2)
    score, index, label = top2[0, 0].split(":")
    assert (int(index), label) == (1, "neutral") and float(score) == pytest.approx(float(result.probs[0, 1]), abs=1e-6)
    assert top2[2, 0].endswith(":0:negative") and top2[2, 1].endswith(":1:neutral")  # ties: label order
    np.testing.assert_array_equal(parsed.as_numpy("logits"), result.logits)


def test_all_json_response_has_no_binary_header() -> None:
    request = ClassifyRequest(texts=("a",))
    out_body, headers = kserve.encode_infer(
        result_for(LOGITS[:1]), request, (kserve.OutputRequest("logits", False),), "m"
    )
    assert headers == {}
    body = json.loads(out_body)
    assert body["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [1, 3], "data": [0.0, 2.0, 1.0]}]
    assert "id" not in body and body["model_version"] == kserve.MODEL_VERSION


def test_a_plain_json_request_without_tritonclient() -> None:
    body = dumps(
        {"id": "7", "inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a"], ["b"]]}]}
    )
    request, outputs = decode(body)
    assert request.texts == ("a", "b") and request.request_id == "7"
    assert all(not out.binary for out in outputs) and len(outputs) == 3


def test_whole_floats_count_as_integers_as_in_json_schema() -> None:
    body = dumps(
        {
            "inputs": [{"name": "text", "shape": [2.0], "datatype": "BYTES", "data": ["a", "b"]}],
            "outputs": [{"name": "logits", "parameters": {"classification": 2.0}}],
        }
    )
    request, outputs = decode(body)
    assert request.texts == ("a", "b") and outputs == (kserve.OutputRequest("logits", False, 2),)


def test_our_bytes_serialization_is_tritons() -> None:
    items = ["a", "", "héllo ✓", "x" * 300]
    assert kserve.serialize_bytes(items) == serialize_byte_tensor(np.array(items, dtype=np.object_)).item()
    assert deserialize_bytes_tensor(kserve.serialize_bytes(items)).tolist() == [s.encode() for s in items]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=8), st.booleans())
def test_any_texts_round_trip_through_tritonclient_encoding(texts: list[str], binary_input: bool) -> None:
    body, header = triton_body(texts, binary_input=binary_input, outputs=None)
    request, _ = decode(body, header)
    assert request.texts == tuple(texts)


def binary_request(
    blob: bytes, *, size: int | None = None, shape: list[int] | None = None, extra: bytes = b""
) -> tuple[bytes, str]:
    header = dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": shape or [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob) if size is None else size},
                }
            ]
        }
    )
    return header + blob + extra, str(len(header))


def element(data: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<I", len(data) if declared is None else declared) + data


@pytest.mark.parametrize(
    ("body", "header", "error_type"),
    [
        (*binary_request(element(b"ok"), size=99), kserve.BinaryDataError),  # declared more than follows
        (*binary_request(element(b"ok"), size=2), kserve.BinaryDataError),  # declared less than follows
        (*binary_request(element(b"ok", declared=50)), kserve.BinaryDataError),  # element runs past the blob
        (*binary_request(element(b"ok") + b"\x01"), kserve.BinaryDataError),  # a partial element length
        (*binary_request(element(b"a") + element(b"b")), kserve.BinaryDataError),  # more elements than the shape
        (*binary_request(element(b"a"), shape=[2]), kserve.TensorError),  # fewer elements than the shape
        (*binary_request(element(b"\xff\xfe")), InvalidUtf8Error),
        (binary_request(element(b"a"))[0], "0", kserve.BinaryDataError),
        (binary_request(element(b"a"))[0], "999999", kserve.BinaryDataError),
        (binary_request(element(b"a"))[0], "12x", kserve.BinaryDataError),
        (binary_request(element(b"a"))[0], "-5", kserve.BinaryDataError),
        (binary_request(b"", size=4)[0], None, kserve.BinaryDataError),  # binary_data_size but no header
        (binary_request(element(b"a"))[0], None, InvalidJsonError),  # no header: the whole body must be JSON
    ],
)
def test_binary_section_errors(body: bytes, header: str | None, error_type: type[Exception]) -> None:
    with pytest.raises(error_type) as error:
        decode(body, header)
    assert isinstance(error.value, InvalidRequestError) and status_for(error.value) == 400


def json_request(**tensor: Any) -> bytes:
    base = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    return dumps({"inputs": [{**base, **tensor}]})


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (json_request(name="input_ids"), "invalid_tensor"),
        (json_request(datatype="INT64"), "invalid_tensor"),
        (json_request(shape=[2]), "invalid_tensor"),
        (json_request(shape=[-1]), "invalid_request"),
        (json_request(shape=[1.5]), "invalid_tensor"),
        (json_request(data=[1]), "invalid_tensor"),
        (json_request(data=None), "invalid_request"),
        (json_request(data=["a"], parameters={"binary_data_size": 3}), "invalid_binary_data"),
        (json_request(parameters={"shared_memory_region": "r"}), "invalid_request"),
        (dumps({"inputs": []}), "invalid_tensor"),
        (dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}), "invalid_tensor"),
        (dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}] * 2}), "invalid_tensor"),
        (
            dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                    "outputs": [{"name": "x"}],
                }
            ),
            "unknown_output",
        ),
        (
            dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                    "outputs": [{"name": "label"}, {"name": "label"}],
                }
            ),
            "invalid_request",
        ),
        (
            dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                    "outputs": [{"name": "logits", "parameters": {"binary_data": 1}}],
                }
            ),
            "invalid_request",
        ),
        (
            dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                    "outputs": [{"name": "logits", "parameters": {"classification": True}}],
                }
            ),
            "invalid_request",
        ),
        (
            dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                    "parameters": {"binary_data_output": "yes"},
                }
            ),
            "invalid_request",
        ),
        (json_request() + b"trailing", "invalid_json"),
    ],
)
def test_json_header_errors(body: bytes, code: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(body)
    assert error.value.code == code and status_for(error.value) == 400


def test_bytes_after_a_json_only_header_are_refused() -> None:
    body = json_request()
    with pytest.raises(kserve.BinaryDataError):
        decode(body + b"\x00\x00\x00\x00", str(len(body)))


def test_empty_and_too_many() -> None:
    with pytest.raises(EmptyInputError):
        decode(json_request(shape=[0], data=[]))
    with pytest.raises(TooManyTextsError) as error:
        decode(json_request(shape=[3, 3], data=["a"] * 9), max_texts=8)
    assert status_for(error.value) == 413
    with pytest.raises(TooManyTextsError):  # refused from the shape alone, before the data is looked at
        decode(json_request(shape=[10**18], data=["a"]))
    with pytest.raises(TooManyTextsError) as huge:  # a 301-digit count is not spelt out in the message
        decode(json_request(shape=[1e300], data=["a"]))
    assert str(huge.value).startswith("more than 10^12 texts in one request") and len(str(huge.value)) < 120
    with pytest.raises(TooManyTextsError):  # a huge shape is refused without multiplying it all out
        decode(json_request(shape=[10**9] * 200_000, data=["a"]))
    with pytest.raises(EmptyInputError):
        decode(json_request(shape=[10**9, 0], data=[]))


@settings(max_examples=300, deadline=None)
@given(json_values | objects_with(["inputs", "outputs", "id", "parameters"]))
def test_any_json_value_gives_a_request_or_a_client_error(value: object) -> None:
    only_client_errors(lambda b: decode(b), dumps(value))


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["text", "x"]),
            "shape": st.lists(st.integers(-1, 3), max_size=3),
            "datatype": st.sampled_from(["BYTES", "FP32"]),
        },
        optional={"data": json_values, "parameters": objects_with(["binary_data_size", "shared_memory_region"])},
    ),
    st.binary(max_size=24),
    st.one_of(st.none(), st.integers(-2, 400).map(str), st.text(max_size=4)),
)
def test_any_tensor_and_binary_tail_give_a_request_or_a_client_error(
    tensor: dict[str, Any], tail: bytes, header: str | None
) -> None:
    head = dumps({"inputs": [tensor]})
    length = str(len(head)) if header is None and tail else header
    only_client_errors(lambda b: decode(b, length), head + tail)


def test_metadata() -> None:
    meta = kserve.model_metadata("tiny", LABELS)
    assert meta["name"] == "tiny" and meta["platform"] == "glassbox" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    by_name = {o["name"]: o for o in meta["outputs"]}
    assert by_name["label"]["datatype"] == "BYTES"
    assert by_name["probabilities"] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}
    server = kserve.server_metadata()
    assert server["name"] == "glassbox" and "binary_tensor_data" in server["extensions"] and server["version"]


def test_classification_on_the_label_output_is_accepted_and_changes_nothing() -> None:
    body = dumps(
        {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
            "outputs": [{"name": "label", "parameters": {"classification": 2}}],
        }
    )
    request, outputs = kserve.decode_infer(body, None, max_texts=8)
    assert request.texts == ("a",)
    assert [(o.name, o.classification) for o in outputs] == [("label", 0)]


@pytest.mark.parametrize("binary", [(True, True), (False, False), (True, False), (False, True)], ids=str)
def test_a_second_bytes_input_carries_the_pairs(binary: tuple[bool, bool]) -> None:
    """tritonclient with two inputs, each JSON or binary: text_pair's element i is the second text of text's i."""
    inputs = []
    for name, texts, as_binary in (("text", TEXTS, binary[0]), ("text_pair", ["a", "ü", "c"], binary[1])):
        tensor = triton.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=np.object_), binary_data=as_binary)
        inputs.append(tensor)
    body, json_size = _get_inference_request(inputs, "", None, 0, False, False, 0, None, None)
    request, _ = decode(body, None if json_size is None else str(json_size))
    assert request.texts == tuple(TEXTS) and request.pairs == ("a", "ü", "c")


@pytest.mark.parametrize(("inputs", "words"), [
    ([{"name": "text_pair", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "expected the input 'text' once"),
    ([{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}] * 2, "expected the input 'text' once"),
    ([{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
      {"name": "text_pair", "datatype": "BYTES", "shape": [1], "data": ["c"]}], "'text_pair' holds 1 texts for 2"),
    ([{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]},
      {"name": "text_pair", "datatype": "FP32", "shape": [1], "data": [1.0]}], "'text_pair' must have datatype BYTES"),
    ([{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]},
      {"name": "query", "datatype": "BYTES", "shape": [1], "data": ["c"]}], "unknown input 'query'"),
])
def test_pair_inputs_that_do_not_fit_are_refused(inputs: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decode(dumps({"inputs": inputs}))
    assert error.value.code == "invalid_tensor" and words in error.value.message


def test_binary_sizes_of_two_inputs_must_add_up() -> None:
    first, second = kserve.serialize_bytes(["a"]), kserve.serialize_bytes(["b"])
    header = dumps({"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(first)}},
        {"name": "text_pair", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(second) + 1}},
    ]})
    with pytest.raises(InvalidRequestError) as error:
        decode(header + first + second, str(len(header)))
    assert error.value.code == "invalid_binary_data" and "'text_pair' declares 6 bytes" in error.value.message
    header = header.replace(b'"binary_data_size": 6', b'"binary_data_size": 5')
    request, _ = decode(header + first + second, str(len(header)))
    assert request.texts == ("a",) and request.pairs == ("b",)


def test_a_regression_model_answers_score_and_logits() -> None:
    body = dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]})
    request, outputs = kserve.decode_infer(body, None, max_texts=8, problem="regression")
    assert [o.name for o in outputs] == ["score", "logits"]
    result = result_for([[1.5], [-2.0]], ("LABEL_0",), problem="regression")
    answer = json.loads(kserve.encode_infer(result, request, outputs, "m")[0])
    assert answer["outputs"][0] == {"name": "score", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]}
    with pytest.raises(InvalidRequestError) as error:
        kserve.decode_infer(dumps({"inputs": json.loads(body)["inputs"], "outputs": [{"name": "label"}]}), None,
                            max_texts=8, problem="regression")
    assert error.value.code == "unknown_output" and "score, logits" in error.value.message
    meta = kserve.model_metadata("m", ("LABEL_0",), "regression", pairs=True)
    assert [i["name"] for i in meta["inputs"]] == ["text", "text_pair"]
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("score", [-1]), ("logits", [-1, 1])]


def test_a_shape_the_data_does_not_fill_says_how_many_elements_came() -> None:
    with pytest.raises(kserve.TensorError) as error:
        decode(json_request(shape=[3], data=["a"]), None)
    assert str(error.value) == "input 'text' has shape [3] (3 elements) but 1 element(s) were sent"


def test_a_huge_shape_is_not_echoed_whole_in_the_error() -> None:
    with pytest.raises(kserve.TensorError) as error:
        decode(json_request(shape=[1] * 100_000 + [2], data=["a"]), None)
    message = str(error.value)
    assert len(message) < 200 and message.startswith("input 'text' has shape [1, 1, ") and "...]" in message
