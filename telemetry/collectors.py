"""Values read when Prometheus scrapes: the batcher's queue, the GPU (NVML) and torch's caching allocator; the
event-loop lag sampler; the build-info labels.

Names, labels and help texts come from `telemetry/metrics.py`; this module only supplies values. GPU readers are
created only where glassbox serves from a GPU, and a reading the driver cannot give is left out, never reported
as zero. `pynvml` (the nvidia-ml-py package) and `torch.cuda` are imported only when a GPU reader is built.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from glassbox.service.devices import find_nvml_device
from glassbox.service.version import version as package_version
from glassbox.telemetry.metrics import GpuFamilies, QueueFamilies, ScrapeFamily, device_label

log = logging.getLogger("glassbox.telemetry")


# --- the batcher's queue ----------------------------------------------------------------------------------------
class BatcherStatsView(Protocol):
    @property
    def queued_requests(self) -> int: ...
    @property
    def queued_tokens(self) -> int: ...
    @property
    def pending_requests(self) -> int: ...
    @property
    def in_flight_items(self) -> int: ...
    @property
    def predicted_wait_s(self) -> float | None: ...
    @property
    def shedding(self) -> bool: ...


class BatcherLimitsView(Protocol):
    @property
    def max_queue_requests(self) -> int: ...
    @property
    def max_queue_tokens(self) -> int: ...
    @property
    def max_queue_wait_s(self) -> float: ...


class BatcherView(Protocol):
    """What telemetry reads from glassbox.service.batching.Batcher (structurally; telemetry does not import it)."""

    def stats(self) -> BatcherStatsView: ...
    @property
    def limits(self) -> BatcherLimitsView: ...


class QueueCollector:
    """Queued requests and tokens, their limits and in-flight work from one consistent `stats()` snapshot per
    scrape. Requests and tokens are separate metrics (one unit each), so a sum or a ratio never mixes them."""

    def __init__(self, families: QueueFamilies, batcher: BatcherView) -> None:
        self._f = families
        self._batcher = batcher

    def describe(self) -> Iterator[Metric]:
        f = self._f
        for family in (f.requests, f.tokens, f.max_requests, f.max_tokens, f.inflight_requests,
                       f.engine_inflight_texts, f.predicted_wait, f.max_wait, f.shedding):
            yield family.describe()

    def collect(self) -> Iterator[Metric]:
        f, stats, limits = self._f, self._batcher.stats(), self._batcher.limits
        yield _single(f.requests, stats.queued_requests)
        yield _single(f.tokens, stats.queued_tokens)
        yield _single(f.max_requests, limits.max_queue_requests)
        yield _single(f.max_tokens, limits.max_queue_tokens)
        yield _single(f.inflight_requests, stats.pending_requests)
        yield _single(f.engine_inflight_texts, stats.in_flight_items)
        wait = f.predicted_wait.new()
        if stats.predicted_wait_s is not None:  # nothing measured yet: no prediction to report
            wait.add_metric([], stats.predicted_wait_s)
        yield wait
        if math.isfinite(limits.max_queue_wait_s):
            yield _single(f.max_wait, limits.max_queue_wait_s)
        yield _single(f.shedding, 1.0 if stats.shedding else 0.0)


# --- the GPU: NVML and torch's caching allocator -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NvmlSample:
    """One NVML reading; None where the driver does not support or failed to give a field."""

    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None


@dataclass(frozen=True, slots=True)
class AllocatorSample:
    allocated_bytes: int  # held by live tensors
    reserved_bytes: int  # held by the caching allocator from the driver (allocated + cached)
    inactive_split_bytes: int  # cached but unusable for a large request: free pieces of partly used segments
    alloc_retries: int  # cudaMalloc failed, the cache was flushed and the allocation retried

    @property
    def fragmentation_ratio(self) -> float:
        """inactive_split / reserved. Whole free cached segments (reserved - allocated - inactive_split) are
        reusable for any size and so are not counted: only the free memory stranded beside live blocks is."""
        return self.inactive_split_bytes / self.reserved_bytes if self.reserved_bytes > 0 else 0.0

    @classmethod
    def from_memory_stats(cls, stats: Mapping[str, Any]) -> AllocatorSample:
        """From `torch.cuda.memory_stats(device)`; keys missing before the first allocation read as 0."""
        return cls(
            allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
            reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
            inactive_split_bytes=int(stats.get("inactive_split_bytes.all.current", 0)),
            alloc_retries=int(stats.get("num_alloc_retries", 0)),
        )


class NvmlReader:
    """One GPU through NVML. `nvml` is the pynvml module (imported on open() unless a test hands in a double)."""

    def __init__(self, index: int, uuid: str = "", nvml: Any = None) -> None:
        self._index = index
        self._uuid = uuid
        self._nvml = nvml
        self._handle: Any = None
        self._opened = False

    def open(self) -> None:
        nvml = self._nvml if self._nvml is not None else importlib.import_module("pynvml")
        nvml.nvmlInit()
        self._nvml = nvml
        self._opened = True
        # By UUID, MIG instances included (glassbox.service.devices): CUDA_VISIBLE_DEVICES may renumber devices, and a
        # board picked by index on a miss would report another GPU's readings as ours.
        found = find_nvml_device(nvml, self._uuid, self._index)
        if found is None:
            log.warning("NVML has no GPU or MIG instance with uuid %s: GPU utilisation/power/temperature will not "
                        "be exported", self._uuid)
        self._handle = found.handle if found is not None else None

    def close(self) -> None:
        self._handle = None
        if self._opened:
            self._opened = False
            self._nvml.nvmlShutdown()

    def read(self) -> NvmlSample:
        nvml, handle = self._nvml, self._handle
        if handle is None:
            return NvmlSample()
        memory = _maybe(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return NvmlSample(
            utilization_ratio=_maybe(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_watts=_maybe(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # NVML reports milliwatts
            temperature_celsius=_maybe(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
        )


def torch_allocator_reader(device: str) -> Callable[[], AllocatorSample]:
    torch = importlib.import_module("torch")
    return lambda: AllocatorSample.from_memory_stats(torch.cuda.memory_stats(device))


class GpuCollector:
    """NVML and allocator readings for one CUDA device. Either reader may be absent (NVML failed to load)."""

    def __init__(self, families: GpuFamilies, device: str, nvml: NvmlReader | None,
                 allocator: Callable[[], AllocatorSample] | None) -> None:
        self._f = families
        self._device = device_label(device)
        self._nvml = nvml
        self._allocator = allocator

    def describe(self) -> Iterator[Metric]:
        for family in self._families():
            yield family.describe()

    def collect(self) -> Iterator[Metric]:
        f, device = self._f, [self._device]
        if self._nvml is not None:
            n = _maybe(self._nvml.read) or NvmlSample()
            for family, value in ((f.utilization, n.utilization_ratio), (f.memory_used, n.memory_used_bytes),
                                  (f.memory_total, n.memory_total_bytes), (f.power, n.power_watts),
                                  (f.temperature, n.temperature_celsius)):
                if value is not None:
                    yield _single(family, value, device)
        if self._allocator is not None:
            a = _maybe(self._allocator)
            if a is None:
                return
            for family, number in ((f.torch_allocated, a.allocated_bytes), (f.torch_reserved, a.reserved_bytes),
                                   (f.torch_inactive_split, a.inactive_split_bytes),
                                   (f.torch_fragmentation, a.fragmentation_ratio),
                                   (f.torch_alloc_retries, a.alloc_retries)):
                yield _single(family, number, device)

    def _families(self) -> Iterator[ScrapeFamily]:
        f = self._f
        if self._nvml is not None:
            yield from (f.utilization, f.memory_used, f.memory_total, f.power, f.temperature)
        if self._allocator is not None:
            yield from (f.torch_allocated, f.torch_reserved, f.torch_inactive_split, f.torch_fragmentation,
                        f.torch_alloc_retries)


def cuda_index(device: str) -> int:
    """"cuda:1" -> 1, "cuda" -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0


# --- event-loop lag -------------------------------------------------------------------------------------------------
class EventLoopLagSampler:
    """Every `interval_s`, how much later than asked a `call_later` timer fired: time the loop spent on something
    else (a long callback, blocking code, too much work). A chain of timer callbacks rather than a task, so that
    the reading is taken inside the callback and does not include one more trip through the loop.

    Under uvloop timers have millisecond resolution, so readings below ~1 ms are noise."""

    def __init__(self, observe: Callable[[float], None], interval_s: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._observe = observe
        self._interval = interval_s
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Start on the running loop; a second call does nothing."""
        if self._handle is None:
            self._loop = asyncio.get_running_loop()
            self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._clock() + self._interval
        self._handle = self._loop.call_later(self._interval, self._fire)

    def _fire(self) -> None:
        lag = max(0.0, self._clock() - self._due)
        try:
            self._observe(lag)
        except Exception:
            log.exception("event-loop lag observer failed")
        if self._handle is not None:  # stop() may have run inside observe
            self._schedule()


# --- build info -----------------------------------------------------------------------------------------------------
def build_info_labels(model: str, device: str, dtype: str = "") -> dict[str, str]:
    """`dtype`: the number format the serving engine computes in (fp32, bf16, fp16, int8; "" for the null engine)."""
    version = package_version()
    torch_version = str(getattr(importlib.import_module("torch"), "__version__", "unknown"))
    return {"version": version, "model": model[:128], "device": device_label(device), "dtype": dtype,
            "torch": torch_version}


# --- helpers --------------------------------------------------------------------------------------------------------
def _single(family: ScrapeFamily, value: float, labels: list[str] | None = None) -> Metric:
    metric = family.new()
    metric.add_metric(labels or [], value)
    return metric


def _maybe(read: Callable[[], Any]) -> Any:
    """A reading, or None when the driver refuses it (unsupported field, GPU lost): left out, never faked."""
    try:
        return read()
    except Exception:
        log.debug("a GPU reading failed", exc_info=True)
        return None
