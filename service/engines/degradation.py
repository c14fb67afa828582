"""What the fallback engine reports and to whom: the reasons of its events, a snapshot of its state, and the
protocol of the listeners it tells about every change of the serving device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from glassbox.service.engines.breaker import BreakerState
from glassbox.service.engines.pressure import PressureState

# FallbackEvent.reason values: why the CPU started serving, why it still serves, or that the GPU serves again.
REASON_OOM = "oom"
REASON_CUDA_ERROR = "cuda_error"
REASON_CUDA_FATAL = "cuda_fatal"
REASON_MEMORY_PRESSURE = "memory_pressure"
REASON_PROBE_FAILED = "probe_failed"
REASON_RECOVERED = "recovered"
FALLBACK_REASONS = (REASON_OOM, REASON_CUDA_ERROR, REASON_CUDA_FATAL, REASON_MEMORY_PRESSURE, REASON_PROBE_FAILED,
                    REASON_RECOVERED)

class DegradationListener(Protocol):
    """Told about every change of the serving device. glassbox.service.lifecycle.Lifecycle fits as it is."""

    def set_degraded(self, device: str, reason: str) -> None: ...

    def clear_degraded(self, device: str) -> None: ...

    def mark_not_live(self, reason: str) -> None: ...


@runtime_checkable
class Degradable(Protocol):
    """The capability of an engine that can move its work to another device and back (the fallback engine): it
    tells listeners when. Engines that always run where they started do not have it."""

    def attach(self, listener: DegradationListener) -> None: ...


def degradable(engine: object) -> Degradable | None:
    """The engine as a Degradable when it declares the capability, else None."""
    return engine if isinstance(engine, Degradable) else None


@dataclass(frozen=True, slots=True)
class FallbackState:
    serving: str  # the device new batches go to
    reason: str  # "" while the primary serves; else oom | cuda_error | cuda_fatal | memory_pressure
    breaker: BreakerState
    pressure: PressureState | None  # None without a memory reader
    gpu_faults: int  # primary runs that failed with a CUDA fault, probes included
    ooms: int  # the out-of-memory ones among them
    probes: int  # probe batches tried on the primary
    fallback_batches: int  # batches the secondary ran
    last_error: str  # type and head of the message of the last GPU fault

    @property
    def degraded(self) -> bool:
        return bool(self.reason)
