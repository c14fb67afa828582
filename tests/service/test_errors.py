"""The one error table: each error type's HTTP status and stable code."""

from __future__ import annotations

import re

import pytest

from service import errors
from service.errors import STATUS_BY_ERROR, GlassboxError, status_for

# The intended status of every error type, written out independently of the table in service/errors.py.
# Adding an error type without deciding its status here fails test_every_error_type_is_listed.
INTENDED: dict[type[GlassboxError], tuple[str, int]] = {
    errors.ModelLoadError: ("model_load_error", 500),
    errors.UnsupportedArchitectureError: ("unsupported_architecture", 500),
    errors.DeviceUnavailableError: ("device_unavailable", 503),
    errors.InvalidRequestError: ("invalid_request", 400),
    errors.EmptyInputError: ("empty_input", 422),
    errors.TooManyTextsError: ("too_many_texts", 413),
    errors.TextTooLongError: ("text_too_long", 413),
    errors.PayloadTooLargeError: ("payload_too_large", 413),
    errors.HeaderTooLargeError: ("header_too_large", 431),
    errors.UnsupportedMediaTypeError: ("unsupported_media_type", 415),
    errors.NotFoundError: ("not_found", 404),
    errors.MethodNotAllowedError: ("method_not_allowed", 405),
    errors.OverloadedError: ("overloaded", 429),
    errors.DeadlineExceededError: ("deadline_exceeded", 504),
    errors.RequestTimeoutError: ("request_timeout", 408),
    errors.NotReadyError: ("not_ready", 503),
    errors.EngineRestartingError: ("engine_restarting", 503),
    errors.EngineError: ("engine_error", 500),
    errors.ConfigurationError: ("invalid_configuration", 500),
    errors.UnauthorizedError: ("unauthorized", 401),
    errors.ChaosInvalidFaultError: ("chaos_invalid_fault", 422),
    errors.ChaosUnsupportedError: ("chaos_unsupported", 409),
    errors.ChaosFaultNotFoundError: ("chaos_fault_not_found", 404),
    errors.PairsUnsupportedError: ("pairs_unsupported", 400),
    errors.NotARerankerError: ("not_a_reranker", 424),
}
CLIENT_ERRORS = {
    errors.InvalidRequestError, errors.EmptyInputError, errors.TooManyTextsError, errors.TextTooLongError,
    errors.PayloadTooLargeError, errors.HeaderTooLargeError, errors.UnsupportedMediaTypeError, errors.NotFoundError,
    errors.MethodNotAllowedError, errors.OverloadedError, errors.RequestTimeoutError, errors.UnauthorizedError,
    errors.ChaosInvalidFaultError, errors.ChaosUnsupportedError, errors.ChaosFaultNotFoundError,
    errors.PairsUnsupportedError, errors.NotARerankerError,
}


def _subclasses(kind: type[GlassboxError]) -> set[type[GlassboxError]]:
    found = set(kind.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_error_type_is_listed() -> None:
    # Only the types defined in service.errors that name a code of their own (RetryableError is a base only):
    # other packages may subclass them and inherit their status.
    defined = {k for k in _subclasses(GlassboxError) if k.__module__ == errors.__name__ and "code" in vars(k)}
    assert defined == set(INTENDED)
    assert {kind for kind, _ in STATUS_BY_ERROR} == set(INTENDED)


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind.__name__) for kind in INTENDED])
def test_status_and_code(kind: type[GlassboxError]) -> None:
    code, status = INTENDED[kind]
    error = kind("something went wrong")
    assert status_for(error) == status
    assert error.code == code
    assert error.message == str(error) == "something went wrong"
    assert (400 <= status < 500) == (kind in CLIENT_ERRORS)


def test_codes_are_unique_snake_case() -> None:
    codes = [kind.code for kind in INTENDED]
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


@pytest.mark.parametrize("kind", [pytest.param(kind, id=kind.__name__) for kind in INTENDED])
def test_an_error_reported_by_code_is_rebuilt_as_its_own_type(kind: type[GlassboxError]) -> None:
    rebuilt = errors.rebuild(INTENDED[kind][0], "from the engine process", 7.0)
    assert type(rebuilt) is kind and rebuilt.message == "from the engine process"
    assert status_for(rebuilt) == INTENDED[kind][1]
    if isinstance(rebuilt, errors.RetryableError):
        assert rebuilt.retry_after_s == 7.0


def test_an_unknown_code_is_rebuilt_as_an_engine_error_that_keeps_it() -> None:
    rebuilt = errors.rebuild("something_new", "a newer engine said so")
    assert isinstance(rebuilt, errors.EngineError) and rebuilt.code == "something_new"
    assert status_for(rebuilt) == 500
