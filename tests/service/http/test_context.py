"""service/http/context.py: what a request's headers say about it."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from glassbox.service.errors import InvalidRequestError
from glassbox.service.http.context import deadline_of


def request_with(headers: dict[str, str]) -> Request:
    raw = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@pytest.mark.parametrize("value", ["soon" * 4000, "9" * 16000])
def test_a_bad_timeout_header_is_quoted_only_in_part(value: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        deadline_of(request_with({"X-Request-Timeout-Ms": value}), 10_000, 0)
    assert len(error.value.message) < 150 and value[:40] in error.value.message


def test_a_timeout_header_sets_the_deadline_from_the_start() -> None:
    assert deadline_of(request_with({"X-Request-Timeout-Ms": "2.5"}), 10_000, 1_000) == 1_000 + 2_500_000
    assert deadline_of(request_with({}), 10_000, 1_000) == 1_000 + 10_000 * 1_000_000
