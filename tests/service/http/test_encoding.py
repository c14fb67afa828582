"""Request bodies with a Content-Encoding (service/http/encoding.py): inflated, capped, or refused with the reason."""

from __future__ import annotations

import gzip
import zlib

import pytest

from glassbox.service.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError, status_for
from glassbox.service.http.encoding import decoded_body

BODY = b'{"inputs": "a warm, funny film"}' * 4


@pytest.mark.parametrize(("coding", "encoded"), [
    (None, BODY), ("identity", BODY), ("gzip", gzip.compress(BODY)), ("GZip", gzip.compress(BODY)),
    ("x-gzip", gzip.compress(BODY)), ("deflate", zlib.compress(BODY)),  # what tritonclient sends for each
    ("deflate, gzip", gzip.compress(zlib.compress(BODY))),  # codings listed in the order they were applied
    ("gzip", gzip.compress(BODY[:50]) + gzip.compress(BODY[50:])),  # two members, as `cat a.gz b.gz` makes
])
def test_a_coded_body_is_inflated(coding: str | None, encoded: bytes) -> None:
    assert decoded_body(coding, encoded, len(BODY)) == BODY


def test_an_unknown_coding_is_415_naming_it() -> None:
    with pytest.raises(UnsupportedMediaTypeError) as error:
        decoded_body("br", BODY, 1 << 20)
    assert status_for(error.value) == 415 and "'br'" in error.value.message and "gzip, deflate" in error.value.message


def test_the_inflated_body_is_held_to_the_cap() -> None:
    bomb = gzip.compress(b"\0" * (10 << 20))  # ~10 KiB on the wire
    with pytest.raises(PayloadTooLargeError) as error:
        decoded_body("gzip", bomb, 4096)
    assert status_for(error.value) == 413 and "4096 bytes (--max-body-bytes)" in error.value.message
    assert decoded_body("gzip", gzip.compress(b"x" * 4096), 4096) == b"x" * 4096  # exactly at the cap is fine
    members = gzip.compress(b"x" * 3000) + gzip.compress(b"y" * 1097)  # the cap counts every member
    with pytest.raises(PayloadTooLargeError):
        decoded_body("gzip", members, 4096)


@pytest.mark.parametrize(("coding", "encoded", "words"), [
    ("gzip", BODY, "not valid gzip data"),
    ("deflate", gzip.compress(BODY), "not valid deflate data"),
    ("gzip", gzip.compress(BODY)[:-6], "ends before its stream does"),
    ("gzip", gzip.compress(BODY) + b"junk", "not valid gzip data"),  # what follows a member must be a member
    ("deflate", zlib.compress(BODY) + b"junk", "4 byte(s) follow the end"),
])
def test_bad_coded_data_is_400_with_the_reason(coding: str, encoded: bytes, words: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        decoded_body(coding, encoded, 1 << 20)
    assert status_for(error.value) == 400 and words in error.value.message
