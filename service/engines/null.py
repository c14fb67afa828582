"""A benchmark-only engine: fixed logits at once, no model. It measures what the HTTP front end alone can carry
(`benchmarks/frontend.py`); `glassbox serve` refuses it without `--benchmark`, so it can never answer real traffic."""

from __future__ import annotations

import time

import numpy as np

from glassbox.service.types import EngineHealth, EngineResult, EngineTiming, TokenBatch, WarmupReport


class NullEngine:
    def __init__(self, num_labels: int) -> None:
        self._row = np.linspace(-1.0, 1.0, num_labels, dtype=np.float32)  # [labels]: the same answer for every text

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def kind(self) -> str:
        return "null"

    @property
    def concurrent(self) -> bool:
        return True

    def warmup(self) -> WarmupReport:
        return WarmupReport(self.device, self.kind, (), 0.0)

    def run(self, batch: TokenBatch) -> EngineResult:
        start = time.perf_counter_ns()
        logits = np.broadcast_to(self._row, (batch.size, self._row.shape[0])).copy()  # [n, labels]
        width = batch.max_length
        timing = EngineTiming(start, time.perf_counter_ns(), self.device, "eager", batch.size, batch.real_tokens,
                              batch.size * width, None)
        return EngineResult(logits, timing)

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)
