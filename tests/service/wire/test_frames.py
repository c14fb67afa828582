from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError, status_for
from glassbox.service.wire import frames
from glassbox.service.wire.common import InvalidUtf8Error, ScoreOptions
from tests.service.wire.builders import only_client_errors, result_for


def frame(text: bytes, user_id: int, declared: int | None = None) -> bytes:
    return struct.pack("<I", len(text) if declared is None else declared) + text + struct.pack("<Q", user_id)


def decode(body: bytes | bytearray | memoryview, max_texts: int = 16) -> ClassifyRequest:
    return frames.decode(body, max_texts=max_texts)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 2**64 - 1), st.text(max_size=40), min_size=1, max_size=16))
def test_encode_then_decode_round_trips(by_user: dict[int, str]) -> None:
    user_ids, texts = list(by_user), list(by_user.values())
    request = decode(frames.encode_frames(texts, user_ids))
    assert request.texts == tuple(texts)
    assert request.user_ids == tuple(user_ids)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_give_frames_or_a_client_error(body: bytes) -> None:
    only_client_errors(lambda b: decode(b, max_texts=4), body)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=12), st.integers(0, 2**64 - 1)), min_size=1, max_size=5), st.data())
def test_well_framed_random_bytes_give_frames_or_a_client_error(
    parts: list[tuple[bytes, int]], data: st.DataObject
) -> None:
    body = b"".join(frame(text, uid) for text, uid in parts)
    cut = data.draw(st.integers(0, len(body)))
    only_client_errors(decode, body[:cut])


def test_decodes_from_memoryview_and_bytearray_slices() -> None:
    body = frames.encode_frames(["héllo", ""], [7, 2**64 - 1])
    padded = b"junk" + body + b"junk"
    assert decode(memoryview(padded)[4:-4]).texts == ("héllo", "")
    assert decode(bytearray(body)).user_ids == (7, 2**64 - 1)


def test_empty_body_is_empty_input() -> None:
    with pytest.raises(EmptyInputError) as error:
        decode(b"")
    assert error.value.code == "empty_input" and status_for(error.value) == 422


def test_length_beyond_the_body_is_frame_truncated() -> None:
    body = frame(b"abc", 1) + frame(b"abcdef", 2, declared=1000)
    with pytest.raises(frames.FrameTruncatedError) as error:
        decode(body)
    assert error.value.code == "frame_truncated" and status_for(error.value) == 400
    assert "frame 1" in error.value.message and "1000" in error.value.message


def test_a_missing_user_id_is_frame_truncated() -> None:
    body = frame(b"abc", 1)[:-3]
    with pytest.raises(frames.FrameTruncatedError):
        decode(body)


@pytest.mark.parametrize("extra", [b"\x00", b"\x01\x02", b"\xff\xff\xff"])
def test_trailing_bytes_shorter_than_a_header(extra: bytes) -> None:
    with pytest.raises(frames.FrameTrailingBytesError) as error:
        decode(frame(b"ok", 1) + extra)
    assert error.value.code == "frame_trailing_bytes" and status_for(error.value) == 400
    assert f"{len(extra)} byte(s) after frame 0 at offset 14:" in error.value.message  # 4 + 2 + 8 bytes


def test_a_body_too_short_for_one_header_names_no_frame() -> None:
    with pytest.raises(frames.FrameTrailingBytesError) as error:
        decode(b"\x01\x02\x03")
    assert error.value.message.startswith("3 byte(s) before any frame at offset 0:")  # not "after frame -1"


@pytest.mark.parametrize("text", [b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf"])
def test_invalid_utf8_names_the_frame(text: bytes) -> None:
    with pytest.raises(InvalidUtf8Error) as error:
        decode(frame(b"fine", 1) + frame(text, 2))
    assert error.value.code == "invalid_utf8" and status_for(error.value) == 400
    assert "frame 1" in error.value.message


def test_too_many_frames_stops_early() -> None:
    body = frames.encode_frames(["t"] * 3, [1, 2, 3]) + b"\xff" * 7  # the garbage after frame 3 is never reached
    with pytest.raises(TooManyTextsError) as error:
        decode(body, max_texts=2)
    assert status_for(error.value) == 413
    assert len(decode(frames.encode_frames(["t"] * 2, [1, 2]), max_texts=2).texts) == 2


def test_duplicate_user_ids_are_refused_naming_both_frames() -> None:
    body = frames.encode_frames(["a", "b", "c"], [5, 6, 5])
    with pytest.raises(frames.DuplicateUserIdError) as error:
        decode(body)
    assert error.value.code == "duplicate_user_id" and status_for(error.value) == 400
    assert "user id 5" in error.value.message and "frames 0 and 2" in error.value.message


def test_options_come_from_the_caller() -> None:
    request = frames.decode(frames.encode_frames(["a"], [1]), max_texts=1, options=ScoreOptions(top_k=2))
    assert request.top_k == 2 and request.all_scores is False


def test_encode_frames_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="2 texts but 1 user ids"):
        frames.encode_frames(["a", "b"], [1])
    with pytest.raises(ValueError, match="u64"):
        frames.encode_frames(["a"], [2**64])
    with pytest.raises(ValueError, match="u64"):
        frames.encode_frames(["a"], [-1])


def test_encode_frames_layout_is_exactly_the_documented_one() -> None:
    assert frames.encode_frames(["hé"], [258]) == b"\x03\x00\x00\x00h\xc3\xa9\x02\x01\x00\x00\x00\x00\x00\x00"


def test_response_is_keyed_by_user_id_in_request_order() -> None:
    request = ClassifyRequest(texts=("a", "b"), user_ids=(2**64 - 1, 3), top_k=1)
    result = result_for([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0]], tokens=[3, 4])
    body = json.loads(frames.encode_response(result, request, "tiny"))
    assert body["model"] == "tiny"
    assert list(body["results"]) == [str(2**64 - 1), "3"]
    assert body["results"]["3"]["label"] == "negative" and body["results"]["3"]["tokens"] == 4
    assert [s["label"] for s in body["results"][str(2**64 - 1)]["scores"]] == ["positive"]


def test_pair_frames_round_trip() -> None:
    body = frames.encode_frames(["what is it?", "é"], [7, 2**64 - 1], pairs=["a film", ""])
    request = frames.decode(body, max_texts=8, pairs=True)
    assert request.texts == ("what is it?", "é") and request.pairs == ("a film", "")
    assert request.user_ids == (7, 2**64 - 1)


@pytest.mark.parametrize(("body", "code", "words"), [
    (struct.pack("<I", 1) + b"a", "frame_trailing_bytes", "length of its second text"),
    (struct.pack("<I", 1) + b"a" + struct.pack("<I", 5) + b"ab", "frame_truncated", "its second text declares 5"),
    (struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b" + b"\x00" * 7, "frame_truncated", "user id"),
    (struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"\xff" + b"\x00" * 8, "invalid_utf8", "second text"),
])
def test_broken_pair_frames_say_which_text(body: bytes, code: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        frames.decode(body, max_texts=8, pairs=True)
    assert error.value.code == code and words in error.value.message


def test_pair_frames_count_against_the_limit() -> None:
    body = frames.encode_frames(["a"] * 3, [1, 2, 3], pairs=["b"] * 3)
    with pytest.raises(InvalidRequestError) as error:
        frames.decode(body, max_texts=2, pairs=True)
    assert error.value.code == "too_many_texts"
