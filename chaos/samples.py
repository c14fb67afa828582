"""What the load generator records per request, shared by the generator, the experiment runner and its reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Why a request did not succeed. None on a Sample means a 2xx answer.
ErrorKind = Literal[
    "http_429",  # shed by admission control (the server said "later", with Retry-After)
    "http_4xx",  # any other client error: a bad request from the generator is a bug worth seeing
    "http_5xx",  # the server failed the request
    "timeout",  # no full answer within the generator's per-request timeout
    "connect",  # the connection could not be opened (refused, reset during connect)
    "transport",  # the connection broke while sending or reading
    "backlog",  # the generator itself fell behind: too many requests outstanding, this one was never sent
]
ERROR_KINDS: tuple[ErrorKind, ...] = ("http_429", "http_4xx", "http_5xx", "timeout", "connect", "transport", "backlog")


def error_kind_for_status(status: int) -> ErrorKind | None:
    if 200 <= status < 300:
        return None
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    return "http_5xx"


@dataclass(frozen=True, slots=True)
class Sample:
    """One request of an open-loop run. Times are seconds from the start of the run."""

    intended_s: float  # when the schedule said to send it; latency counts from here (no coordinated omission)
    latency_s: float  # intended send time to the last byte of the answer (or to the failure)
    status: int  # HTTP status, 0 when there was no answer
    error: ErrorKind | None  # None: a 2xx answer

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def done_s(self) -> float:
        return self.intended_s + self.latency_s
