"""The engine in the server's own process: the runtime (model, engine, batcher) behind the HTTP app, its warm-up, the
chaos kit when `--chaos` is on, and the drain. The one-process layout (`glassbox serve --workers 0`), and what the
engine process runs inside itself in the multi-process layout."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from starlette.routing import Route

from glassbox.service.batching import DROP_REASONS, REJECT_REASONS
from glassbox.service.engines.base import Engine
from glassbox.service.engines.degradation import FALLBACK_REASONS, degradable
from glassbox.service.errors import ConfigurationError, ModelLoadError
from glassbox.service.frontend import Frontend, model_path
from glassbox.service.http.profile import EngineTracer, tracer_for
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.model.reference import Reference, read_reference
from glassbox.service.observer import Observer
from glassbox.service.runtime import Runtime, build_runtime
from glassbox.service.settings import Settings
from glassbox.service.types import WarmupReport

if TYPE_CHECKING:  # the composition root may know telemetry and chaos; importing only for types keeps start-up light
    from glassbox.chaos.control import ChaosKit
    from glassbox.telemetry import Telemetry

log = logging.getLogger("glassbox")
T = TypeVar("T")


class LocalEngineSide:
    """The engine side (serving/engine_side.EngineSide) where the engine runs in this process: the one-process layout,
    the engine process of the worker layout, and tests. Not an Engine itself: it holds the runtime (engine, batcher) and
    what starts and stops with it. `start` returns at once: warm-up runs in a thread while
    /readyz says loading; the batcher starts and readiness turns true when it is done."""

    def __init__(self, runtime: Runtime, chaos: ChaosKit | None = None, tracer: EngineTracer | None = None) -> None:
        self.runtime = runtime
        self.chaos = chaos
        self.tracer = tracer  # the torch profiler trace route, with --profiling
        self._tasks: list[asyncio.Future[None]] = []

    @classmethod
    def build(cls, settings: Settings, *, runtime: Runtime | None = None, engine: Engine | None = None,
              observer: Observer | None = None) -> LocalEngineSide:
        """With settings.chaos the chaos kit is built first (its token is read before the model loads, so a missing
        one fails fast) and the primary engine (or the injected `engine`) runs inside the chaos engine."""
        chaos = chaos_kit(settings) if settings.chaos else None
        if chaos is not None and runtime is not None:
            raise ConfigurationError("--chaos needs the app to build its runtime, so the chaos engine can wrap "
                                     "its engine")
        runtime = runtime or build_runtime(settings, engine=engine, observer=observer,
                                          wrap_primary=chaos.wrap_primary if chaos is not None else None)
        return cls(runtime, chaos, tracer_for(settings, os.environ, runtime.device_choice.device))

    @property
    def frontend(self) -> Frontend:
        return self.runtime.frontend

    @property
    def routes(self) -> list[Route]:
        """The routes that act on the engine: the chaos control API (--chaos) and the engine trace (--profiling)."""
        return ((self.chaos.control.routes if self.chaos is not None else [])
                + (self.tracer.routes if self.tracer is not None else []))

    def reasons(self) -> dict[str, tuple[str, ...]]:
        """The values the rare-event counters of this engine can take, for telemetry to create at 0."""
        fallback = FALLBACK_REASONS if degradable(self.runtime.engine) is not None else ()
        return {"rejected": REJECT_REASONS, "dropped": DROP_REASONS, "fallback": fallback}

    def reference(self) -> Reference | None:
        """The model directory's reference.json; None when it has none, or one that cannot be read (said in the log:
        drift is then measured against the first texts served)."""
        try:
            return read_reference(model_path(self.runtime.settings))
        except ModelLoadError as exc:
            log.warning("%s", exc.message)
            return None

    def bind(self, telemetry: Telemetry, routes: list[str], extra_reasons: dict[str, tuple[str, ...]]) -> None:
        runtime = self.runtime
        telemetry.bind(batcher=runtime.batcher, engine=runtime.engine, model_name=runtime.model_name,
                       device=runtime.device_choice.device, routes=routes,
                       reasons={**self.reasons(), **extra_reasons}, labels=runtime.labels,
                       problem=runtime.model.config.problem_type, reference=self.reference())
        if self.chaos is not None:
            self.chaos.export_to(telemetry.set_chaos_fault)

    async def start(self, lifecycle: Lifecycle, on_report: Callable[[WarmupReport], None] | None = None) -> None:
        self.runtime.watch_degradation(lifecycle)  # /readyz says degraded and /livez dead when the engine says so
        self._tasks.append(asyncio.ensure_future(warm_up(self.runtime, lifecycle, on_report)))
        if self.chaos is not None:
            self._tasks.append(asyncio.ensure_future(self.chaos.sweep()))

    async def stop(self, drain_timeout_s: float) -> bool:
        """Finish what was admitted (within `drain_timeout_s`), stop the engine thread, disarm chaos faults."""
        for task in self._tasks:
            if not task.done():
                task.cancel()
        drained = await self.runtime.batcher.drain(drain_timeout_s)
        self.runtime.batcher.stop()
        if self.chaos is not None:
            self.chaos.close()  # after the drain: held GPU memory goes back, the gauges end at 0
        return drained


def chaos_kit(settings: Settings) -> ChaosKit:
    from glassbox.chaos.control import ChaosKit  # only servers started with --chaos load the chaos package

    return ChaosKit.from_settings(settings, os.environ)


async def in_own_thread(call: Callable[[], T], name: str) -> T:
    """`call()` on a thread of its own that ends with it. Not the loop's default executor: an OpenMP team that torch
    builds for a thread lives as long as the thread, and a team left on a pooled thread would slow the engine
    threads' teams for good (service/cores.py)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():  # the awaiting task may have been cancelled meanwhile
            outcome()

    def body() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting task, whatever it was
            error = exc
            loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            loop.call_soon_threadsafe(settle, lambda: future.set_result(result))

    threading.Thread(target=body, name=name, daemon=True).start()
    return await future


async def warm_up(runtime: Runtime, lifecycle: Lifecycle,
                  on_report: Callable[[WarmupReport], None] | None = None) -> None:
    try:
        report = await in_own_thread(runtime.engine.warmup, "glassbox-warmup")
    except Exception as exc:  # a failed warm-up leaves a process an orchestrator should restart
        log.exception("warm-up failed")
        lifecycle.mark_not_live(f"warm-up failed: {exc}")
        return
    if on_report is not None:
        try:
            on_report(report)
        except Exception:  # telemetry must never keep the server from becoming ready
            log.exception("warm-up report observer failed")
    runtime.batcher.start()
    if runtime.settings.gc_freeze:
        gc.collect()
        gc.freeze()  # the model, the tokenizer and the app are never garbage: collections no longer walk them
    lifecycle.mark_ready(runtime.engine.device)
    buckets = ",".join(str(b) for b in report.buckets)
    executor = f" executor={report.executor}" if report.executor else ""  # the CPU's: TorchScript, Python or AOTI
    log.info(
        "ready: device=%s engine=%s%s warmed=%s length_buckets=%s max_batch=%d warmup=%.2fs model=%s (%s)",
        report.device, report.kind, executor, buckets, ",".join(map(str, runtime.batcher.limits.length_buckets)),
        runtime.settings.max_batch_size, report.seconds, runtime.model_name, runtime.device_choice.reason,
    )
