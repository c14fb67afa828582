"""Request bodies sent with a `Content-Encoding`: undone before any wire format reads them.

tritonclient compresses a request when asked (`request_compression_algorithm="gzip"` or `"deflate"`, which is the
zlib format, as RFC 9110 defines it), and Triton inflates it; read as it came, such a body is refused with a
misleading reason (`Inference-Header-Content-Length` larger than the body, or JSON that is not JSON). Any other
coding is refused with 415, as RFC 9110 (8.4.1) allows, rather than misread.

The inflated body is held to the same `--max-body-bytes` cap as a plain one: the guard bounds only the bytes on the
wire, and a few kilobytes of gzip can inflate to gigabytes.
"""

from __future__ import annotations

import zlib

from glassbox.service.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

# The window bits zlib needs per coding: 16 + 15 reads a gzip header and trailer, 15 the zlib format.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPTED = "gzip, deflate"


def decoded_body(content_encoding: str | None, body: bytes, limit: int) -> bytes:
    """`body` with the codings `content_encoding` names undone (the last one applied is undone first)."""
    if content_encoding is None:
        return body
    codings = [coding.strip().lower() for coding in content_encoding.split(",")]
    for coding in reversed(codings):
        if coding in ("identity", ""):
            continue
        wbits = _WBITS.get(coding)
        if wbits is None:
            raise UnsupportedMediaTypeError(
                f"Content-Encoding {coding[:40]!r} is not supported; send the body as it is, or with {ACCEPTED}")
        body = _inflate(body, coding, wbits, limit)
    return body


def _inflate(data: bytes, coding: str, wbits: int, limit: int) -> bytes:
    """One coding undone. A gzip body may hold several members one after another (RFC 1952, as `cat a.gz b.gz`
    makes): each is inflated in turn, the cap counting them all; deflate is one stream."""
    parts: list[bytes] = []
    size = 0
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(data, limit - size + 1)  # one byte past the cap tells "over" from "exactly at"
        except zlib.error as exc:
            raise InvalidRequestError(f"the body is not valid {coding} data ({exc})") from None
        size += len(out)
        if size > limit or inflater.unconsumed_tail:
            raise PayloadTooLargeError(f"the body inflates to more than {limit} bytes (--max-body-bytes)")
        if not inflater.eof:
            raise InvalidRequestError(f"the body's {coding} data ends before its stream does")
        parts.append(out)
        data = inflater.unused_data
        if not data:
            return b"".join(parts)
        if wbits != _WBITS["gzip"]:
            raise InvalidRequestError(f"{len(data)} byte(s) follow the end of the body's {coding} stream")
