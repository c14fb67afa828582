"""How big a batch may get and how much work may wait: the numbers the batcher obeys, changeable at run time."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from glassbox.service.buckets import length_buckets
from glassbox.service.settings import Settings

SHED_WAIT_SHARE = 1 / 3  # of the queue-wait bound, the wait's share while shedding (the rest caps the batch)


@dataclass(frozen=True, slots=True)
class BatcherLimits:
    """Batch shape caps and queue bounds.

    The batcher reads these once per batch and once per admission, so replacing them with
    `Batcher.update_limits` takes effect at the next decision (the degraded mode shrinks the queue
    bounds to what the active device can clear).
    """

    max_batch_size: int  # rows in one engine batch
    max_batch_tokens: int  # padded tokens in one engine batch: rows x longest length
    max_queue_requests: int  # requests with items still queued, before 429
    max_queue_tokens: int  # real tokens still queued, before 429
    length_buckets: tuple[int, ...]  # ascending; an item belongs to the smallest bucket >= its length
    # The longest predicted wait a request is admitted into (queued work at the engine's measured rate).
    max_queue_wait_s: float = math.inf
    # The longest a batch may be predicted to run at the engine's measured cost: rows beyond it wait for the next
    # batch (one row always goes). A request admitted at the queue-wait bound then ends within the two bounds.
    max_batch_time_s: float = math.inf
    # Items of the buckets next to the batch's own join it only while padding stays at or under this share
    # of the padded tokens; the batch's own bucket is exempt (its padding is bounded by the bucket width).
    max_padding_ratio: float = 0.25
    # The time over which admission weighs the wait bound's refusals against its admissions: while refusals are at
    # least as many, the server sheds heavy overload (glassbox.service.batching.admission) and obeys `while_shedding()`.
    # 0: it never does.
    shed_window_s: float = 0.25

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be positive"
            for name in ("max_batch_size", "max_batch_tokens", "max_queue_requests", "max_queue_tokens")
            if getattr(self, name) <= 0
        ]
        buckets = self.length_buckets
        if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            problems.append("length_buckets must be ascending, unique and positive")
        if not self.max_queue_wait_s > 0 or not self.max_batch_time_s > 0:
            problems.append("max_queue_wait_s and max_batch_time_s must be positive")
        if not self.shed_window_s >= 0.0:
            problems.append("shed_window_s must be zero or more")
        if not 0.0 <= self.max_padding_ratio < 1.0:
            problems.append("max_padding_ratio must be in [0, 1)")
        if problems:
            raise ValueError("invalid batcher limits: " + "; ".join(problems))

    def while_shedding(self) -> BatcherLimits:
        """The limits while the server sheds heavy overload: the queue-wait bound then covers a request's whole
        predicted stay, not its wait alone. A third of it is the wait bound (beyond the floor of a full batch queued
        for the next engine thread), two thirds the batch time cap (never above `max_batch_time_s`), so a request
        admitted at the bound is predicted to end within it. Small batches cost some throughput; under overload the
        requests they refuse would have waited past the latency SLO instead (docs/benchmarks/2026-12-04-shedding.md)."""
        wait = self.max_queue_wait_s
        return replace(self, max_queue_wait_s=wait * SHED_WAIT_SHARE,
                       max_batch_time_s=min(self.max_batch_time_s, wait * (1.0 - SHED_WAIT_SHARE)))

    @classmethod
    def from_settings(cls, settings: Settings, max_length: int) -> BatcherLimits:
        """`max_length` is the tokenizer's effective limit (never above the model's); it is always the last
        bucket, so every item has one."""
        return cls(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue_requests=settings.max_queue_requests,
            max_queue_tokens=settings.max_queue_tokens,
            length_buckets=length_buckets(settings.length_buckets, max_length),
            max_queue_wait_s=settings.max_queue_wait_ms / 1000,
            max_batch_time_s=settings.max_batch_time_ms / 1000,
            shed_window_s=settings.shed_window_ms / 1000,
        )
