"""Wire formats: pure decode (bytes -> ClassifyRequest) and encode (ClassifyResult -> bytes) functions."""

from service.wire.common import (
    ClassifyRequest,
    ClassifyResult,
    InvalidJsonError,
    InvalidUtf8Error,
    ScoreOptions,
    parse_query_options,
    probabilities,
    softmax,
)

__all__ = [
    "ClassifyRequest",
    "ClassifyResult",
    "InvalidJsonError",
    "InvalidUtf8Error",
    "ScoreOptions",
    "parse_query_options",
    "probabilities",
    "softmax",
]
