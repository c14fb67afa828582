"""The one error table: each error type's HTTP status and stable code."""

from __future__ import annotations

import re

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from glassbox.service import errors
from glassbox.service.errors import STATUS_BY_ERROR, GlassboxError, status_for
from glassbox.service.http.errors import glassbox_exception

# Statuses are read from the one table (service/errors.py), not copied here: the tests below check how the table
# behaves (who can fix the error decides 4xx or 5xx, retryable errors say when to retry, codes survive the trip
# between processes, the app answers with them) instead of restating it.
KINDS = [kind for kind, _ in STATUS_BY_ERROR]
CLIENT_ERRORS = {
    errors.InvalidRequestError, errors.EmptyInputError, errors.TooManyTextsError, errors.TextTooLongError,
    errors.PayloadTooLargeError, errors.HeaderTooLargeError, errors.UnsupportedMediaTypeError, errors.NotFoundError,
    errors.MethodNotAllowedError, errors.OverloadedError, errors.RequestTimeoutError, errors.UnauthorizedError,
    errors.ChaosInvalidFaultError, errors.ChaosUnsupportedError, errors.ChaosTooManyFaultsError,
    errors.ChaosFaultNotFoundError,
    errors.PairsUnsupportedError, errors.NotARerankerError, errors.InvalidHttpError,
}


def _subclasses(kind: type[GlassboxError]) -> set[type[GlassboxError]]:
    found = set(kind.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_error_type_is_listed() -> None:
    # Only the types defined in glassbox.service.errors that name a code of their own (RetryableError is a base only):
    # other packages may subclass them and inherit their status.
    defined = {k for k in _subclasses(GlassboxError) if k.__module__ == errors.__name__ and "code" in vars(k)}
    assert defined == set(KINDS)


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind.__name__) for kind in KINDS])
def test_the_status_says_who_can_fix_it(kind: type[GlassboxError]) -> None:
    error = kind("something went wrong")
    status = status_for(error)
    assert error.message == str(error) == "something went wrong"
    assert (400 <= status < 500) == (kind in CLIENT_ERRORS), f"{kind.__name__} answers {status}"
    if isinstance(error, errors.RetryableError):  # the client should come back later: 429 or 503, never a 4xx to fix
        assert status in (429, 503)
    if kind in CLIENT_ERRORS:
        assert status != 429 or isinstance(error, errors.RetryableError)


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind.__name__) for kind in KINDS])
def test_the_app_answers_an_error_with_its_status_code_and_retry_after(kind: type[GlassboxError]) -> None:
    """What a client sees when a route raises it: the table's status, `{"error": {"code", "message"}}`, and
    Retry-After for a retryable error."""

    async def route(request: Request) -> Response:
        if issubclass(kind, errors.RetryableError):
            raise kind("try later", retry_after_s=3.4)
        raise kind("nope")

    app = Starlette(routes=[Route("/", route)], exception_handlers={GlassboxError: glassbox_exception})
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get("/")
    assert answer.status_code == status_for(kind("x"))
    assert answer.json()["error"]["code"] == kind.code
    if issubclass(kind, errors.RetryableError):
        assert answer.headers["Retry-After"] == "3"  # whole seconds
    else:
        assert "Retry-After" not in answer.headers


def test_codes_are_unique_snake_case() -> None:
    codes = [kind.code for kind in KINDS]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", code) for code in codes)


def test_subclasses_come_before_their_bases_in_the_table() -> None:
    kinds = [kind for kind, _ in STATUS_BY_ERROR]
    for i, kind in enumerate(kinds):
        assert not any(issubclass(later, kind) for later in kinds[i + 1:]), kind.__name__


def test_unlisted_errors_are_500() -> None:
    assert status_for(GlassboxError("?")) == 500
    assert GlassboxError("?").code == "internal_error"


def test_overloaded_carries_retry_after() -> None:
    assert errors.OverloadedError("busy").retry_after_s == 1.0
    assert errors.OverloadedError("busy", retry_after_s=2.5).retry_after_s == 2.5


def test_retryable_errors_carry_retry_after() -> None:
    assert errors.EngineRestartingError("restarting", retry_after_s=3.0).retry_after_s == 3.0
    assert isinstance(errors.OverloadedError("busy"), errors.RetryableError)


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind.__name__) for kind in KINDS])
def test_an_error_reported_by_code_is_rebuilt_as_its_own_type(kind: type[GlassboxError]) -> None:
    rebuilt = errors.rebuild(kind.code, "from the engine process", 7.0)
    assert type(rebuilt) is kind and rebuilt.message == "from the engine process"
    assert status_for(rebuilt) == status_for(kind("x"))
    if isinstance(rebuilt, errors.RetryableError):
        assert rebuilt.retry_after_s == 7.0


def test_an_unknown_code_is_rebuilt_as_an_engine_error_that_keeps_it() -> None:
    rebuilt = errors.rebuild("something_new", "a newer engine said so")
    assert isinstance(rebuilt, errors.EngineError) and rebuilt.code == "something_new"
    assert status_for(rebuilt) == 500
