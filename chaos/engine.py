"""ChaosEngine: an Engine wrapper that injects the armed faults into each batch, on the engine thread.

It wraps the primary engine, inside the FallbackEngine when there is one, so an injected out-of-memory error takes
the same path a real one does: the fallback engine classifies it, re-runs the batch on the CPU, opens its breaker
and probes later. While the fallback engine serves from its secondary, primary faults do not apply (the primary is
not called), except on probe batches. Per batch, in this order:

- latency: every armed latency fault draws a delay and the engine thread sleeps their sum before the batch; the
  result's timing starts before the sleep, so the delay lands in the request's `infer` stage;
- oom (raise mode): raise torch.cuda.OutOfMemoryError, with a message that says glassbox chaos injected it;
- error: each armed error fault fails the batch with probability `fraction` (InjectedError, not a CUDA error, so
  the fallback engine lets it propagate and the batcher answers the batch's requests with 500 engine_error).

Draws come from one numpy Generator seeded from Settings.seed, under a lock: on a CPU host two engine threads may
run batches through this wrapper at once (it is concurrent when its inner engine is). Warm-up runs without faults.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from glassbox.chaos.faults import FaultBoard
from glassbox.chaos.specs import MAX_DELAY_MS, LatencySpec
from glassbox.service.engines.base import Engine, is_concurrent, replays
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport


class InjectedError(RuntimeError):
    """The failure an `error` fault injects. Deliberately not a CUDA error: nothing absorbs it."""


def injected_oom(fault_id: str) -> torch.cuda.OutOfMemoryError:
    # Shaped like the caching allocator's message, so whatever reads messages treats it as an OOM; the rest says
    # where it came from, so nobody chases a phantom leak in the logs.
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory (injected by glassbox chaos, fault {fault_id}; no memory was actually allocated)"
    )


def draw_delay_ms(spec: LatencySpec, rng: np.random.Generator) -> float:
    """One delay from the fault's distribution, capped at MAX_DELAY_MS."""
    if spec.distribution == "uniform":
        value = float(rng.uniform(spec.min_ms or 0.0, spec.max_ms or 0.0))
    elif spec.distribution == "exponential":
        value = float(rng.exponential(spec.delay_ms or 0.0))
    elif spec.distribution == "lognormal":
        value = float(rng.lognormal(math.log(spec.delay_ms or 1.0), spec.sigma or 0.0))
    else:
        value = spec.delay_ms or 0.0
    return min(value, MAX_DELAY_MS)


class ChaosEngine:
    """Implements the Engine protocol around `inner`; `device` and `health` are the inner engine's."""

    def __init__(self, inner: Engine, board: FaultBoard, *, seed: int = 0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._inner = inner
        self._board = board
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        self._sleep = sleep

    @property
    def inner(self) -> Engine:
        return self._inner

    @property
    def board(self) -> FaultBoard:
        return self._board

    @property
    def device(self) -> str:
        return self._inner.device

    @property
    def kind(self) -> str:
        return f"chaos({self._inner.kind})"

    @property
    def concurrent(self) -> bool:
        """As the inner engine: the faults add no state that two batches at once could corrupt."""
        return is_concurrent(self._inner)

    def warmup(self) -> WarmupReport:
        return dataclasses.replace(self._inner.warmup(), kind=self.kind)

    def health(self) -> EngineHealth:
        return self._inner.health()

    def replays(self, batch: TokenBatch) -> bool:
        """Passed on, so the memory-pressure switch treats a chaos-wrapped graph engine as it does the bare one."""
        return replays(self._inner, batch)

    def run(self, batch: TokenBatch) -> EngineResult:
        faults = self._board.begin_batch()
        if faults is None:
            return self._inner.run(batch)
        start_ns = time.perf_counter_ns()
        delay_ms = 0.0
        for fault_id, spec in faults.latency:
            with self._rng_lock:
                drawn = draw_delay_ms(spec, self._rng)
            self._board.tally(fault_id, "batches_delayed")
            self._board.tally(fault_id, "delay_total_ms", round(drawn, 3))
            delay_ms += drawn
        if delay_ms > 0:
            self._sleep(delay_ms / 1000)
        if faults.oom is not None:
            raise injected_oom(faults.oom)
        for fault_id, error in faults.errors:
            self._board.tally(fault_id, "batches_seen")
            with self._rng_lock:
                draw = self._rng.random()
            if draw < error.fraction:
                self._board.tally(fault_id, "batches_failed")
                raise InjectedError(f"batch failed on purpose (injected by glassbox chaos, fault {fault_id})")
        result = self._inner.run(batch)
        timing = dataclasses.replace(result.timing, start_ns=min(start_ns, result.timing.start_ns))
        return EngineResult(result.logits, timing)
