"""Error types that carry a stable machine-readable code, and the one table that maps them to HTTP statuses."""

from __future__ import annotations


class GlassboxError(Exception):
    """Base of every error glassbox reports on purpose. `code` is stable; `message` is for humans."""

    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelLoadError(GlassboxError):
    """The model directory is missing, incomplete or inconsistent. Raised at start-up, never per request."""

    code = "model_load_error"


class UnsupportedArchitectureError(ModelLoadError):
    code = "unsupported_architecture"


class DeviceUnavailableError(GlassboxError):
    code = "device_unavailable"


class InvalidRequestError(GlassboxError):
    """The request body cannot be understood (bad JSON, wrong types, bad framing)."""

    code = "invalid_request"


class EmptyInputError(InvalidRequestError):
    code = "empty_input"


class TooManyTextsError(InvalidRequestError):
    code = "too_many_texts"


class PairsUnsupportedError(InvalidRequestError):
    """Text pairs were sent to a model whose tokenizer cannot join two texts."""

    code = "pairs_unsupported"


class NotARerankerError(GlassboxError):
    """`/rerank` on a model with more than one output: only a one-score head (a cross-encoder) ranks texts."""

    code = "not_a_reranker"


class TextTooLongError(GlassboxError):
    code = "text_too_long"


class PayloadTooLargeError(GlassboxError):
    code = "payload_too_large"


class HeaderTooLargeError(GlassboxError):
    code = "header_too_large"


class UnsupportedMediaTypeError(GlassboxError):
    code = "unsupported_media_type"


class NotFoundError(GlassboxError):
    code = "not_found"


class MethodNotAllowedError(GlassboxError):
    code = "method_not_allowed"


class RetryableError(GlassboxError):
    """The work was refused for now; the answer carries `Retry-After: retry_after_s` (whole seconds, at least 1)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverloadedError(RetryableError):
    """Admission control refused the work; the client should retry after `retry_after_s`."""

    code = "overloaded"


class EngineRestartingError(RetryableError):
    """The engine process went away (crashed, killed, restarting) while this request needed it."""

    code = "engine_restarting"


class NotReadyError(RetryableError):
    """Loading, draining or stopped: this instance cannot take the request now (Retry-After: 1 s by default)."""

    code = "not_ready"


class InvalidHttpError(GlassboxError):
    """Bytes the HTTP parser refuses: a bad request line, header or Content-Length, broken chunked framing."""

    code = "invalid_http"


class DeadlineExceededError(GlassboxError):
    code = "deadline_exceeded"


class RequestTimeoutError(GlassboxError):
    code = "request_timeout"


class EngineError(GlassboxError):
    code = "engine_error"


class ConfigurationError(GlassboxError):
    """Start-up configuration that cannot work (e.g. --chaos without a token). Raised before any socket opens."""

    code = "invalid_configuration"


class UnauthorizedError(GlassboxError):
    """A protected route was called without the right bearer token. Answered with `WWW-Authenticate: Bearer`."""

    code = "unauthorized"
    challenge = "Bearer"


class ChaosInvalidFaultError(GlassboxError):
    """A fault spec sent to the chaos control API is malformed; the message names the field."""

    code = "chaos_invalid_fault"


class ChaosUnsupportedError(GlassboxError):
    """A valid fault this server cannot inject where it runs (a GPU-only fault on a CPU engine)."""

    code = "chaos_unsupported"


class ChaosTooManyFaultsError(GlassboxError):
    """A valid fault, refused because the server already holds as many armed faults as it allows."""

    code = "chaos_too_many_faults"


class ChaosFaultNotFoundError(GlassboxError):
    """No armed fault has that id (it never existed, or it was disarmed or expired)."""

    code = "chaos_fault_not_found"


# The one table. Order matters: the first matching base class wins, so subclasses come first.
STATUS_BY_ERROR: tuple[tuple[type[GlassboxError], int], ...] = (
    (UnsupportedArchitectureError, 500),
    (ModelLoadError, 500),
    (TextTooLongError, 413),
    (PayloadTooLargeError, 413),
    (HeaderTooLargeError, 431),
    (TooManyTextsError, 413),
    (EmptyInputError, 422),
    (PairsUnsupportedError, 400),
    (InvalidRequestError, 400),
    (InvalidHttpError, 400),
    (UnsupportedMediaTypeError, 415),
    (NotFoundError, 404),
    (ChaosFaultNotFoundError, 404),
    (UnauthorizedError, 401),
    (NotARerankerError, 424),  # as TEI answers /rerank on a classifier
    (ChaosUnsupportedError, 409),
    (ChaosTooManyFaultsError, 409),
    (ChaosInvalidFaultError, 422),
    (MethodNotAllowedError, 405),
    (RequestTimeoutError, 408),
    (OverloadedError, 429),
    (DeadlineExceededError, 504),
    (NotReadyError, 503),
    (EngineRestartingError, 503),
    (DeviceUnavailableError, 503),
    (EngineError, 500),
    (ConfigurationError, 500),
)


_BY_CODE: dict[str, type[GlassboxError]] = {kind.code: kind for kind, _ in STATUS_BY_ERROR}


def rebuild(code: str, message: str, retry_after_s: float = 0.0) -> GlassboxError:
    """The error another process reported by its code (the engine process to an HTTP worker), as its own type, so
    that it maps to the same status. An unknown code keeps its code on an EngineError."""
    kind = _BY_CODE.get(code)
    if kind is None:
        error: GlassboxError = EngineError(message)
        error.code = code
        return error
    if issubclass(kind, RetryableError):
        return kind(message, retry_after_s or 1.0)
    return kind(message)


def status_for(error: GlassboxError) -> int:
    for kind, status in STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 500
