"""What the batcher hands back: one request's result, a snapshot of its counters, and the reason enums."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from glassbox.service.observer import SpanRef
from glassbox.service.types import FloatArray

# Bounded label values for observer.on_rejected / on_dropped.
REJECT_QUEUE_REQUESTS = "queue_full_requests"
REJECT_QUEUE_TOKENS = "queue_full_tokens"
REJECT_DRAINING = "draining"
REJECT_PREDICTED_WAIT = "predicted_wait"  # the wait at the measured rate is over the bound or the deadline
DROP_DEADLINE = "deadline"  # the deadline passed while the item was queued
DROP_DISCONNECTED = "disconnected"  # the awaiting task was cancelled (the client left)
DROP_FAILED = "failed"  # another part of the same request failed in the engine, so the rest is moot
DROP_SHUTDOWN = "shutdown"  # still queued when the batcher stopped
REJECT_REASONS = (REJECT_PREDICTED_WAIT, REJECT_QUEUE_REQUESTS, REJECT_QUEUE_TOKENS, REJECT_DRAINING)
DROP_REASONS = (DROP_DEADLINE, DROP_DISCONNECTED, DROP_FAILED, DROP_SHUTDOWN)


@dataclass(frozen=True, slots=True)
class SubmitResult:
    logits: FloatArray  # [n, labels], rows in the order of the submitted TokenBatch
    queue_start_ns: int  # perf_counter_ns at submit
    queue_end_ns: int  # start of the first engine run holding one of its items
    infer_start_ns: int  # same instant as queue_end_ns: the queue stage ends where inference starts
    infer_end_ns: int  # end of the last engine run holding one of its items
    device: str  # comma-joined sorted unique devices of those runs
    engine_mode: str  # "graph" | "eager" | "mixed"
    batch_ids: tuple[int, ...]  # ascending
    batch_spans: tuple[SpanRef, ...] = ()  # the span of each batch, by ascending batch id, where one was named


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A consistent snapshot, taken under the batcher's lock."""

    batches_run: int  # successful engine runs
    items_run: int  # rows those runs computed
    engine_errors: int  # engine runs that raised
    dropped: Mapping[str, int]  # items dropped before reaching the engine, by DROP_* reason
    rejected: Mapping[str, int]  # requests refused at admission, by REJECT_* reason
    in_flight_items: int  # rows in the engine right now
    pending_requests: int  # admitted and not yet answered
    queued_requests: int
    queued_tokens: int
    throughput_items_per_s: float  # engine busy-time rate over recent batches on `throughput_device`
    throughput_tokens_per_s: float  # same, in real tokens
    throughput_device: str  # device of the most recent batch; "" before the first
    predicted_wait_s: float | None = None  # what a request admitted now would wait: 0 when idle; None while work waits
    # before any measurement
    shedding: bool = False  # shedding heavy overload now, under BatcherLimits.while_shedding (admission.py)
