"""Start-up on a GPU that may be small or shared: degrade instead of crash-looping.

A GPU engine is built and warmed as a ladder of rungs, best first: CUDA graphs on every bucket, then on fewer
buckets (the largest batch bucket halved, then quartered: the graph pool is sized by the largest graph), then eager
CUDA. An out-of-memory or recoverable CUDA error while building, warming up or capturing a rung drops it (its graphs,
their pool, its copy of the model), collects garbage, empties the allocator's cache and tries the next rung. A
rung below the first logs one warning line and reports its name as the WarmupReport's `start_mode`, which telemetry
exports (`glassbox_engine_start_mode`).

If every rung fails, `warmup()` raises GpuStartupError with the last fault; the FallbackEngine around the ladder
then starts degraded on its warm CPU engine with the breaker open (glassbox.service.engines.fallback). A later probe
batch builds the last rung (eager CUDA, no warm-up needed) and, if it runs, the GPU serves again. A sticky CUDA error
stops the ladder at once: nothing after it can work in this process. Anything that is not a CUDA fault propagates.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from glassbox.service.engines.base import Engine, replays
from glassbox.service.engines.fallback import release_cuda_cache
from glassbox.service.engines.faults import GpuFault, GpuStartupError, classify, summary
from glassbox.service.errors import EngineError
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport

log = logging.getLogger("glassbox.engine")


@dataclass(frozen=True, slots=True)
class Rung:
    mode: str  # the WarmupReport start_mode when this rung starts the server below the first: see START_MODES
    detail: str  # what it is, for the log: "CUDA graphs on 30 buckets (batch up to 32)"
    build: Callable[[], Engine]  # constructs the engine; nothing touches the device before this is called


@dataclass(frozen=True, slots=True)
class _Failure:
    fault: GpuFault
    error: str  # type and head of the message


class StartupLadder:
    """Implements the Engine protocol by delegating to the first rung that warmed up. Runs on the engine thread."""

    def __init__(self, device: str, rungs: Sequence[Rung], *, release_cache: Callable[[], None] = release_cuda_cache,
                 collect: Callable[[], object] = gc.collect) -> None:
        if not rungs:
            raise ValueError("a start-up ladder needs at least one rung")
        self._device = device
        self._rungs = tuple(rungs)
        self._release_cache = release_cache
        self._collect = collect
        self._active: Engine | None = None
        self._report: WarmupReport | None = None
        self.failures: list[str] = []  # "<rung detail>: <error summary>", in the order they happened

    @property
    def device(self) -> str:
        return self._device

    @property
    def kind(self) -> str:
        return self._active.kind if self._active is not None else f"pending({self._rungs[0].detail})"

    @property
    def active(self) -> Engine | None:
        return self._active

    def warmup(self) -> WarmupReport:
        if self._report is not None:
            return self._report
        for index, rung in enumerate(self._rungs):
            attempt = self._attempt(rung)
            if isinstance(attempt, _Failure):
                if attempt.fault == "cuda_fatal":
                    raise GpuStartupError(f"unrecoverable CUDA error during start-up: {attempt.error}", attempt.fault)
                if index == len(self._rungs) - 1:
                    raise GpuStartupError(f"every GPU start-up rung failed; last: {attempt.error}", attempt.fault)
                continue
            engine, report = attempt
            self._active = engine
            if index > 0:
                report = replace(report, start_mode=rung.mode)
                log.warning("GPU start-up degraded to %s on %s (start mode %s) after: %s", rung.detail, self._device,
                            rung.mode, "; ".join(self.failures))
            self._report = report
            return report
        raise AssertionError("unreachable: the last rung either returns or raises")

    def run(self, batch: TokenBatch) -> EngineResult:
        if self._active is None:
            if self._report is None and not self.failures:
                raise EngineError("the GPU engine ran before warmup()")
            self._active = self._rebuild_last()
        return self._active.run(batch)

    def replays(self, batch: TokenBatch) -> bool:
        return self._active is not None and replays(self._active, batch)

    def health(self) -> EngineHealth:
        if self._active is not None:
            return self._active.health()
        detail = "not warmed up" if not self.failures else f"no GPU engine: {self.failures[-1]}"
        return EngineHealth(ok=False, device=self._device, kind=self.kind, detail=detail)

    def _attempt(self, rung: Rung) -> tuple[Engine, WarmupReport] | _Failure:
        """The rung's engine and report, or what failed after a CUDA fault (the rung dropped and cleaned up)."""
        engine: Engine | None = None
        try:
            engine = rung.build()
            return engine, engine.warmup()
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            error = summary(exc)
        # Out of the except block: the exception, its traceback and the frames holding the failed rung's device
        # tensors are released, so collecting below can actually free them.
        del engine
        self.failures.append(f"{rung.detail}: {error}")
        log.info("GPU start-up rung failed (%s): %s. %s", fault, rung.detail, error)
        self._drop()
        return _Failure(fault, error)

    def _rebuild_last(self) -> Engine:
        """After every rung failed: a probe batch tries the last (simplest) rung again, without a warm-up."""
        try:
            return self._rungs[-1].build()
        except Exception:
            self._drop()
            raise

    def _drop(self) -> None:
        self._collect()  # graphs, pools and model copies of the failed rung are unreachable now
        self._release_cache()

