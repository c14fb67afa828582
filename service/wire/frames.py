"""`POST /v1/classify` with `Content-Type: application/x-glassbox-frames`: the compact binary framing.

A body is one or more frames, back to back:

    u32 little-endian text length | that many bytes of UTF-8 text | u64 little-endian user id

The pair variant, `Content-Type: application/x-glassbox-pair-frames`, carries two texts per frame (a cross-encoder's
input, or NLI's premise and hypothesis), each with its own length:

    u32 LE length | UTF-8 text | u32 LE length | UTF-8 second text | u64 LE user id

The parser walks a memoryview with `struct.unpack_from`, so the only copy of a text is the one into the `str`
the tokenizer needs. The response is JSON keyed by user id (`{"model", "results": {"<id>": {...}}}`), so two
frames with the same user id cannot both be answered: such a body is refused (`duplicate_user_id`, 400) rather
than one answer silently overwriting the other. Options (`top_k`, `all_scores`) come from the query string.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Sequence
from typing import Annotated

import msgspec

from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import EmptyInputError, InvalidRequestError, TooManyTextsError
from glassbox.service.types import ProblemType
from glassbox.service.wire.common import InvalidUtf8Error, ScoreOptions, check_options
from glassbox.service.wire.json_api import TextResult, text_results

CONTENT_TYPE = "application/x-glassbox-frames"
PAIR_CONTENT_TYPE = "application/x-glassbox-pair-frames"

_LENGTH = struct.Struct("<I")
_USER_ID = struct.Struct("<Q")
HEADER_BYTES = _LENGTH.size  # 4
ID_BYTES = _USER_ID.size  # 8
MAX_USER_ID = 2**64 - 1


class FrameError(InvalidRequestError):
    code = "invalid_frame"


class FrameTruncatedError(FrameError):
    """A frame's declared text length (plus its user id) runs past the end of the body."""

    code = "frame_truncated"


class FrameTrailingBytesError(FrameError):
    """Bytes left after the last whole frame, too few to be a frame header."""

    code = "frame_trailing_bytes"


class DuplicateUserIdError(FrameError):
    code = "duplicate_user_id"


class FramesResponse(msgspec.Struct):
    """One result per user id."""

    model: str
    results: Annotated[dict[str, TextResult], msgspec.Meta(
        description="keyed by user id, in decimal", extra_json_schema={"propertyNames": {"pattern": "^[0-9]+$"}})]


def decode(
    body: bytes | bytearray | memoryview, *, max_texts: int, options: ScoreOptions | None = None,
    pairs: bool = False, problem: ProblemType = "single_label_classification",
) -> ClassifyRequest:
    """Frames (pair frames with `pairs`) -> ClassifyRequest with `user_ids`. Stops at the first bad frame, and after
    `max_texts` frames."""
    view = memoryview(body).cast("B") if isinstance(body, memoryview) else memoryview(body)
    seconds: list[str] | None = None
    if pairs:
        texts, seconds, user_ids = _scan_pairs(view, max_texts)
    else:
        texts, user_ids = _scan(view, max_texts)
    if not texts:
        raise EmptyInputError("the body holds no frames: send at least one")
    if len(set(user_ids)) != len(user_ids):
        raise _duplicate(user_ids)
    defaults = options or ScoreOptions()
    return check_options(ClassifyRequest(
        texts=tuple(texts), user_ids=tuple(user_ids), top_k=defaults.top_k, all_scores=defaults.all_scores,
        threshold=defaults.threshold, pairs=None if seconds is None else tuple(seconds),
    ), problem)


def _scan(view: memoryview, max_texts: int) -> tuple[list[str], list[int]]:
    # The hot loop of the frames route: locals instead of attribute look-ups, and no per-frame bookkeeping
    # beyond the two appends (duplicates are found afterwards with one set()).
    unpack_length = _LENGTH.unpack_from
    unpack_id = _USER_ID.unpack_from
    # codecs.utf_8_decode reads the memoryview slice in place; str(view, "utf-8") is ~15% slower on short texts.
    utf8 = codecs.utf_8_decode
    texts: list[str] = []
    user_ids: list[int] = []
    size = len(view)
    offset = 0
    while offset < size:
        if size - offset < HEADER_BYTES:
            where = f"after frame {len(texts) - 1}" if texts else "before any frame"  # frames count from 0
            raise FrameTrailingBytesError(
                f"{size - offset} byte(s) {where} at offset {offset}: too few for a {HEADER_BYTES}-byte frame header"
            )
        if len(texts) == max_texts:
            raise TooManyTextsError(f"more than {max_texts} frames in one request; the limit is {max_texts} "
                                    "(--max-texts-per-request)")
        (length,) = unpack_length(view, offset)
        start = offset + HEADER_BYTES
        end = start + length
        if end + ID_BYTES > size:
            raise FrameTruncatedError(
                f"frame {len(texts)} at offset {offset} declares {length} text bytes and an {ID_BYTES}-byte user "
                f"id, but only {size - start} bytes remain"
            )
        try:
            texts.append(utf8(view[start:end], "strict", True)[0])
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                f"frame {len(texts)}: text is not valid UTF-8 (byte {start + exc.start} of the body: {exc.reason})"
            ) from None
        user_ids.append(unpack_id(view, end)[0])
        offset = end + ID_BYTES
    return texts, user_ids


def _scan_pairs(view: memoryview, max_texts: int) -> tuple[list[str], list[str], list[int]]:
    """Pair frames: each text is read by `_part`, which says which frame and which of its two texts went wrong."""
    texts: list[str] = []
    seconds: list[str] = []
    user_ids: list[int] = []
    offset, size = 0, len(view)
    while offset < size:
        if len(texts) == max_texts:
            raise TooManyTextsError(f"more than {max_texts} frames in one request; the limit is {max_texts} "
                                    "(--max-texts-per-request)")
        first, offset = _part(view, offset, len(texts), "text")
        second, offset = _part(view, offset, len(texts), "second text")
        if size - offset < ID_BYTES:
            raise FrameTruncatedError(f"frame {len(texts)} ends at offset {offset} without its {ID_BYTES}-byte user id")
        texts.append(first)
        seconds.append(second)
        user_ids.append(_USER_ID.unpack_from(view, offset)[0])
        offset += ID_BYTES
    return texts, seconds, user_ids


def _part(view: memoryview, offset: int, frame: int, what: str) -> tuple[str, int]:
    """One length-prefixed UTF-8 text of a pair frame at `offset` -> (the text, the offset after it)."""
    if len(view) - offset < HEADER_BYTES:
        raise FrameTrailingBytesError(
            f"frame {frame}: {len(view) - offset} byte(s) at offset {offset}, too few for the {HEADER_BYTES}-byte "
            f"length of its {what}"
        )
    (length,) = _LENGTH.unpack_from(view, offset)
    start, end = offset + HEADER_BYTES, offset + HEADER_BYTES + length
    if end > len(view):
        raise FrameTruncatedError(f"frame {frame}: its {what} declares {length} bytes at offset {offset}, but only "
                                  f"{len(view) - start} remain")
    try:
        return codecs.utf_8_decode(view[start:end], "strict", True)[0], end
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error(
            f"frame {frame}: its {what} is not valid UTF-8 (byte {start + exc.start} of the body: {exc.reason})"
        ) from None


def _duplicate(user_ids: list[int]) -> DuplicateUserIdError:
    first: dict[int, int] = {}
    for index, user_id in enumerate(user_ids):
        earlier = first.setdefault(user_id, index)
        if earlier != index:
            return DuplicateUserIdError(
                f"user id {user_id} appears in frames {earlier} and {index}; results are keyed by user id, so "
                "each frame needs its own"
            )
    raise AssertionError("called without a duplicate")


def encode_frames(texts: Sequence[str], user_ids: Sequence[int], pairs: Sequence[str] | None = None) -> bytes:
    """Texts and user ids (and second texts: a pair-frames body) -> a frames body. For clients, benchmarks and
    tests; raises ValueError on bad input."""
    if len(texts) != len(user_ids):
        raise ValueError(f"{len(texts)} texts but {len(user_ids)} user ids")
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(pairs)} second texts")
    parts: list[bytes] = []
    for index, (text, user_id) in enumerate(zip(texts, user_ids, strict=True)):
        if not 0 <= user_id <= MAX_USER_ID:
            raise ValueError(f"user id {user_id} does not fit in a u64")
        for part in (text,) if pairs is None else (text, pairs[index]):
            data = part.encode("utf-8")
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        parts.append(_USER_ID.pack(user_id))
    return b"".join(parts)


def encode_response(result: ClassifyResult, request: ClassifyRequest, model_name: str) -> bytes:
    if request.user_ids is None:
        raise ValueError("a frames response needs the request's user ids")
    rows = text_results(result, request)
    keyed = {str(user_id): row for user_id, row in zip(request.user_ids, rows, strict=True)}
    return msgspec.json.encode(FramesResponse(model=model_name, results=keyed))
