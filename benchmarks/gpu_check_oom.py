"""The out-of-memory part of the GPU check (issue 5, item 6): a real CUDA OOM, the CPU fallback, and recovery.

On a GPU: an eager CUDA engine (fp16) and a CPU engine (fp32) behind a FallbackEngine. Device memory is filled
with `torch.empty` chunks until less is free than the largest batch needs, traffic of that batch is sent, and the
check verifies that the real OOM is caught and re-run on the CPU, that a probe while memory is still filled fails
and doubles the cooldown, that freeing the filler lets the next probe bring the GPU back, and that the
memory-pressure switch moves batches to the CPU on real `mem_get_info` readings before any OOM. Latency P50/P99 of
the same batch is recorded before, during and after.

The eager CUDA engine is the primary on purpose: a CUDA graph replays into memory reserved at capture and its
inputs are copied into static buffers, so a captured shape allocates no device memory per batch; only the eager
path (no graphs, or shapes above the largest bucket) can meet an OOM in a batch.

`rehearsal=True` runs every step on the CPU with `SimulatedGpu`, which raises torch's OutOfMemoryError when a batch
is larger than the simulated free memory, so the script is known to work before GPU minutes are spent on it. A
rehearsal says nothing about a GPU.

Imports only what the bare GPU machine has (see benchmarks/gpu_check.py).
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_check_measure import percentiles, random_batch
from benchmarks.gpu_check_oom_rigs import (
    GPU_MODEL,
    GPU_SHAPE,
    REHEARSAL_MODEL,
    REHEARSAL_SHAPE,
    Rig,
    cuda_rig,
    rehearsal_rig,
)
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.observer import FallbackEvent, NullObserver
from glassbox.service.settings import Settings
from glassbox.service.types import EngineResult, TokenBatch

RUNS = {"before": 30, "during": 8, "after": 30}


class Clock:
    """The breaker's clock, moved by the check: cooldowns pass exactly when the script says, not after waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Events(NullObserver):
    """An Observer that keeps the fallback events (the other hooks do nothing, as NullObserver's)."""

    events: list[FallbackEvent] = dataclasses.field(default_factory=list)

    def on_fallback(self, event: FallbackEvent) -> None:
        self.events.append(event)


def traffic(engine: FallbackEngine, batch: TokenBatch, runs: int) -> tuple[list[float], list[EngineResult]]:
    """`runs` batches, timed around the whole fallback engine call (a re-run on the CPU included)."""
    times, results = [], []
    for _ in range(runs):
        start = time.perf_counter()
        results.append(engine.run(batch))
        times.append(time.perf_counter() - start)
    return times, results


def phase(times: list[float], results: list[EngineResult]) -> dict[str, Any]:
    devices: dict[str, int] = {}
    for result in results:
        devices[result.timing.device] = devices.get(result.timing.device, 0) + 1
    return {**percentiles(times), "devices": devices}


def oom_phases(rig: Rig, settings: Settings) -> dict[str, Any]:
    """Before, during (OOM, failed probe) and after (recovery), with the checks that decide the verdict."""
    clock, observer = Clock(), Events()
    engine = FallbackEngine(rig.primary, rig.secondary, settings=settings, observer=observer, clock=clock)
    engine.warmup()
    gpu, batch = rig.primary.device, rig.batch
    traffic(engine, batch, 3)  # untimed: first-call costs (cuBLAS handles, allocator growth)
    before = traffic(engine, batch, RUNS["before"])
    memory = rig.fill()
    during = traffic(engine, batch, RUNS["during"])
    tripped = engine.state()
    cpu_answer = rig.secondary.run(batch).logits  # [n, labels]: what every fallback batch must have returned
    clock.now += settings.fallback_cooldown_s
    probe_under_fill = traffic(engine, batch, 1)
    failed_probe_state = engine.state()
    rig.free()
    clock.now += failed_probe_state.breaker.cooldown_s
    after = traffic(engine, batch, RUNS["after"])
    state = engine.state()
    reasons = [e.reason for e in observer.events]
    during_results = during[1] + probe_under_fill[1]
    checks = {
        "filled_until_the_batch_no_longer_fits": memory.get("batch_fits") == 0,
        "before_on_primary": all(r.timing.device == gpu for r in before[1]),
        "oom_caught": tripped.ooms == 1 and tripped.reason == "oom",  # the first batch only; then the breaker
        "during_on_cpu_no_failure": len(during_results) == RUNS["during"] + 1
        and all(r.timing.device == rig.secondary.device for r in during_results),
        "during_logits_are_the_cpus": all(np.allclose(r.logits, cpu_answer, atol=1e-5) for r in during_results),
        "probe_under_fill_failed_and_doubled": reasons[:2] == ["oom", "probe_failed"]
        and failed_probe_state.breaker.cooldown_s == 2 * settings.fallback_cooldown_s,
        "recovered_after_free": reasons[2:] == ["recovered"] and state.breaker.phase == "closed",
        "after_on_primary": all(r.timing.device == gpu for r in after[1]),
    }
    return {
        "memory": memory,
        "latency": {"before": phase(*before), "during": phase(*during), "after": phase(*after)},
        "events": [{"active": e.active, "reason": e.reason, "device": e.device} for e in observer.events],
        "first_error": tripped.last_error,
        "probe_error": failed_probe_state.last_error,
        "ooms_caught": state.ooms,
        "probes": state.probes,
        "checks": checks,
        "pass": all(checks.values()),
    }


def pressure_phase(rig: Rig, settings: Settings) -> dict[str, Any]:
    """The memory-pressure switch on real readings: filled memory sends batches to the CPU before any OOM."""
    observer = Events()
    engine = FallbackEngine(rig.primary, rig.secondary, settings=settings, observer=observer,
                            memory_reader=rig.reader, pressure_interval_s=0.0, clock=Clock())
    rig.fill()
    try:
        under = engine.run(rig.batch)
        reading = engine.state().pressure
    finally:
        rig.free()
    back = engine.run(rig.batch)
    state = engine.state()
    checks = {
        "switched_before_oom": under.timing.device == rig.secondary.device and state.ooms == 0,
        "transitions": [e.reason for e in observer.events] == ["memory_pressure", "recovered"],
        "back_on_primary": back.timing.device == rig.primary.device,
    }
    ratio = reading.reading.ratio if reading is not None and reading.reading is not None else None
    return {"ratio_when_filled": ratio, "events": [e.reason for e in observer.events], "checks": checks,
            "pass": all(checks.values())}


def oom_check(rehearsal: bool = False) -> dict[str, Any]:
    """Run both parts. A failed check is a result with pass False; so is a script error, with its traceback, so
    that a run on the GPU machine always leaves something to read."""
    started = time.perf_counter()
    if not rehearsal and not torch.cuda.is_available():
        return {"status": "skipped", "pass": False, "reason": "no CUDA device"}
    batch_size, length = REHEARSAL_SHAPE if rehearsal else GPU_SHAPE
    vocab = (REHEARSAL_MODEL if rehearsal else GPU_MODEL)["vocab_size"]
    batch = random_batch([length] * batch_size, vocab, np.random.default_rng(5))
    # Short cooldowns: the check's clock moves them past anyway; these only fix the numbers it asserts on.
    settings = Settings(fallback_cooldown_s=1.0, fallback_cooldown_max_s=8.0)
    threads = torch.get_num_threads()
    if rehearsal:
        torch.set_num_threads(1)  # a tiny model on shared cores: thread hand-off would dominate
    rig: Rig | None = None
    try:
        rig = rehearsal_rig(batch) if rehearsal else cuda_rig(batch)
        result: dict[str, Any] = {"status": "ran", "mode": "cpu-rehearsal" if rehearsal else "gpu",
                                  "primary": f"{rig.primary.kind} on {rig.primary.device}",
                                  "secondary": f"{rig.secondary.kind} on {rig.secondary.device}",
                                  "shape": f"{batch_size}x{length}"}
        result["oom"] = oom_phases(rig, settings)
        result["pressure"] = pressure_phase(rig, settings)
        result["pass"] = result["oom"]["pass"] and result["pressure"]["pass"]
    except Exception as exc:  # reported in the JSON rather than lost with the run
        result = {"status": "error", "pass": False, "reason": f"{type(exc).__name__}: {exc}"[:500],
                  "traceback": traceback.format_exc()[-3000:]}
    finally:
        torch.set_num_threads(threads)
        if rig is not None:
            rig.free()
        del rig
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result["elapsed_s"] = time.perf_counter() - started
    return result


def describe(result: dict[str, Any]) -> list[str]:
    """The lines gpu_check prints."""
    if result.get("status") != "ran":
        return [f"  oom: {result.get('status')} ({result.get('reason', '')})"]
    oom, pressure = result["oom"], result["pressure"]
    memory = ", ".join(f"{k} {v / 2**20:.1f} MiB" if k.endswith("_bytes") else f"{k} {v}"
                       for k, v in oom["memory"].items())
    lines = [f"  oom {'PASS' if result['pass'] else 'FAIL'} [{result['mode']}]: {result['primary']} -> "
             f"{result['secondary']}, batch {result['shape']}", f"    memory: {memory}"]
    for name in ("before", "during", "after"):
        row = oom["latency"][name]
        lines.append(f"    {name:>6}: p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms on {row['devices']}")
    failed = [name for name, ok in {**oom["checks"], **pressure["checks"]}.items() if not ok]
    lines.append(f"    events {[e['reason'] for e in oom['events']]}; first error: {oom['first_error'][:120]}")
    lines.append(f"    pressure {'PASS' if pressure['pass'] else 'FAIL'}: events {pressure['events']}, "
                 f"ratio when filled {pressure['ratio_when_filled']}")
    if failed:
        lines.append(f"    failed checks: {', '.join(failed)}")
    return lines
