"""The GPU memory faults against a model of torch's caching allocator (tests/chaos/fakes.py) on the CPU, and the same
routines on a real device when one is present (marked gpu: skipped without one)."""

from __future__ import annotations

import pytest
import torch

from glassbox.chaos.gpu import MIB, AllocatorStats, TorchCudaMemory, available_bytes, fill, fragment
from tests.chaos.fakes import SEGMENT, FakeMemory


def test_the_fake_is_a_faithful_enough_allocator() -> None:
    memory = FakeMemory(1000)
    a, b = memory.allocate(2 * MIB), memory.allocate(2 * MIB)
    assert memory.stats() == AllocatorStats(SEGMENT, 4 * MIB, 16 * MIB)  # one segment, split
    del a
    assert memory.stats().inactive_split_bytes == 18 * MIB
    del b
    assert memory.stats() == AllocatorStats(SEGMENT, 0, 0)  # merged back into one whole free segment
    memory.empty_cache()
    assert memory.stats().reserved_bytes == 0 and memory.driver_free_bytes() == 1000 * MIB


def test_the_ratio_is_telemetrys() -> None:
    from glassbox.telemetry.collectors import (
        AllocatorSample,  # here: the gpu-marked run of this file imports no telemetry
    )

    stats = AllocatorStats(reserved_bytes=400 * MIB, allocated_bytes=100 * MIB, inactive_split_bytes=60 * MIB)
    sample = AllocatorSample(allocated_bytes=100 * MIB, reserved_bytes=400 * MIB, inactive_split_bytes=60 * MIB,
                             alloc_retries=0)
    assert stats.fragmentation_ratio == sample.fragmentation_ratio == 0.15
    assert AllocatorStats(0, 0, 0).fragmentation_ratio == 0.0


def test_fill_leaves_about_the_asked_free_memory_and_release_gives_it_back() -> None:
    memory = FakeMemory(4000)
    engine_tensor = memory.allocate(300 * MIB)  # the model's own memory stays put throughout
    cached = memory.allocate(500 * MIB)
    del cached  # a cached free segment: fill must not leave it to the engine as a reserve
    hold, detail = fill(memory, free_mib=500)
    assert 498 * MIB <= memory.driver_free_bytes() <= 500 * MIB
    assert available_bytes(memory) == memory.driver_free_bytes()  # no cached block left behind
    assert detail["reached"] is True
    assert detail["held_mib"] == pytest.approx(4000 - 300 - memory.driver_free_bytes() / MIB, abs=0.1)
    assert memory.allocate(600 * MIB) is None  # what the engine would now meet
    hold.release()
    assert memory.driver_free_bytes() == 3700 * MIB  # emptied: back to the driver, not just to the cache
    assert memory.allocate(600 * MIB) is not None
    hold.release()  # a second release is harmless
    assert engine_tensor is not None


def test_fill_gives_up_honestly_when_the_driver_overstates_what_is_free() -> None:
    memory = FakeMemory(1000, overstate_free_mib=300)
    hold, detail = fill(memory, free_mib=100)
    assert memory.failed > 0  # it probed with smaller chunks
    assert detail["reached"] is False
    assert memory.driver_free_bytes() - 300 * MIB < 20 * MIB  # yet it took all that was really there
    hold.release()
    assert memory.stats().reserved_bytes == 0


def test_fill_with_less_free_than_asked_holds_nothing() -> None:
    memory = FakeMemory(100)
    hold, detail = fill(memory, free_mib=200)
    assert detail == {"held_mib": 0.0, "driver_free_mib": 100.0, "available_mib": 100.0, "reached": True}
    hold.release()


def test_fragment_leaves_the_asked_inactive_split_bytes_and_release_clears_them() -> None:
    memory = FakeMemory(2000)
    hold, detail = fragment(memory, inactive_mib=100)
    stats = memory.stats()
    assert stats.inactive_split_bytes >= 100 * MIB
    assert detail["reached"] is True
    assert detail["added_inactive_mib"] == stats.inactive_split_bytes / MIB
    assert detail["fragmentation_ratio"] == round(stats.fragmentation_ratio, 4)
    assert 0.45 <= detail["fragmentation_ratio"] <= 0.55  # every other 2 MiB block of each segment is a hole
    assert detail["held_mib"] == stats.allocated_bytes / MIB
    bigger = memory.allocate(4 * MIB)  # too big for any 2 MiB hole: the holes stay
    assert bigger is not None
    assert memory.stats().inactive_split_bytes >= stats.inactive_split_bytes
    del bigger
    hold.release()
    assert memory.stats() == AllocatorStats(0, 0, 0)  # every segment went back to the driver


def test_fragment_reports_a_shortfall_when_memory_runs_out() -> None:
    memory = FakeMemory(100)
    hold, detail = fragment(memory, inactive_mib=500)
    assert detail["reached"] is False
    assert 0 < detail["added_inactive_mib"] < 500
    hold.release()
    assert memory.stats().reserved_bytes == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_real_gpu_fragment_and_fill_move_the_allocator_as_reported() -> None:
    memory = TorchCudaMemory("cuda:0")
    hold, detail = fragment(memory, inactive_mib=64)
    stats = memory.stats()
    assert detail["reached"] is True, detail
    assert stats.inactive_split_bytes >= 64 * MIB
    hold.release()
    assert memory.stats().inactive_split_bytes < stats.inactive_split_bytes
    before = memory.driver_free_bytes()
    hold, detail = fill(memory, free_mib=max(0, before // MIB - 1024))  # take about 1 GiB
    assert detail["reached"] is True, detail
    assert memory.driver_free_bytes() <= before - 1000 * MIB
    hold.release()
    assert memory.driver_free_bytes() >= before - 64 * MIB
