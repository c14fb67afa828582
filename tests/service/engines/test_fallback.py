"""The fallback engine on the CPU: a GPU double that raises torch's CUDA errors on chosen batches in front of a real
CPU EagerEngine. No request fails through an OOM, outputs are the CPU's, the breaker opens, probes after its
cooldown (doubling on failure), recovers, and switches on memory pressure with hysteresis. The clock is the test's.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from glassbox.service.engines.base import Engine, is_concurrent
from glassbox.service.engines.degradation import degradable
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.factory import with_cpu_fallback
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.pressure import MemoryReading
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.observer import FallbackEvent, NullObserver
from glassbox.service.settings import Settings
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import EngineResult, TokenBatch
from tests.service.engines.doubles import (
    BOUND_S,
    GPU_DEVICE,
    GPU_OFFSET,
    FlakyGpu,
    ManualClock,
    RecordingListener,
    ReplayingGpu,
    oom,
)

TEXTS = ["a very good movie", "the worst film and a boring plot", "great", "fun music and a short script"]
COOLDOWN_S = 5.0


@dataclass
class FallbackObserver(NullObserver):
    """An Observer that keeps only the fallback events (the other hooks are the batcher's business)."""

    events: list[FallbackEvent] = field(default_factory=list)
    broken: bool = False

    def on_fallback(self, event: FallbackEvent) -> None:
        if self.broken:
            raise RuntimeError("the observer is broken")
        self.events.append(event)

    @property
    def summary(self) -> list[tuple[bool, str, str]]:
        return [(e.active, e.reason, e.device) for e in self.events]


@dataclass
class Rig:
    engine: FallbackEngine
    gpu: FlakyGpu
    cpu: EagerEngine
    clock: ManualClock
    listener: RecordingListener
    observer: FallbackObserver
    releases: list[int]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def batch(loaded: LoadedModel) -> TokenBatch:
    return TextTokenizer.from_file(loaded.tokenizer_file, 32, loaded.config.max_position_embeddings).encode(TEXTS)


@pytest.fixture(scope="module")
def cpu_engine(loaded: LoadedModel) -> EagerEngine:
    return EagerEngine(loaded.model, "cpu")


@pytest.fixture(scope="module")
def gpu_inner(loaded: LoadedModel) -> EagerEngine:
    return EagerEngine(loaded.model, "cpu")


def make_rig(cpu: EagerEngine, gpu_inner: EagerEngine, *, readings: list[float] | None = None,
             cooldown_max_s: float = 300.0, gpu: FlakyGpu | None = None) -> Rig:
    clock, listener, observer, releases = ManualClock(), RecordingListener(), FallbackObserver(), [0]
    gpu = gpu if gpu is not None else FlakyGpu(gpu_inner)
    settings = Settings(fallback_cooldown_s=COOLDOWN_S, fallback_cooldown_max_s=cooldown_max_s)
    reader = None
    if readings is not None:
        def reader() -> MemoryReading:
            return MemoryReading(int(readings[0] * 1000), 0, 1000)

    def release() -> None:
        releases[0] += 1

    engine = FallbackEngine(gpu, cpu, settings=settings, observer=observer, memory_reader=reader,
                            pressure_interval_s=0.0, clock=clock, release_cache=release)
    engine.attach(listener)
    return Rig(engine, gpu, cpu, clock, listener, observer, releases)


@pytest.fixture
def rig(cpu_engine: EagerEngine, gpu_inner: EagerEngine) -> Rig:
    return make_rig(cpu_engine, gpu_inner)


def test_it_is_an_engine(rig: Rig) -> None:
    assert isinstance(rig.engine, Engine)
    assert rig.engine.kind == "fallback(flaky-gpu, eager-fp32)"
    assert rig.engine.device == GPU_DEVICE


def test_it_declares_that_it_can_degrade_and_plain_engines_do_not(rig: Rig, cpu_engine: EagerEngine) -> None:
    assert degradable(rig.engine) is rig.engine
    assert degradable(cpu_engine) is None and degradable(rig.gpu) is None


def test_warmup_warms_both_engines(rig: Rig) -> None:
    report = rig.engine.warmup()
    assert rig.gpu.warmups == 1
    assert (report.device, report.kind) == (GPU_DEVICE, rig.engine.kind)
    assert report.seconds > 0


def test_an_oom_batch_is_rerun_on_the_cpu_and_no_row_fails(rig: Rig, batch: TokenBatch) -> None:
    cpu_logits = rig.cpu.run(batch).logits
    healthy = rig.engine.run(batch)
    assert healthy.timing.device == GPU_DEVICE
    np.testing.assert_array_equal(healthy.logits, cpu_logits + GPU_OFFSET)

    rig.gpu.planned.append(oom())
    fell_back = rig.engine.run(batch)
    np.testing.assert_array_equal(fell_back.logits, cpu_logits)  # the CPU's answer, exactly
    assert fell_back.timing.device == "cpu" and fell_back.timing.mode == "eager"
    assert fell_back.timing.rows == batch.size
    # The infer time of this batch includes the failed GPU attempt.
    assert fell_back.timing.start_ns <= rig.gpu.started_ns[-1]

    state = rig.engine.state()
    assert (state.serving, state.reason, state.breaker.phase, state.ooms, state.gpu_faults) == (
        "cpu", "oom", "open", 1, 1)
    assert "CUDA out of memory" in state.last_error
    assert rig.observer.summary == [(True, "oom", "cpu")]
    assert rig.listener.calls == [("degraded", "cpu", "oom")]
    assert rig.engine.device == "cpu"
    assert rig.engine.health().ok and "next GPU probe in 5.0s" in rig.engine.health().detail


def test_while_open_batches_skip_the_gpu_until_the_cooldown_ends(rig: Rig, batch: TokenBatch) -> None:
    rig.gpu.planned.append(oom())
    rig.engine.run(batch)
    calls = rig.gpu.calls
    for _ in range(3):
        rig.clock.advance(1.6)  # 4.8 s in all: still short of the cooldown
        assert rig.engine.run(batch).timing.device == "cpu"
    assert rig.gpu.calls == calls
    assert rig.releases == [0]
    rig.clock.advance(0.2)
    probe = rig.engine.run(batch)  # the probe batch: the GPU answers
    assert probe.timing.device == GPU_DEVICE
    assert rig.gpu.calls == calls + 1
    assert rig.releases == [1]  # cached memory released before the probe
    state = rig.engine.state()
    assert (state.serving, state.reason, state.breaker.phase, state.probes) == (GPU_DEVICE, "", "closed", 1)
    assert state.breaker.cooldown_s == COOLDOWN_S
    assert rig.observer.summary == [(True, "oom", "cpu"), (False, "recovered", GPU_DEVICE)]
    assert rig.listener.calls == [("degraded", "cpu", "oom"), ("cleared", GPU_DEVICE)]
    assert state.fallback_batches == 4


def test_a_failed_probe_reruns_on_the_cpu_and_doubles_the_cooldown(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    rig = make_rig(cpu_engine, gpu_inner, cooldown_max_s=15.0)
    reported: list[str] = []
    rig.engine.on_oom(lambda: reported.append("oom"))  # what glassbox_gpu_oom_total counts, as it happens
    cpu_logits = rig.cpu.run(batch).logits
    rig.gpu.broken = oom()
    rig.engine.run(batch)
    waits = []
    for _ in range(3):
        wait = rig.engine.state().breaker.cooldown_s
        waits.append(wait)
        rig.clock.advance(wait - 0.01)
        calls = rig.gpu.calls
        rig.engine.run(batch)
        assert rig.gpu.calls == calls  # not yet
        rig.clock.advance(0.01)
        result = rig.engine.run(batch)  # the probe fails with a real OOM type and the CPU answers
        assert rig.gpu.calls == calls + 1
        np.testing.assert_array_equal(result.logits, cpu_logits)
        assert result.timing.device == "cpu"
    assert waits == [5.0, 10.0, 15.0]
    assert rig.engine.state().breaker.cooldown_s == 15.0  # the ceiling
    assert rig.observer.summary == [(True, "oom", "cpu")] + [(True, "probe_failed", "cpu")] * 3
    assert rig.engine.state().ooms == 4
    assert reported == ["oom"] * 4  # the failed probes too

    rig.gpu.broken = None
    rig.clock.advance(15.0)
    assert rig.engine.run(batch).timing.device == GPU_DEVICE
    assert rig.engine.state().breaker.cooldown_s == COOLDOWN_S  # reset after the success
    assert rig.observer.summary[-1] == (False, "recovered", GPU_DEVICE)
    assert rig.releases == [4]


def test_a_cuda_out_of_memory_runtime_error_and_a_recoverable_cuda_error_follow_the_same_path(
    rig: Rig, batch: TokenBatch
) -> None:
    rig.gpu.planned.append(RuntimeError("CUDA error: out of memory"))
    assert rig.engine.run(batch).timing.device == "cpu"
    rig.clock.advance(COOLDOWN_S)
    rig.engine.run(batch)  # recovered
    rig.gpu.planned.append(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"))
    assert rig.engine.run(batch).timing.device == "cpu"
    assert rig.observer.summary == [(True, "oom", "cpu"), (False, "recovered", GPU_DEVICE),
                                    (True, "cuda_error", "cpu")]
    state = rig.engine.state()
    assert (state.reason, state.ooms, state.gpu_faults) == ("cuda_error", 1, 2)


def test_an_unrecoverable_cuda_error_marks_not_live_and_the_cpu_serves_for_good(rig: Rig, batch: TokenBatch) -> None:
    cpu_logits = rig.cpu.run(batch).logits
    rig.gpu.planned.append(RuntimeError("CUDA error: an illegal memory access was encountered"))
    result = rig.engine.run(batch)
    np.testing.assert_array_equal(result.logits, cpu_logits)
    assert rig.listener.calls[0][0] == "not_live" and "illegal memory access" in rig.listener.calls[0][1]
    assert rig.listener.calls[1:] == [("degraded", "cpu", "cuda_fatal")]
    assert rig.observer.summary == [(True, "cuda_fatal", "cpu")]
    rig.clock.advance(10_000.0)
    calls = rig.gpu.calls
    for _ in range(3):
        assert rig.engine.run(batch).timing.device == "cpu"
    assert rig.gpu.calls == calls  # never probed: the context is gone until the restart
    health = rig.engine.health()
    assert not health.ok and health.device == "cpu" and "illegal memory access" in health.detail


def test_a_fatal_error_during_a_probe_also_marks_not_live(rig: Rig, batch: TokenBatch) -> None:
    rig.gpu.planned.append(oom())
    rig.engine.run(batch)
    rig.clock.advance(COOLDOWN_S)
    rig.gpu.planned.append(RuntimeError("CUDA error: unspecified launch failure"))
    assert rig.engine.run(batch).timing.device == "cpu"
    assert [call[0] for call in rig.listener.calls] == ["degraded", "not_live", "degraded"]
    assert rig.observer.summary[-1] == (True, "cuda_fatal", "cpu")
    rig.clock.advance(10_000.0)
    rig.engine.run(batch)
    assert rig.engine.state().probes == 1


def test_errors_that_are_not_cuda_faults_propagate_and_leave_the_breaker_closed(rig: Rig, batch: TokenBatch) -> None:
    rig.gpu.planned.append(ValueError("a bug in the engine"))
    with pytest.raises(ValueError, match="a bug in the engine"):
        rig.engine.run(batch)
    rig.gpu.planned.append(RuntimeError("Expected all tensors to be on the same device, cuda:0 and cpu"))
    with pytest.raises(RuntimeError, match="same device"):
        rig.engine.run(batch)
    assert rig.engine.state().breaker.phase == "closed"
    assert rig.observer.events == [] and rig.listener.calls == []
    assert rig.engine.run(batch).timing.device == GPU_DEVICE


def test_a_probe_that_raises_a_non_cuda_error_fails_that_batch_and_stays_on_the_cpu(
    rig: Rig, batch: TokenBatch
) -> None:
    rig.gpu.planned.append(oom())
    rig.engine.run(batch)
    rig.clock.advance(COOLDOWN_S)
    rig.gpu.planned.append(ValueError("a bug in the engine"))
    with pytest.raises(ValueError):
        rig.engine.run(batch)
    state = rig.engine.state()
    assert (state.reason, state.breaker.phase, state.breaker.cooldown_s) == ("oom", "open", 2 * COOLDOWN_S)
    assert rig.engine.run(batch).timing.device == "cpu"


def test_memory_pressure_switches_before_an_oom_with_hysteresis(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    level = [0.50]
    rig = make_rig(cpu_engine, gpu_inner, readings=level)
    devices = []
    for ratio in (0.50, 0.96, 0.90, 0.86, 0.84, 0.94, 0.95):
        level[0] = ratio
        rig.clock.advance(1.0)
        devices.append(rig.engine.run(batch).timing.device)
    assert devices == [GPU_DEVICE, "cpu", "cpu", "cpu", GPU_DEVICE, GPU_DEVICE, "cpu"]
    assert rig.gpu.calls == 3  # never tried on the GPU while under pressure, so nothing ever failed there
    assert rig.observer.summary == [(True, "memory_pressure", "cpu"), (False, "recovered", GPU_DEVICE),
                                    (True, "memory_pressure", "cpu")]
    assert rig.listener.calls[0] == ("degraded", "cpu", "memory_pressure")
    assert rig.releases == [2]  # our own cached blocks released on each switch
    pressure = rig.engine.state().pressure
    assert pressure is not None and pressure.high and pressure.reading == MemoryReading(950, 0, 1000)


def test_memory_pressure_spares_batches_the_gpu_replays_as_graphs(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    """A graph replay allocates nothing: at any memory level it stays on the GPU. Only batches the primary would run
    eagerly (here: more than 2 texts) go to the CPU under pressure, and only they make the switch."""
    level = [0.99]
    rig = make_rig(cpu_engine, gpu_inner, readings=level, gpu=ReplayingGpu(gpu_inner, replay_rows=2))
    small, large = batch.select(np.array([0, 1])), batch  # 2 texts replay, 4 would run eagerly
    assert [rig.engine.run(small).timing.device for _ in range(3)] == [GPU_DEVICE] * 3
    assert rig.observer.summary == [] and not rig.engine.state().degraded  # nothing was moved, nothing said
    assert rig.engine.run(large).timing.device == "cpu"
    assert rig.observer.summary == [(True, "memory_pressure", "cpu")]
    assert rig.engine.run(small).timing.device == GPU_DEVICE  # still replayed while the eager ones wait it out
    level[0] = 0.5
    assert rig.engine.run(large).timing.device == GPU_DEVICE
    assert rig.observer.summary == [(True, "memory_pressure", "cpu"), (False, "recovered", GPU_DEVICE)]
    assert rig.gpu.calls == 5 and rig.engine.state().fallback_batches == 1


def test_no_probe_while_memory_is_under_pressure(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    level = [0.5]
    rig = make_rig(cpu_engine, gpu_inner, readings=level)
    rig.gpu.planned.append(oom())
    rig.engine.run(batch)
    level[0] = 0.97
    rig.clock.advance(COOLDOWN_S)
    calls = rig.gpu.calls
    assert rig.engine.run(batch).timing.device == "cpu"
    assert rig.gpu.calls == calls
    level[0] = 0.5
    rig.clock.advance(0.1)
    assert rig.engine.run(batch).timing.device == GPU_DEVICE
    assert rig.observer.summary == [(True, "oom", "cpu"), (False, "recovered", GPU_DEVICE)]


def test_one_warning_per_transition_never_one_per_batch(
    rig: Rig, batch: TokenBatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="glassbox.fallback"):
        rig.gpu.broken = oom()
        for _ in range(5):
            rig.engine.run(batch)
        rig.clock.advance(COOLDOWN_S)
        for _ in range(5):
            rig.engine.run(batch)  # the first is a failed probe
        rig.gpu.broken = None
        rig.clock.advance(2 * COOLDOWN_S)
        for _ in range(5):
            rig.engine.run(batch)  # the first is the successful probe
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith("GPU fault (oom) on cuda:0: serving from cpu; next GPU probe in 5.0s")
    assert warnings[1].startswith("GPU probe failed (oom) on cuda:0: staying on cpu; next GPU probe in 10.0s")
    assert warnings[2].startswith("GPU recovered: back on cuda:0 after 15.0s on cpu")


def test_a_broken_observer_or_listener_never_fails_a_batch(rig: Rig, batch: TokenBatch) -> None:
    class Broken(RecordingListener):
        def set_degraded(self, device: str, reason: str) -> None:
            raise RuntimeError("listener down")

    rig.observer.broken = True
    rig.engine.attach(Broken())
    rig.gpu.planned.append(oom())
    assert rig.engine.run(batch).timing.device == "cpu"
    assert rig.listener.calls == [("degraded", "cpu", "oom")]  # the others were still told


def test_a_listener_attached_late_is_told_the_current_state(rig: Rig, batch: TokenBatch) -> None:
    rig.gpu.planned.append(RuntimeError("CUDA error: device-side assert triggered"))
    rig.engine.run(batch)
    late = RecordingListener()
    rig.engine.attach(late)
    assert [call[0] for call in late.calls] == ["not_live", "degraded"]
    assert late.calls[1] == ("degraded", "cpu", "cuda_fatal")


def test_the_factory_wraps_gpu_engines_only_and_leaves_the_model_on_the_cpu(
    loaded: LoadedModel, gpu_inner: EagerEngine
) -> None:
    gpu = FlakyGpu(gpu_inner)
    settings = Settings(quantize="none", cpu_executor="python")
    wrapped = with_cpu_fallback(gpu, loaded, settings, NullObserver())
    assert isinstance(wrapped, FallbackEngine) and wrapped.primary is gpu
    assert isinstance(wrapped.secondary, EagerEngine) and wrapped.secondary.device == "cpu"
    assert wrapped.secondary.kind == "eager-fp32"
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())
    assert wrapped.state().pressure is not None  # the GPU's memory is watched (read on the first batch)
    assert with_cpu_fallback(gpu, loaded, settings.replace(cpu_fallback=False), NullObserver()) is gpu
    assert with_cpu_fallback(gpu_inner, loaded, settings, NullObserver()) is gpu_inner  # already on the CPU


class CpuPrimary(FlakyGpu):
    """The primary of a chaos server on a CPU host: a CPU engine under simulated GPU faults."""

    @property
    def device(self) -> str:
        return "cpu"


def test_a_cpu_primary_is_never_called_a_gpu(cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(cpu_engine, gpu_inner, gpu=CpuPrimary(gpu_inner))
    with caplog.at_level(logging.INFO, logger="glassbox.fallback"):
        rig.gpu.broken = oom()
        rig.engine.run(batch)
        detail = rig.engine.health().detail
        rig.gpu.broken = None
        rig.clock.advance(COOLDOWN_S)
        rig.engine.run(batch)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("CPU primary fault (oom) on cpu: serving from cpu; next CPU primary probe in 5.0s")
    assert warnings[1].startswith("CPU primary recovered: back on cpu after 5.0s on cpu")
    assert "next CPU primary probe in 5.0s" in detail and "last CPU primary error: " in detail


class ConcurrentCpuPrimary(CpuPrimary):
    """A CPU primary two engine threads may call at once; `meet` makes each call wait until both are inside."""

    concurrent = True

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.meet = threading.Barrier(2, timeout=BOUND_S)

    def run(self, batch: TokenBatch) -> EngineResult:
        self.meet.wait()
        return super().run(batch)


def side_by_side(engine: FallbackEngine, batch: TokenBatch) -> list[EngineResult]:
    """Two engine threads run `batch` at once; each result, or the first error either raised."""
    results: list[EngineResult] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(engine.run(batch))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND_S)
    if errors:
        raise errors[0]
    return results


def test_it_runs_batches_side_by_side_only_when_both_engines_may(
    rig: Rig, cpu_engine: EagerEngine, gpu_inner: EagerEngine
) -> None:
    assert not is_concurrent(rig.engine)  # a GPU primary: one batch at a time
    both = make_rig(cpu_engine, gpu_inner, gpu=ConcurrentCpuPrimary(gpu_inner))
    assert is_concurrent(both.engine) == is_concurrent(cpu_engine) is True


def test_two_batches_failing_at_once_open_the_breaker_once_and_both_are_answered(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    rig = make_rig(cpu_engine, gpu_inner, gpu=ConcurrentCpuPrimary(gpu_inner))
    rig.gpu.broken = oom()
    results = side_by_side(rig.engine, batch)  # both are inside the primary before either fails
    cpu_logits = rig.cpu.run(batch).logits
    assert len(results) == 2
    for result in results:
        np.testing.assert_array_equal(result.logits, cpu_logits)
    state = rig.engine.state()
    assert (state.breaker.phase, state.breaker.failures, state.ooms, state.fallback_batches) == ("open", 1, 2, 2)
    assert rig.observer.summary == [(True, "oom", "cpu")]  # one transition, one event
    assert rig.listener.calls == [("degraded", "cpu", "oom")]


def test_two_batches_due_for_a_probe_at_once_send_one_to_the_primary(
    cpu_engine: EagerEngine, gpu_inner: EagerEngine, batch: TokenBatch
) -> None:
    gpu = ConcurrentCpuPrimary(gpu_inner)
    gpu.meet = threading.Barrier(1)  # no waiting inside the primary: the race is in the routing
    race: list[threading.Barrier] = []

    def reader() -> MemoryReading:
        # Read by the routing right after it saw a probe due: both threads meet here, so both have seen it.
        if race:
            race[0].wait()
        return MemoryReading(0, 0, 1000)

    clock, observer = ManualClock(), FallbackObserver()
    engine = FallbackEngine(gpu, cpu_engine, settings=Settings(fallback_cooldown_s=COOLDOWN_S), observer=observer,
                            memory_reader=reader, pressure_interval_s=0.0, clock=clock, release_cache=lambda: None)
    gpu.planned.append(oom())
    engine.run(batch)
    clock.advance(COOLDOWN_S)
    calls = gpu.calls
    race.append(threading.Barrier(2, timeout=BOUND_S))
    results = side_by_side(engine, batch)
    assert len(results) == 2
    assert sorted(r.timing.device for r in results) == ["cpu", "cpu"]  # a CPU primary and the CPU secondary
    assert gpu.calls == calls + 1 and engine.state().probes == 1
    assert engine.state().breaker.phase == "closed"
    assert observer.summary == [(True, "oom", "cpu"), (False, "recovered", "cpu")]
