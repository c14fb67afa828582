"""telemetry/collectors.py: scrape-time values (queue, GPU through doubles of NVML and the allocator), the
event-loop lag sampler and the build-info labels. The real NVML and torch.cuda calls need a GPU to run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from glassbox.telemetry.collectors import (
    AllocatorSample,
    EventLoopLagSampler,
    GpuCollector,
    NvmlReader,
    QueueCollector,
    build_info_labels,
    cuda_index,
)
from glassbox.telemetry.metrics import Metrics, build_metrics

GIB = 2**30


@dataclass
class FakeStats:
    queued_requests: int = 3
    queued_tokens: int = 120
    pending_requests: int = 5
    in_flight_items: int = 8
    predicted_wait_s: float | None = 0.042
    shedding: bool = False


@dataclass
class FakeLimits:
    max_queue_requests: int = 1024
    max_queue_tokens: int = 262144
    max_queue_wait_s: float = 0.1


@dataclass
class FakeBatcher:
    current: FakeStats = field(default_factory=FakeStats)
    limits: FakeLimits = field(default_factory=FakeLimits)

    def stats(self) -> FakeStats:
        return self.current


@pytest.fixture
def metrics() -> Metrics:
    return build_metrics(CollectorRegistry())


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_queue_gauges_are_read_at_scrape_time(metrics: Metrics) -> None:
    batcher = FakeBatcher()
    metrics.registry.register(QueueCollector(metrics.queue, batcher))
    assert value(metrics, "glassbox_queue_requests") == 3
    assert value(metrics, "glassbox_queue_tokens") == 120
    assert value(metrics, "glassbox_queue_max_requests") == 1024
    assert value(metrics, "glassbox_queue_max_tokens") == 262144
    assert value(metrics, "glassbox_inflight_requests") == 5
    assert value(metrics, "glassbox_engine_inflight_texts") == 8
    assert value(metrics, "glassbox_queue_predicted_wait_seconds") == 0.042
    assert value(metrics, "glassbox_queue_max_wait_seconds") == 0.1
    assert value(metrics, "glassbox_queue_shedding") == 0
    batcher.current = FakeStats(queued_requests=0, queued_tokens=7, predicted_wait_s=None, shedding=True)
    batcher.limits = FakeLimits(max_queue_requests=40, max_queue_tokens=4096)
    assert value(metrics, "glassbox_queue_requests") == 0
    assert value(metrics, "glassbox_queue_tokens") == 7
    assert value(metrics, "glassbox_queue_max_requests") == 40
    assert value(metrics, "glassbox_queue_max_tokens") == 4096
    assert value(metrics, "glassbox_queue_shedding") == 1
    names = {f.name for f in metrics.registry.collect() if f.samples}
    assert "glassbox_queue_predicted_wait_seconds" not in names  # nothing measured yet: no prediction, not a zero


def test_queue_requests_and_tokens_are_separate_metrics_of_one_unit_each(metrics: Metrics) -> None:
    """Each queue metric has no label at all: a sum or a ratio over one can never mix requests with tokens."""
    metrics.registry.register(QueueCollector(metrics.queue, FakeBatcher()))
    queue = {f.name: f for f in metrics.registry.collect() if f.name.startswith("glassbox_queue_")}
    assert set(queue) == {"glassbox_queue_requests", "glassbox_queue_tokens", "glassbox_queue_max_requests",
                          "glassbox_queue_max_tokens", "glassbox_queue_predicted_wait_seconds",
                          "glassbox_queue_max_wait_seconds", "glassbox_queue_shedding"}
    for family in queue.values():
        assert family.type == "gauge"
        assert [s.labels for s in family.samples] == [{}], family.name
    catalogue = {spec.name: spec for spec in metrics.catalogue}
    assert "glassbox_queue_depth" not in catalogue and "glassbox_queue_limit" not in catalogue
    assert all(not catalogue[name].labels and catalogue[name].scrape for name in queue)


class FakeNvml:
    """The part of pynvml the reader uses. `unsupported` names calls that raise like an NVML_ERROR_NOT_SUPPORTED."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, uuids: dict[str, int] | None = None, unsupported: tuple[str, ...] = ()) -> None:
        self.uuids = uuids or {}
        self.unsupported = unsupported
        self.events: list[str] = []

    def _check(self, name: str) -> None:
        if name in self.unsupported:
            raise RuntimeError(f"{name}: not supported")

    def nvmlInit(self) -> None:
        self.events.append("init")

    def nvmlShutdown(self) -> None:
        self.events.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid not in self.uuids:
            raise RuntimeError("not found")
        return self.uuids[uuid]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return 100 + index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check("memory")
        return SimpleNamespace(used=30 * GIB, total=80 * GIB, free=50 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._check("utilization")
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("power")
        return 215_500  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check("temperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 61


MEMORY_STATS = {
    "allocated_bytes.all.current": 6 * GIB,
    "reserved_bytes.all.current": 8 * GIB,
    "inactive_split_bytes.all.current": 1 * GIB,
    "num_alloc_retries": 3,
    "num_ooms": 1,
}


def test_allocator_sample_and_fragmentation_ratio() -> None:
    sample = AllocatorSample.from_memory_stats(MEMORY_STATS)
    assert (sample.allocated_bytes, sample.reserved_bytes, sample.inactive_split_bytes) == (6 * GIB, 8 * GIB, GIB)
    assert sample.alloc_retries == 3
    assert sample.fragmentation_ratio == pytest.approx(0.125)
    # Before the first allocation torch returns an empty dict: everything 0, and the ratio is defined.
    empty = AllocatorSample.from_memory_stats({})
    assert empty.reserved_bytes == 0 and empty.fragmentation_ratio == 0.0


def test_gpu_collector_exports_every_reading_with_the_device_label(metrics: Metrics) -> None:
    nvml = NvmlReader(0, "GPU-abc", FakeNvml({"GPU-abc": 7}))
    nvml.open()
    collector = GpuCollector(metrics.gpu, "cuda:0", nvml, lambda: AllocatorSample.from_memory_stats(MEMORY_STATS))
    metrics.registry.register(collector)
    expected = {
        "glassbox_gpu_utilization_ratio": 0.37,
        "glassbox_gpu_memory_used_bytes": 30 * GIB,
        "glassbox_gpu_memory_total_bytes": 80 * GIB,
        "glassbox_gpu_power_watts": 215.5,
        "glassbox_gpu_temperature_celsius": 61,
        "glassbox_torch_memory_allocated_bytes": 6 * GIB,
        "glassbox_torch_memory_reserved_bytes": 8 * GIB,
        "glassbox_torch_memory_inactive_split_bytes": GIB,
        "glassbox_torch_memory_fragmentation_ratio": 0.125,
        "glassbox_torch_alloc_retries_total": 3,
    }
    for name, number in expected.items():
        assert value(metrics, name, device="cuda:0") == pytest.approx(number), name


def test_a_reading_the_driver_refuses_is_left_out_not_zeroed(metrics: Metrics) -> None:
    nvml = NvmlReader(0, nvml=FakeNvml(unsupported=("power", "utilization")))
    nvml.open()

    def broken_allocator() -> AllocatorSample:
        raise RuntimeError("CUDA driver gone")

    metrics.registry.register(GpuCollector(metrics.gpu, "cuda:0", nvml, broken_allocator))
    assert value(metrics, "glassbox_gpu_power_watts", device="cuda:0") is None
    assert value(metrics, "glassbox_gpu_utilization_ratio", device="cuda:0") is None
    assert value(metrics, "glassbox_torch_memory_reserved_bytes", device="cuda:0") is None
    assert value(metrics, "glassbox_gpu_temperature_celsius", device="cuda:0") == 61
    assert value(metrics, "glassbox_gpu_memory_used_bytes", device="cuda:0") == 30 * GIB


def test_nvml_reader_finds_the_board_by_uuid_never_by_a_guessed_index_and_shuts_down() -> None:
    fake = FakeNvml({"GPU-abc": 7})
    by_uuid = NvmlReader(1, "abc", fake)  # torch writes the UUID without NVML's prefix
    by_uuid.open()
    assert by_uuid._handle == 7
    missed = NvmlReader(1, "GPU-unknown", fake)
    missed.open()
    assert missed._handle is None and missed.read().memory_used_bytes is None  # no readings beat another GPU's
    by_index = NvmlReader(1, "", fake)  # no UUID at all: the index is all there is
    by_index.open()
    assert by_index._handle == 101
    by_uuid.close()
    by_uuid.close()  # a second close does nothing
    missed.close()
    assert fake.events == ["init", "init", "init", "shutdown", "shutdown"]
    assert NvmlReader(0, nvml=fake).read().memory_used_bytes is None  # never opened: nothing to report


def test_cuda_index() -> None:
    assert cuda_index("cuda:0") == 0
    assert cuda_index("cuda:3") == 3
    assert cuda_index("cuda") == 0


def test_build_info_labels() -> None:
    labels = build_info_labels("tiny-model", "cpu", "bf16")
    assert labels["model"] == "tiny-model"
    assert labels["dtype"] == "bf16"
    assert labels["device"] == "cpu"
    assert labels["torch"] == torch.__version__
    assert labels["version"]  # the installed package's version, or "unknown" when run from a bare checkout


def busy(seconds: float) -> None:
    """Hold the event loop without yielding, as a CPU-bound handler would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_event_loop_lag_sampler_sees_a_blocked_loop() -> None:
    async def scenario() -> list[float]:
        readings: list[float] = []
        arrived = asyncio.Event()

        def observe(lag: float) -> None:
            readings.append(lag)
            arrived.set()

        sampler = EventLoopLagSampler(observe, interval_s=0.001)
        sampler.start()
        sampler.start()  # idempotent: still one chain of timers
        await arrived.wait()  # a first reading from an idle loop
        arrived.clear()
        count = len(readings)
        busy(0.05)  # the pending timer is due within 1 ms but cannot fire for 50 ms
        await arrived.wait()
        sampler.stop()
        assert not sampler.running
        return readings[count:]

    late = asyncio.run(scenario())
    assert late[0] >= 0.045


def test_event_loop_lag_sampler_survives_a_failing_observer_and_stops() -> None:
    async def scenario() -> int:
        calls = 0
        enough = asyncio.Event()

        def observe(lag: float) -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                enough.set()
            raise ValueError("observer broke")

        sampler = EventLoopLagSampler(observe, interval_s=0.001)
        sampler.start()
        await enough.wait()
        sampler.stop()
        stopped_at = calls
        busy(0.01)
        await asyncio.sleep(0)  # one trip through the loop: a live timer chain would have fired by now
        return calls - stopped_at

    assert asyncio.run(scenario()) == 0


def test_event_loop_lag_sampler_rejects_a_bad_interval() -> None:
    with pytest.raises(ValueError):
        EventLoopLagSampler(lambda lag: None, interval_s=0)
