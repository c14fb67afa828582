"""Engine doubles for the fallback tests: a "GPU" that fails on demand, a CPU engine that claims to be slow and can
be held on a gate, a clock the test moves, and a listener that records what it was told.

The GPU double computes with a real CPU engine and adds a fixed offset to its logits, so a test can tell from the
numbers alone which engine answered a row.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque

import numpy as np
import torch

from glassbox.service.engines.base import Engine
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport

BOUND_S = 30.0
# Added to the GPU double's logits: its answers are always the last label with a score of ~1, which no softmax can
# mistake for the CPU's answer (a constant offset would be invisible after softmax).
GPU_OFFSET = np.array([0.0, 0.0, 60.0], dtype=np.float32)
GPU_DEVICE = "cuda:0"


def oom(size: str = "2.00 GiB") -> torch.cuda.OutOfMemoryError:
    """What the caching allocator raises, message and all."""
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {size}. GPU 0 has a total capacity of 79.11 GiB of which "
        "1.25 MiB is free. Of the allocated memory 77.80 GiB is allocated by PyTorch."
    )


class FlakyGpu:
    """Plays a GPU engine: runs `inner` (a CPU engine of three labels) and says it ran on cuda:0, with GPU_OFFSET added.

    `planned` errors are raised by the next runs, one each, in order; while `broken` is set every run raises it.
    Every call is counted, failed or not, with its start time."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.planned: deque[BaseException] = deque()
        self.broken: BaseException | None = None
        self.calls = 0
        self.successes = 0
        self.warmups = 0
        self.started_ns: list[int] = []

    @property
    def device(self) -> str:
        return GPU_DEVICE

    @property
    def kind(self) -> str:
        return "flaky-gpu"

    def warmup(self) -> WarmupReport:
        self.warmups += 1
        report = self.inner.warmup()
        return dataclasses.replace(report, device=self.device, kind=self.kind)

    def run(self, batch: TokenBatch) -> EngineResult:
        self.calls += 1
        self.started_ns.append(time.perf_counter_ns())
        if self.planned:
            raise self.planned.popleft()
        if self.broken is not None:
            raise self.broken
        result = self.inner.run(batch)
        self.successes += 1
        timing = dataclasses.replace(result.timing, device=self.device)
        return EngineResult(result.logits + GPU_OFFSET, timing)

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)


class SlowCpu:
    """A CPU engine that claims each run took `claim_s` (the timing's start is moved back; nothing waits), so the
    batcher measures a slow device. While `gate` is clear, runs block on it (bounded) after recording their rows."""

    def __init__(self, inner: Engine, claim_s: float) -> None:
        self.inner = inner
        self.claim_ns = int(claim_s * 1e9)
        self.gate = threading.Event()
        self.gate.set()
        self.rows = 0
        self.warmups = 0
        self._seen = threading.Condition()

    @property
    def device(self) -> str:
        return self.inner.device

    @property
    def kind(self) -> str:
        return "slow-cpu"

    def warmup(self) -> WarmupReport:
        self.warmups += 1
        return self.inner.warmup()

    def run(self, batch: TokenBatch) -> EngineResult:
        with self._seen:
            self.rows += batch.size
            self._seen.notify_all()
        if not self.gate.wait(BOUND_S):
            raise RuntimeError("the test never opened the slow CPU's gate")
        result = self.inner.run(batch)
        timing = dataclasses.replace(result.timing, start_ns=result.timing.end_ns - self.claim_ns)
        return EngineResult(result.logits, timing)

    def wait_for_rows(self, count: int) -> None:
        with self._seen:
            if not self._seen.wait_for(lambda: self.rows >= count, BOUND_S):
                raise AssertionError(f"the slow CPU got {self.rows} rows, expected at least {count}")

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)


class ManualClock:
    """Seconds that pass only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class RecordingListener:
    """A DegradationListener that keeps every call, in order."""

    calls: list[tuple[str, ...]] = dataclasses.field(default_factory=list)

    def set_degraded(self, device: str, reason: str) -> None:
        self.calls.append(("degraded", device, reason))

    def clear_degraded(self, device: str) -> None:
        self.calls.append(("cleared", device))

    def mark_not_live(self, reason: str) -> None:
        self.calls.append(("not_live", reason))


class ReplayingGpu(FlakyGpu):
    """A FlakyGpu that says which batches it would replay as a CUDA graph: those of at most `replay_rows` texts
    (what a graph engine answers for batches that fit a captured bucket)."""

    def __init__(self, inner: Engine, replay_rows: int) -> None:
        super().__init__(inner)
        self.replay_rows = replay_rows

    def replays(self, batch: TokenBatch) -> bool:
        return batch.size <= self.replay_rows
