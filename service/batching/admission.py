"""Admission control: whether one more request may wait in the queue, and the error that says why not."""

from __future__ import annotations

from service.batching.limits import BatcherLimits
from service.batching.records import REJECT_DRAINING, REJECT_QUEUE_REQUESTS, REJECT_QUEUE_TOKENS
from service.batching.throughput import retry_after_s
from service.errors import GlassboxError, NotReadyError, OverloadedError


def refusal(
    limits: BatcherLimits, draining: bool, queued_requests: int, queued_tokens: int, tokens: int
) -> str | None:
    """The REJECT_* reason a request of `tokens` real tokens is refused for, or None to admit it."""
    if draining:
        return REJECT_DRAINING
    if queued_requests + 1 > limits.max_queue_requests:
        return REJECT_QUEUE_REQUESTS
    # An empty queue takes any request, so one larger than the whole token bound is served rather than
    # refused forever with a Retry-After that could never come true.
    if queued_tokens and queued_tokens + tokens > limits.max_queue_tokens:
        return REJECT_QUEUE_TOKENS
    return None


def refusal_error(
    reason: str, limits: BatcherLimits, queued_requests: int, queued_tokens: int, tokens: int, tokens_per_s: float
) -> GlassboxError:
    """Draining is a 503 (this instance is going away); a full queue is a 429 with a Retry-After estimate
    of how long the engine needs to clear what is queued now, at its measured rate."""
    if reason == REJECT_DRAINING:
        return NotReadyError("the server is draining and accepts no new work")
    if reason == REJECT_QUEUE_REQUESTS:
        detail = f"{queued_requests} requests queued, limit {limits.max_queue_requests}"
    else:
        detail = f"{queued_tokens} tokens queued, this request adds {tokens}, limit {limits.max_queue_tokens}"
    return OverloadedError(f"the queue is full ({detail})", retry_after_s(queued_tokens, tokens_per_s))
