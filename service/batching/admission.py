"""Admission control: whether one more request may wait in the queue, and the error that says why not.

The main rule is the wait a request would face: what is queued ahead of it, run as the batches it will make at the
engine's measured cost on the device serving now (a fixed part per batch and a part per real token, fitted to the
batches it ran; the CPU fallback included: the fit restarts when the device changes), plus what is left of the batch
running now. A request is refused when that wait exceeds the queue-wait bound (`--max-queue-wait-ms`), or when the
wait and its own run would end after its deadline: answering 429 at once beats answering 504 later. When nothing
would delay it (an engine thread is free and no full batch is queued ahead), nothing refuses a request for its
deadline: it runs (only running corrects a cost estimate that has gone stale), and what is still queued at its
deadline is dropped (504). The wait bound applies only once a full batch's worth of rows (`--max-batch-size`) is
queued or in the engine: below that floor a request is refused only for its deadline, so a closed loop of that many
clients (who each wait for an answer before sending again) is never refused, however slow the engine. Refusing them
would not shorten anyone's wait, and clients that retry at once without reading `Retry-After` turn such refusals
into a storm that takes the CPU the engine needs. Heavy overload shows itself by the bound refusing at least as many
requests as are admitted (`ShedMeter`, over about the last quarter of a second). While it does, the server sheds: the
floor is lower, a full batch queued for the next engine thread to come free, and the bound covers a request's whole
predicted stay instead of its wait alone (`BatcherLimits.while_shedding`: a third of it for the wait, two thirds to
cap the batch it rides). The engine threads then still always find a batch waiting, and an admitted request waits
about one short batch and runs in one, instead of queueing behind `--max-batch-size` rows in batches of up to
`--max-batch-time-ms` (on a small CPU host that was several tenths of a second for every admitted request, over the
latency SLO). A closed loop within the floor is never refused by the bound, so it never starts shedding; a server
refusing a few requests in a burst at moderate load admits far more than it refuses, so it does not either. The
request and token counts are hard caps behind it, for the time before anything was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from glassbox.service.batching.cost import Cost
from glassbox.service.batching.limits import BatcherLimits
from glassbox.service.batching.records import (
    REJECT_DRAINING,
    REJECT_PREDICTED_WAIT,
    REJECT_QUEUE_REQUESTS,
    REJECT_QUEUE_TOKENS,
)
from glassbox.service.errors import GlassboxError, NotReadyError, OverloadedError

RETRY_AFTER_CEILING_S = 60.0


def predicted_wait_s(queued_items: int, queued_tokens: int, max_batch_size: int, cost: Cost | None,
                     first_free_s: float, runners: int = 1) -> float | None:
    """Seconds until a request admitted now starts running; None before the engine's cost was measured.

    It starts once an engine thread is free (`first_free_s`) and the full batches ahead of it have run: the queued
    rows fill batches of `max_batch_size`, and those that do not fill one ride in the new request's own batch, so
    they do not delay it. A full batch costs the fixed part once and its share of the queued tokens; `runners`
    engine threads run them side by side."""
    if cost is None:
        return None
    ahead = queued_items // max_batch_size  # full batches that run before the new request's own
    if ahead == 0:
        return first_free_s
    tokens_ahead = queued_tokens * (ahead * max_batch_size) / queued_items
    return (ahead * cost.fixed_ns + tokens_ahead * cost.per_token_ns) / 1e9 / runners + first_free_s


def refusal(
    limits: BatcherLimits, draining: bool, queued_requests: int, queued_tokens: int, tokens: int,
    wait_s: float | None = None, own_s: float = 0.0, deadline_left_s: float = math.inf, queue_ahead: bool = True,
) -> str | None:
    """The REJECT_* reason a request of `tokens` real tokens is refused for, or None to admit it.

    `wait_s` is the predicted wait (None: not measured yet), `own_s` the request's own predicted run time and
    `deadline_left_s` what is left of its deadline. `queue_ahead` says whether a full batch's worth of rows is queued
    or in the engine ahead of the request: below that floor a slow engine only refuses what would miss its deadline."""
    if draining:
        return REJECT_DRAINING
    if queued_requests + 1 > limits.max_queue_requests:
        return REJECT_QUEUE_REQUESTS
    # An empty queue takes any request, so one larger than the whole token bound is served rather than
    # refused forever with a Retry-After that could never come true.
    if queued_tokens and queued_tokens + tokens > limits.max_queue_tokens:
        return REJECT_QUEUE_TOKENS
    # Nothing ahead (no wait) refuses nothing: the request runs, which is also how a cost estimate gone stale (too
    # slow) is corrected; a refused request would never show the engine is faster now.
    if wait_s is not None and wait_s > 0.0 and (
        (queue_ahead and wait_s > limits.max_queue_wait_s) or wait_s + own_s > deadline_left_s
    ):
        return REJECT_PREDICTED_WAIT
    return None


class ShedMeter:
    """Whether the server is shedding heavy overload: over about the last `window_s` (counts decaying exponentially
    with that time constant), the queue-wait bound refused at least as many requests as were admitted, and at least
    one. Not thread-safe: the batcher calls it under its lock."""

    __slots__ = ("_admitted", "_at_ns", "_refused")

    def __init__(self) -> None:
        self._at_ns = 0
        self._admitted = 0.0
        self._refused = 0.0

    def admitted(self, now_ns: int, window_s: float) -> None:
        self._decay(now_ns, window_s)
        self._admitted += 1.0

    def refused(self, now_ns: int, window_s: float) -> None:
        self._decay(now_ns, window_s)
        self._refused += 1.0

    def shedding(self, now_ns: int, window_s: float) -> bool:
        self._decay(now_ns, window_s)
        return self._refused >= max(self._admitted, 1.0)

    def _decay(self, now_ns: int, window_s: float) -> None:
        if window_s <= 0.0:
            self._admitted = self._refused = 0.0
        elif now_ns > self._at_ns:
            keep = math.exp(-(now_ns - self._at_ns) / (window_s * 1e9))
            self._admitted *= keep
            self._refused *= keep
        self._at_ns = max(self._at_ns, now_ns)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One admission decision, with what its refusal's message needs."""

    reason: str | None  # a REJECT_* reason, or None: admitted
    limits: BatcherLimits
    queued_requests: int
    queued_tokens: int
    wait_s: float | None  # the predicted wait; None before the engine's cost was measured
    own_s: float = 0.0  # the request's own predicted run
    deadline_left_s: float = math.inf
    shedding: bool = False  # judged while shedding heavy overload, under `limits` (BatcherLimits.while_shedding)

    def error(self, tokens: int) -> GlassboxError:
        """The refusal for a request of `tokens` real tokens (0: judged before it was tokenized)."""
        assert self.reason is not None
        return refusal_error(self.reason, self.limits, self.queued_requests, self.queued_tokens, tokens, self.wait_s,
                             self.own_s, self.deadline_left_s, self.shedding)


def retry_after_s(wait_s: float | None) -> float:
    """Whole seconds after which the queue should have room: the predicted wait rounded up, at least 1 and at most
    RETRY_AFTER_CEILING_S (one slow cold batch must not send clients away for minutes)."""
    if wait_s is None or wait_s <= 0.0:
        return 1.0
    return float(min(max(math.ceil(wait_s), 1), RETRY_AFTER_CEILING_S))


def refusal_error(
    reason: str, limits: BatcherLimits, queued_requests: int, queued_tokens: int, tokens: int,
    wait_s: float | None, own_s: float = 0.0, deadline_left_s: float = math.inf, shedding: bool = False,
) -> GlassboxError:
    """Draining is a 503 (this instance is going away); everything else is a 429 whose Retry-After follows the
    predicted wait. A refusal by predicted wait says which limit it hit: the request's deadline, or the bound (and
    whether it was the bound's share while shedding heavy overload)."""
    if reason == REJECT_DRAINING:
        return NotReadyError("the server is draining and accepts no new work")
    if reason == REJECT_PREDICTED_WAIT:
        wait = (wait_s or 0.0) * 1000
        if wait_s is not None and wait_s + own_s > deadline_left_s:
            detail = (f"the predicted wait of {wait:.0f} ms and the request's own {own_s * 1000:.0f} ms would end "
                      f"after its deadline, {max(0.0, deadline_left_s) * 1000:.0f} ms away")
        elif shedding:
            detail = (f"the predicted wait is {wait:.0f} ms, over the {limits.max_queue_wait_s * 1000:.0f} ms the "
                      "server allows while it sheds heavy overload (a third of --max-queue-wait-ms)")
        else:
            detail = (f"the predicted wait is {wait:.0f} ms, over the {limits.max_queue_wait_s * 1000:.0f} ms bound "
                      "(--max-queue-wait-ms)")
        return OverloadedError(f"the server is overloaded: {detail}", retry_after_s(wait_s))
    if reason == REJECT_QUEUE_REQUESTS:
        detail = f"{queued_requests} requests queued, limit {limits.max_queue_requests}"
    else:
        adds = f", this request adds {tokens}" if tokens else ""
        detail = f"{queued_tokens} tokens queued{adds}, limit {limits.max_queue_tokens}"
    return OverloadedError(f"the queue is full ({detail})", retry_after_s(wait_s))
