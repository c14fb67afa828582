"""The fallback engine: a primary (GPU) engine and a pre-warmed secondary (CPU) engine behind a circuit breaker.

A batch that fails on the GPU with out-of-memory (or another recoverable CUDA error) is re-run on the CPU at once,
so no request fails; the breaker opens, and after a cooldown one probe batch tries the GPU again (after releasing
cached memory). A GPU near its memory limit sends to the CPU, before an OOM can happen, the batches that would
allocate on it: those the primary would run eagerly, and probes. A batch the primary replays as a CUDA graph
allocates nothing (its memory is the graph pool, reserved at capture), so it stays on the GPU: a neighbour filling a
shared GPU must not slow glassbox down 10-100x for nothing. An unrecoverable CUDA error marks the process not live,
and the CPU serves until the orchestrator restarts it. A primary that fails to warm up with a CUDA fault (after its
own start-up ladder, glassbox.service.engines.ladder) does not fail start-up: the CPU serves from the start, breaker
open.

Every change of the serving device is one FallbackEvent to the observer, one warning log line, and one call to each
attached listener (the Lifecycle for /readyz and /livez, the capacity policy for the queue bounds); requests that
merely run on the CPU while degraded log nothing. Each result's timing names the device that computed it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

import torch

from glassbox.service.engines.base import Engine, is_concurrent, replays
from glassbox.service.engines.breaker import CircuitBreaker
from glassbox.service.engines.degradation import (
    REASON_CUDA_FATAL,
    REASON_MEMORY_PRESSURE,
    REASON_OOM,
    REASON_PROBE_FAILED,
    REASON_RECOVERED,
    DegradationListener,
    FallbackState,
)
from glassbox.service.engines.faults import GpuFault, classify, startup_fault, summary
from glassbox.service.engines.pressure import CHECK_INTERVAL_S, MemoryPressure, MemoryReader
from glassbox.service.observer import FallbackEvent, NullObserver, Observer
from glassbox.service.settings import Settings
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport

log = logging.getLogger("glassbox.fallback")

Route = Literal["primary", "secondary", "probe"]


def release_cuda_cache() -> None:
    """Hand cached, unused blocks back to the driver, so a probe (and other processes) see what is really free."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # a no-op while CUDA was never initialised in this process


class FallbackEngine:
    """Implements the Engine protocol. `state()` and `health()` may be called from any thread. Several engine
    threads may run batches through it at once when both engines allow it (a CPU primary under chaos on a CPU host):
    each transition is decided under the lock, so one batch probes at a time and one failure opens the breaker while
    the others that failed with it only count."""

    def __init__(
        self,
        primary: Engine,
        secondary: Engine,
        *,
        settings: Settings | None = None,  # cooldowns and memory marks; the defaults when None
        observer: Observer | None = None,
        memory_reader: MemoryReader | None = None,  # None: no memory-pressure switch
        pressure_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        release_cache: Callable[[], None] = release_cuda_cache,
    ) -> None:
        settings = settings or Settings()
        self._primary = primary
        # What the messages call the primary: the GPU, or (a chaos server on a CPU host, whose primary is a CPU engine
        # under simulated GPU faults) the CPU primary, so no line says "GPU" about a CPU.
        self._primary_word = "GPU" if primary.device.startswith("cuda") else "CPU primary"
        self._secondary = secondary
        self._observer: Observer = observer if observer is not None else NullObserver()
        self._clock = clock
        self._release_cache = release_cache
        self._breaker = CircuitBreaker(settings.fallback_cooldown_s, settings.fallback_cooldown_max_s, clock)
        self._pressure = None if memory_reader is None else MemoryPressure(
            memory_reader, settings.memory_pressure_high, settings.memory_pressure_low,
            interval_s=pressure_interval_s, clock=clock,
        )
        self._listeners: list[DegradationListener] = []
        self._oom_listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # the engine thread writes under it; readers take consistent snapshots
        self._reason = ""
        self._fatal = False
        self._since_s = 0.0  # clock reading when the CPU started serving
        self._gpu_faults = self._ooms = self._probes = self._fallback_batches = 0
        self._last_error = ""

    # -- Engine protocol -----------------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """Where the next batch will run: the primary's device, or the secondary's while degraded (under memory
        pressure: for the batches the primary would not replay as a graph)."""
        with self._lock:
            return self._secondary.device if self._reason else self._primary.device

    @property
    def kind(self) -> str:
        return f"fallback({self._primary.kind}, {self._secondary.kind})"

    @property
    def concurrent(self) -> bool:
        """Whether engine threads may run batches side by side: when both engines allow it (on a GPU host the
        primary does not, so it stays one batch at a time)."""
        return is_concurrent(self._primary) and is_concurrent(self._secondary)

    @property
    def primary(self) -> Engine:
        return self._primary

    @property
    def secondary(self) -> Engine:
        return self._secondary

    def warmup(self) -> WarmupReport:
        """Both engines, so the first fallback does not pay the CPU's warm-up inside a request. A primary that fails
        to warm up with a CUDA fault starts the server degraded instead of failing start-up (a small or shared GPU
        would otherwise restart forever): the CPU serves, the breaker is open, and probes try the GPU later. Any
        other failure fails start-up."""
        start = time.perf_counter()
        try:
            report = self._primary.warmup()
        except Exception as exc:
            fault = startup_fault(exc)
            if fault is None:
                raise
            error = summary(exc)
        else:
            spare = self._secondary.warmup()
            log.info("CPU fallback engine warmed: device=%s engine=%s warmup=%.2fs", spare.device, spare.kind,
                     spare.seconds)
            return dataclasses.replace(report, kind=self.kind, seconds=time.perf_counter() - start)
        return self._start_degraded(fault, error, start)

    def run(self, batch: TokenBatch) -> EngineResult:
        route = self._route(batch)
        if route == "secondary":
            return self._run_secondary(batch, None)
        start_ns = time.perf_counter_ns()
        fault: GpuFault | None = None
        try:
            result = self._primary.run(batch)
        except Exception as exc:
            fault = classify(exc)
            if route == "probe":
                # Any failure ends the probe; only CUDA faults are absorbed, the rest fails the batch as it would
                # have on a healthy GPU.
                self._probe_failed(fault, summary(exc))
            elif fault is not None:
                self._gpu_failed(fault, summary(exc))
            if fault is None:
                raise
            # Leaving the except block first frees the failed attempt's frames and the device tensors they hold.
        if fault is None:
            if route == "probe":
                self._recovered(f"probe batch of {batch.size} rows ran on {self._primary.device}")
            return result
        return self._run_secondary(batch, start_ns)

    def health(self) -> EngineHealth:
        state = self.state()
        if not state.degraded:
            return EngineHealth(ok=True, device=state.serving, kind=self.kind)
        detail = f"serving from {state.serving} ({state.reason}); breaker {state.breaker.phase}"
        if state.breaker.phase == "open" and not self._fatal:
            detail += (f", next {self._primary_word} probe in "
                       f"{max(0.0, state.breaker.probe_at_s - self._clock()):.1f}s")
        if state.last_error:
            detail += f"; last {self._primary_word} error: {state.last_error}"
        return EngineHealth(ok=not self._fatal, device=state.serving, kind=self.kind, detail=detail)

    # -- outside the protocol ------------------------------------------------------------------------------------

    def state(self) -> FallbackState:
        with self._lock:
            return FallbackState(
                serving=self._secondary.device if self._reason else self._primary.device,
                reason=self._reason,
                breaker=self._breaker.state,
                pressure=self._pressure.state if self._pressure is not None else None,
                gpu_faults=self._gpu_faults,
                ooms=self._ooms,
                probes=self._probes,
                fallback_batches=self._fallback_batches,
                last_error=self._last_error,
            )

    def on_oom(self, callback: Callable[[], None]) -> None:
        """Call `callback` (quick, thread-safe: it runs under this engine's lock) for every CUDA out-of-memory error
        caught on the primary, probes included: what glassbox_gpu_oom_total counts, as it happens (a tally read at
        scrape time would start again from 0 in a restarted engine process)."""
        with self._lock:
            self._oom_listeners.append(callback)

    def attach(self, listener: DegradationListener) -> None:
        """Add a listener and tell it the current state at once, so attaching late loses nothing."""
        with self._lock:
            self._listeners.append(listener)
            reason, fatal, last_error = self._reason, self._fatal, self._last_error
        if fatal:
            _guarded(listener.mark_not_live, f"unrecoverable CUDA error: {last_error}")
        if reason:
            _guarded(listener.set_degraded, self._secondary.device, reason)

    # -- engine thread -------------------------------------------------------------------------------------------

    def _route(self, batch: TokenBatch) -> Route:
        """Where this batch goes, applying the transitions that deciding it implies."""
        if self._fatal:
            return "secondary"
        if not self._breaker.closed:
            if self._breaker.probe_due() and not self._pressure_high():
                with self._lock:
                    # Checked again under the lock: another engine thread may have begun the probe meanwhile.
                    probing = self._breaker.probe_due()
                    if probing:
                        self._breaker.begin_probe()
                        self._probes += 1
                if probing:
                    self._release_cache()
                    return "probe"
            return "secondary"
        if self._pressure_high():
            if replays(self._primary, batch):
                return "primary"  # a graph replay allocates nothing: pressure cannot make it fail
            if self._reason != REASON_MEMORY_PRESSURE:
                self._pressure_began()
            return "secondary"
        if self._reason == REASON_MEMORY_PRESSURE:
            self._recovered(f"GPU memory at {self._pressure_percent()} (below the low mark)")
        return "primary"

    def _run_secondary(self, batch: TokenBatch, attempt_start_ns: int | None) -> EngineResult:
        result = self._secondary.run(batch)
        with self._lock:
            self._fallback_batches += 1
        if attempt_start_ns is None:
            return result
        # The engine call that served this batch began with the failed GPU attempt: the infer stage includes it,
        # rather than hiding it in the queue stage. The device stays the CPU's, where the logits came from.
        start_ns = min(attempt_start_ns, result.timing.start_ns)
        return EngineResult(result.logits, dataclasses.replace(result.timing, start_ns=start_ns))

    def _pressure_high(self) -> bool:
        return self._pressure is not None and self._pressure.high()

    def _pressure_percent(self) -> str:
        reading = self._pressure.state.reading if self._pressure is not None else None
        return f"{reading.ratio:.1%} of {reading.total_bytes / 2**30:.1f} GiB" if reading else "an unknown level"

    def _start_degraded(self, fault: GpuFault, error: str, start: float) -> WarmupReport:
        """The primary never warmed up: serve from the warm secondary, breaker open (or not live after a sticky
        CUDA error), one warning line, one event."""
        spare = self._secondary.warmup()
        with self._lock:
            self._count_fault(fault, error)
            self._fatal = fault == REASON_CUDA_FATAL
            if not self._fatal:
                self._breaker.trip()
            self._reason, self._since_s = fault, self._clock()
        if self._fatal:
            self._went_fatal(error)
        else:
            log.warning("GPU start-up failed (%s) on %s: starting degraded on %s (start mode cpu_fallback); next GPU "
                        "probe in %.1fs. %s", fault, self._primary.device, spare.device,
                        self._breaker.state.cooldown_s, error)
            self._emit(True, fault, fault)
        return dataclasses.replace(spare, kind=self.kind, seconds=time.perf_counter() - start,
                                   start_mode="cpu_fallback")

    def _gpu_failed(self, fault: GpuFault, error: str) -> None:
        """A batch failed on the GPU that was routed there while the breaker was closed."""
        with self._lock:
            self._count_fault(fault, error)
            if fault != REASON_CUDA_FATAL and not self._breaker.closed:
                # Another engine thread's batch failed first and opened the breaker: this failure only counts.
                return
            if fault == REASON_CUDA_FATAL:
                self._fatal = True
            else:
                self._breaker.trip()
            self._reason, self._since_s = fault, self._clock()
        if fault == REASON_CUDA_FATAL:
            self._went_fatal(error)
            return
        cooldown = self._breaker.state.cooldown_s
        log.warning("%s fault (%s) on %s: serving from %s; next %s probe in %.1fs. %s", self._primary_word, fault,
                    self._primary.device, self._secondary.device, self._primary_word, cooldown, error)
        self._emit(True, fault, fault)

    def _probe_failed(self, fault: GpuFault | None, error: str) -> None:
        """`fault` None: the probe raised something that is not a CUDA fault (it propagates); the CPU keeps
        serving for the reason it already had."""
        with self._lock:
            if fault is not None:
                self._count_fault(fault, error)
                self._reason = fault
            breaker = self._breaker.probe_failed()
            self._fatal = fault == REASON_CUDA_FATAL
            reason = self._reason
        if fault == REASON_CUDA_FATAL:
            self._went_fatal(error)
            return
        log.warning("%s probe failed (%s) on %s: staying on %s; next %s probe in %.1fs. %s", self._primary_word,
                    fault or "not a CUDA fault", self._primary.device, self._secondary.device, self._primary_word,
                    breaker.cooldown_s, error)
        self._emit(True, REASON_PROBE_FAILED, reason)

    def _went_fatal(self, error: str) -> None:
        log.error("unrecoverable CUDA error on %s: marked not live for a restart; serving from %s meanwhile. %s",
                  self._primary.device, self._secondary.device, error)
        for listener in self._snapshot_listeners():
            _guarded(listener.mark_not_live, f"unrecoverable CUDA error: {error}")
        self._emit(True, REASON_CUDA_FATAL, REASON_CUDA_FATAL)

    def _pressure_began(self) -> None:
        with self._lock:
            if self._reason == REASON_MEMORY_PRESSURE:
                return  # another engine thread saw it first
            self._reason, self._since_s = REASON_MEMORY_PRESSURE, self._clock()
        # Our own cached blocks count as used; handing them back may be all the relief needed.
        self._release_cache()
        log.warning("GPU memory at %s, at or above the high mark: new batches go to %s until it falls below the "
                    "low mark", self._pressure_percent(), self._secondary.device)
        self._emit(True, REASON_MEMORY_PRESSURE, REASON_MEMORY_PRESSURE)

    def _recovered(self, why: str) -> None:
        with self._lock:
            if self._breaker.state.phase == "probing":
                self._breaker.probe_succeeded()
            elif not self._reason:
                return  # another engine thread saw the same recovery first
            self._reason = ""
            away_s = self._clock() - self._since_s
        log.warning("%s recovered: back on %s after %.1fs on %s (%s)", self._primary_word, self._primary.device,
                    away_s, self._secondary.device, why)
        self._emit(False, REASON_RECOVERED, "")

    def _count_fault(self, fault: GpuFault, error: str) -> None:
        # Under the lock.
        self._gpu_faults += 1
        if fault == REASON_OOM:
            self._ooms += 1
            for callback in self._oom_listeners:
                _guarded(callback)
        self._last_error = error

    def _emit(self, active: bool, event_reason: str, degraded_reason: str) -> None:
        device = self._secondary.device if active else self._primary.device
        _guarded(self._observer.on_fallback, FallbackEvent(active, event_reason, device, time.time_ns()))
        for listener in self._snapshot_listeners():
            if active:
                _guarded(listener.set_degraded, device, degraded_reason)
            else:
                _guarded(listener.clear_degraded, device)

    def _snapshot_listeners(self) -> list[DegradationListener]:
        with self._lock:
            return list(self._listeners)


def _guarded(call: Callable[..., None], *args: object) -> None:
    # Telemetry and listeners must never turn a served batch into a failed one.
    try:
        call(*args)
    except Exception:
        log.exception("fallback listener %s failed", getattr(call, "__qualname__", call))
