"""Admission follows capacity: while the CPU fallback serves, the queue may only hold what the CPU can clear within
the request deadline, so overload is answered at once with 429 + Retry-After instead of by timeouts later.

The policy listens to the fallback engine (set_degraded / clear_degraded, like the Lifecycle) and is refreshed
periodically by the app: queue bounds = measured rate of the active device x a share of the default deadline,
never below one full batch and never above what was configured. On recovery the configured limits come back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from typing import Protocol

from service.batching.limits import BatcherLimits
from service.batching.records import BatcherStats

log = logging.getLogger("glassbox.capacity")

REFRESH_S = 1.0
DEADLINE_SHARE = 0.5  # a request admitted at the back of a full queue waits at most this share of its deadline


class LimitedQueue(Protocol):
    """What the policy needs of the batcher."""

    @property
    def limits(self) -> BatcherLimits: ...

    def update_limits(self, limits: BatcherLimits) -> None: ...

    def stats(self) -> BatcherStats: ...


def degraded_limits(
    configured: BatcherLimits, stats: BatcherStats, device: str, deadline_s: float, share: float = DEADLINE_SHARE
) -> BatcherLimits:
    """Queue bounds a full queue drains within `share` of `deadline_s` at `device`'s measured rate.

    Before that device has a measurement (its first batch still running) the bounds are the floor: one full batch
    of requests and of tokens. The request bound uses the item rate: a request holds at least one item, so this
    bound is loose for multi-text requests, and the token bound is the one that holds them."""
    floor_requests = min(configured.max_batch_size, configured.max_queue_requests)
    floor_tokens = min(configured.max_batch_tokens, configured.max_queue_tokens)
    requests, tokens = floor_requests, floor_tokens
    if stats.throughput_device == device and stats.throughput_items_per_s > 0:
        budget_s = deadline_s * share
        requests = math.floor(stats.throughput_items_per_s * budget_s)
        tokens = math.floor(stats.throughput_tokens_per_s * budget_s)
    return dataclasses.replace(
        configured,
        max_queue_requests=min(max(requests, floor_requests), configured.max_queue_requests),
        max_queue_tokens=min(max(tokens, floor_tokens), configured.max_queue_tokens),
    )


class CapacityPolicy:
    """Attached to a FallbackEngine as a listener (called on the engine thread) and refreshed from the event loop;
    its own state is locked, the batcher locks its own."""

    def __init__(
        self, batcher: LimitedQueue, *, deadline_s: float, share: float = DEADLINE_SHARE,
        refresh_s: float = REFRESH_S,
    ) -> None:
        if deadline_s <= 0 or not 0 < share <= 1:
            raise ValueError("deadline_s must be positive and share in (0, 1]")
        self._batcher = batcher
        self._configured = batcher.limits
        self._deadline_s = deadline_s
        self._share = share
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._device = ""  # the device serving while degraded; "" while the primary serves

    @property
    def configured(self) -> BatcherLimits:
        return self._configured

    @property
    def degraded_device(self) -> str:
        with self._lock:
            return self._device

    def set_degraded(self, device: str, reason: str) -> None:
        with self._lock:
            self._device = device
        limits = self.refresh()
        log.info("queue limits follow %s while degraded (%s): %d requests, %d tokens", device, reason,
                 limits.max_queue_requests, limits.max_queue_tokens)

    def clear_degraded(self, device: str) -> None:
        with self._lock:
            self._device = ""
            self._batcher.update_limits(self._configured)
        log.info("queue limits restored on %s: %d requests, %d tokens", device,
                 self._configured.max_queue_requests, self._configured.max_queue_tokens)

    def mark_not_live(self, reason: str) -> None:
        pass  # the CPU still serves until the restart; set_degraded follows and sizes the queue for it

    def refresh(self) -> BatcherLimits:
        """Apply the bounds for now: measured ones while degraded, the configured ones otherwise."""
        with self._lock:
            # Under our lock, so a concurrent clear_degraded cannot be overwritten by stale degraded bounds.
            if not self._device:
                return self._batcher.limits
            limits = degraded_limits(self._configured, self._batcher.stats(), self._device, self._deadline_s,
                                     self._share)
            if limits != self._batcher.limits:
                self._batcher.update_limits(limits)
            return limits

    async def follow(self) -> None:
        """Refresh every `refresh_s` until cancelled (the app's lifespan runs this as a task)."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                self.refresh()
            except Exception:  # a bad refresh must not end the loop that keeps the bounds honest
                log.exception("capacity refresh failed")
