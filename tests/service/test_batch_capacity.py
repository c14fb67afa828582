"""Admission follows capacity: queue bounds while degraded come from the active device's measured rate and the
default deadline, with a floor and a ceiling, and the configured bounds return on recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from types import MappingProxyType

import pytest

from service.batching.capacity import CapacityPolicy, degraded_limits
from service.batching.limits import BatcherLimits
from service.batching.records import BatcherStats

CONFIGURED = BatcherLimits(max_batch_size=8, max_batch_tokens=512, max_queue_requests=1024, max_queue_tokens=65536,
                           length_buckets=(16, 32))


def stats(device: str, items_per_s: float, tokens_per_s: float) -> BatcherStats:
    return BatcherStats(
        batches_run=1, items_run=1, engine_errors=0, dropped=MappingProxyType({}), rejected=MappingProxyType({}),
        in_flight_items=0, pending_requests=0, queued_requests=0, queued_tokens=0,
        throughput_items_per_s=items_per_s, throughput_tokens_per_s=tokens_per_s, throughput_device=device,
    )


class FakeBatcher:
    def __init__(self) -> None:
        self.limits = CONFIGURED
        self.current = stats("cuda:0", 2000.0, 60000.0)
        self.updates: list[BatcherLimits] = []
        self.stats_calls = 0
        self.called = threading.Event()

    def update_limits(self, limits: BatcherLimits) -> None:
        self.limits = limits
        self.updates.append(limits)

    def stats(self) -> BatcherStats:
        self.stats_calls += 1
        if self.stats_calls >= 3:
            self.called.set()
        return self.current


def test_bounds_drain_within_the_deadline_share_at_the_measured_rate() -> None:
    # 40 texts/s and 1200 tokens/s on the CPU, 10 s deadline, half of it for queueing: 200 requests, 6000 tokens.
    limits = degraded_limits(CONFIGURED, stats("cpu", 40.0, 1200.0), "cpu", deadline_s=10.0, share=0.5)
    assert (limits.max_queue_requests, limits.max_queue_tokens) == (200, 6000)
    # Everything but the queue bounds is kept.
    assert dataclasses.replace(limits, max_queue_requests=1024, max_queue_tokens=65536) == CONFIGURED


def test_bounds_never_go_below_one_full_batch_nor_above_the_configuration() -> None:
    slow = degraded_limits(CONFIGURED, stats("cpu", 0.5, 10.0), "cpu", deadline_s=10.0)
    assert (slow.max_queue_requests, slow.max_queue_tokens) == (8, 512)
    fast = degraded_limits(CONFIGURED, stats("cpu", 1e6, 1e8), "cpu", deadline_s=10.0)
    assert (fast.max_queue_requests, fast.max_queue_tokens) == (1024, 65536)


def test_a_measurement_of_another_device_is_not_used() -> None:
    # Right after the switch the meter still describes the GPU: its rate says nothing about the CPU.
    limits = degraded_limits(CONFIGURED, stats("cuda:0", 2000.0, 60000.0), "cpu", deadline_s=10.0)
    assert (limits.max_queue_requests, limits.max_queue_tokens) == (8, 512)
    nothing_yet = degraded_limits(CONFIGURED, stats("", 0.0, 0.0), "cpu", deadline_s=10.0)
    assert (nothing_yet.max_queue_requests, nothing_yet.max_queue_tokens) == (8, 512)


def test_the_policy_shrinks_on_degradation_follows_the_rate_and_restores_on_recovery() -> None:
    batcher = FakeBatcher()
    policy = CapacityPolicy(batcher, deadline_s=10.0)
    assert policy.refresh() == CONFIGURED and batcher.updates == []  # not degraded: hands off

    policy.set_degraded("cpu", "oom")
    assert (batcher.limits.max_queue_requests, batcher.limits.max_queue_tokens) == (8, 512)  # the floor, at once
    batcher.current = stats("cpu", 40.0, 1200.0)
    policy.refresh()
    assert (batcher.limits.max_queue_requests, batcher.limits.max_queue_tokens) == (200, 6000)
    updates = len(batcher.updates)
    policy.refresh()
    assert len(batcher.updates) == updates  # unchanged bounds are not re-applied
    batcher.current = stats("cpu", 20.0, 600.0)
    policy.refresh()
    assert (batcher.limits.max_queue_requests, batcher.limits.max_queue_tokens) == (100, 3000)

    policy.clear_degraded("cuda:0")
    assert batcher.limits == CONFIGURED and policy.degraded_device == ""
    policy.refresh()
    assert batcher.limits == CONFIGURED
    policy.mark_not_live("whatever")  # nothing to do: the CPU keeps serving
    assert batcher.limits == CONFIGURED


def test_follow_refreshes_until_cancelled() -> None:
    batcher = FakeBatcher()
    policy = CapacityPolicy(batcher, deadline_s=10.0, refresh_s=0.0)
    policy.set_degraded("cpu", "oom")
    batcher.current = stats("cpu", 40.0, 1200.0)

    async def scenario() -> None:
        task = asyncio.ensure_future(policy.follow())
        await asyncio.to_thread(batcher.called.wait, 30.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert batcher.limits.max_queue_requests == 200  # the loop applied the measured bounds


@pytest.mark.parametrize(("deadline_s", "share"), [(0.0, 0.5), (10.0, 0.0), (10.0, 1.5)])
def test_bad_parameters_are_refused(deadline_s: float, share: float) -> None:
    with pytest.raises(ValueError):
        CapacityPolicy(FakeBatcher(), deadline_s=deadline_s, share=share)
