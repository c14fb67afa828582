"""Wire formats: pure decode (bytes -> ClassifyRequest) and encode (ClassifyResult -> bytes) functions.

ClassifyRequest and ClassifyResult themselves live in service/classification.py, beside the pipeline."""

from glassbox.service.wire.common import InvalidJsonError, InvalidUtf8Error, ScoreOptions, parse_query_options

__all__ = [
    "InvalidJsonError",
    "InvalidUtf8Error",
    "ScoreOptions",
    "parse_query_options",
]
