"""The serving shapes of the GPU path, as named checks: capture on one thread and replay on another, the fallback
engine around the graph engine with the real memory reader, the memory-pressure switch sparing replays, replays that
allocate nothing, and the start-up ladder after an out-of-memory during capture.

Each function builds its own engines (a MiniLM-sized random model on the GPU, the rehearsal stand-in on the CPU),
records into the CheckBook and never raises: a failure is a failed check with its traceback. Imports only what the
bare GPU machine has (see benchmarks/gpu_check.py).
"""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_check_book import CheckBook
from benchmarks.gpu_check_measure import Plan, random_batch
from glassbox.service.engines.base import Engine
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.factory import capped
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.graph_capture import (
    CapturedGraph,
    Capturer,
    CudaGraphCapturer,
    EagerRehearsalCapturer,
    Forward,
)
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.engines.ladder import Rung, StartupLadder
from glassbox.service.engines.pressure import MemoryReading, cuda_memory_reader
from glassbox.service.model.bert import BertClassifier
from glassbox.service.settings import Settings
from glassbox.service.types import TokenBatch

DTYPE = "fp16"
ALLOCATION_RUNS = 20
GIB = 1 << 30  # the fixed readings below are of a 100 GiB device


class OomAboveBatch:
    """A capturer that raises torch's CUDA out-of-memory error INSIDE the capture of any graph wider than `fits`
    rows (None: every graph), after the forward pass was recorded: what a capture that runs out of memory midway
    looks like to torch.cuda.graph, whose exit must then leave a state the next capture can use."""

    def __init__(self, inner: Capturer, fits: int | None) -> None:
        self.inner = inner
        self.fits = fits

    @property
    def name(self) -> str:
        return self.inner.name

    def warm(self, forward: Forward, iterations: int) -> None:
        self.inner.warm(forward, iterations)

    def capture(self, forward: Forward) -> CapturedGraph:
        def failing() -> torch.Tensor:
            output = forward()  # [b, labels]
            if self.fits is None or output.shape[0] > self.fits:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by the GPU check during capture)")
            return output

        return self.inner.capture(failing)

    def settle(self) -> None:
        self.inner.settle()

    def memory(self) -> Any:
        return self.inner.memory()


class Paths:
    """What the checks share: the model, where it runs, and how to make a capturer there."""

    def __init__(self, model: BertClassifier, plan: Plan, rehearsal: bool, book: CheckBook) -> None:
        self.model = model
        self.plan = plan
        self.rehearsal = rehearsal
        self.book = book
        self.vocab = model.config.vocab_size

    def capturer(self) -> Capturer:
        return EagerRehearsalCapturer() if self.rehearsal else CudaGraphCapturer(torch.device(self.plan.device))

    def graph_engine(self, table: Any = None, capturer: Capturer | None = None) -> CudaGraphEngine:
        return CudaGraphEngine(self.model, self.plan.device, DTYPE, table or self.plan.table,
                               capturer=capturer or self.capturer())

    def cpu_engine(self) -> EagerEngine:
        return EagerEngine(self.model, "cpu", "fp32", executor="python")

    def batches(self) -> dict[str, TokenBatch]:
        rng = np.random.default_rng(7)
        table = self.plan.table
        return {"1 short": random_batch([9], self.vocab, rng),
                "3 ragged": random_batch([5, 17, 11], self.vocab, rng),
                "full": random_batch([table.max_length] * table.max_batch, self.vocab, rng)}

    def overflow(self) -> TokenBatch:
        return random_batch([8] * (self.plan.table.max_batch + 1), self.vocab, np.random.default_rng(8))

    def guarded(self, name: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:
            self.book.error(name, exc)
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def capture_replay_threads(p: Paths) -> None:
    """warmup() (capture) on one thread, run() from another, as the server does; replays must equal the same
    model run eagerly on the same bucket, on the replaying thread."""
    engine = p.graph_engine()
    errors: list[BaseException] = []
    results: dict[str, tuple[np.ndarray, np.ndarray, str]] = {}

    def capture() -> None:
        try:
            engine.warmup()
        except BaseException as exc:
            errors.append(exc)

    def replay() -> None:
        try:
            for name, batch in p.batches().items():
                result = engine.run(batch)
                results[name] = (result.logits, engine.run_padded_eager(batch), result.timing.mode)
        except BaseException as exc:
            errors.append(exc)

    for target, label in ((capture, "glassbox-capture"), (replay, "glassbox-engine")):
        thread = threading.Thread(target=target, name=label)
        thread.start()
        thread.join()
    if errors:
        raise errors[0]
    rows = {name: {"mode": mode, "exact": bool(np.array_equal(got, ref))} for name, (got, ref, mode) in results.items()}
    ok = bool(rows) and all(r["mode"] == "graph" and r["exact"] for r in rows.values())
    p.book.record("capture_replay_threads", ok, batches=rows)


def fallback_wraps_graphs(p: Paths) -> None:
    """The server's GPU shape: FallbackEngine(graph engine, CPU engine, real memory reader)."""
    graph = p.graph_engine()
    reader = (lambda: MemoryReading(30 * GIB, 0, 100 * GIB)) if p.rehearsal else cuda_memory_reader(p.plan.device)
    engine = FallbackEngine(graph, p.cpu_engine(), memory_reader=reader, pressure_interval_s=0.0)
    report = engine.warmup()
    served = {name: engine.run(batch).timing for name, batch in p.batches().items()}
    overflow = engine.run(p.overflow()).timing
    state = engine.state()
    reading = state.pressure.reading if state.pressure is not None else None
    sane = reading is not None and 0 < reading.ratio < 1 and reading.total_bytes > 0
    if not p.rehearsal and reading is not None:
        sane = sane and reading.total_bytes == int(torch.cuda.mem_get_info(torch.device(p.plan.device))[1])
    ok = (all(t.device == graph.device and t.mode == "graph" for t in served.values())
          and overflow.device == graph.device and overflow.mode == "eager" and not state.degraded and sane)
    p.book.record("fallback_wraps_graphs", ok, kind=report.kind, start_mode=report.start_mode,
                  modes={name: t.mode for name, t in served.items()}, overflow_device=overflow.device,
                  reading=dataclasses.asdict(reading) if reading is not None else None)


def pressure_spares_replay(p: Paths) -> None:
    """At 99 % device memory (a neighbour filled the GPU), replays stay on the GPU, eager batches go to the CPU."""
    graph = p.graph_engine()
    engine = FallbackEngine(graph, p.cpu_engine(), memory_reader=lambda: MemoryReading(99 * GIB, 0, 100 * GIB),
                            pressure_interval_s=0.0)
    engine.warmup()
    before = {name: engine.run(batch).timing for name, batch in p.batches().items()}
    overflow = engine.run(p.overflow()).timing
    after = {name: engine.run(batch).timing for name, batch in p.batches().items()}
    state = engine.state()
    ok = (all(t.device == graph.device and t.mode == "graph" for t in (*before.values(), *after.values()))
          and overflow.device == "cpu" and state.reason == "memory_pressure" and state.fallback_batches == 1)
    p.book.record("pressure_spares_replay", ok, replayed_on=graph.device, overflow_on=overflow.device,
                  reason=state.reason, cpu_batches=state.fallback_batches)


def replay_allocation_free(p: Paths) -> None:
    """The caching allocator's cumulative allocation count does not move across replays (copy-out included)."""
    if p.rehearsal:
        p.book.skip("replay_allocation_free", "the CPU has no caching allocator to count")
        return
    engine = p.graph_engine()
    engine.warmup()
    device = torch.device(p.plan.device)
    counts = {}
    for name, batch in p.batches().items():
        engine.run(batch)  # a first run of this shape, outside the count
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)
        for _ in range(ALLOCATION_RUNS):
            engine.run(batch)
        torch.cuda.synchronize(device)
        counts[name] = torch.cuda.memory_stats(device).get("allocation.all.allocated", 0) - before
    p.book.record("replay_allocation_free", all(c == 0 for c in counts.values()), runs_per_batch=ALLOCATION_RUNS,
                  allocations=counts)


def capture_oom_degrades(p: Paths) -> None:
    """The start-up ladder with an OOM injected inside capture above a quarter of the largest batch: it must settle
    on fewer buckets that replay exactly. Then with nothing fitting (eager too): the FallbackEngine starts on the
    CPU with the breaker open."""
    table = p.plan.table
    fits = max(1, table.max_batch // 4)
    tables: dict[int, Any] = {}  # the factory's ladder: every bucket, then half and a quarter of the largest batch
    for divisor in (1, 2, 4):
        reduced = capped(table, table.max_batch // divisor)
        if reduced is not None:
            tables.setdefault(reduced.max_batch, reduced)
    built: list[str] = []

    def rungs(fit: int | None, eager: Callable[[], Engine]) -> list[Rung]:
        def graphs(t: Any) -> Callable[[], Engine]:
            def build() -> Engine:
                built.append(f"graphs<={t.max_batch}")
                return p.graph_engine(t, OomAboveBatch(p.capturer(), fit))
            return build
        out = [Rung("as_configured" if i == 0 else "fewer_buckets", f"graphs<={t.max_batch}", graphs(t))
               for i, t in enumerate(tables.values())]
        return [*out, Rung("eager_cuda", "eager", eager)]

    ladder = StartupLadder(p.plan.device, rungs(fits, lambda: EagerEngine(p.model, p.plan.device, DTYPE)))
    reserved_before = torch.cuda.memory_reserved() if not p.rehearsal else 0
    report = ladder.warmup()
    batch = p.batches()["3 ragged"]
    active = ladder.active
    exact = isinstance(active, CudaGraphEngine) and bool(
        np.array_equal(active.run(batch).logits, active.run_padded_eager(batch)))
    expected_failures = sum(1 for limit in tables if limit > fits)
    degraded = {"start_mode": report.start_mode, "built": list(built), "failures": list(ladder.failures),
                "replays_exactly": exact,
                "reserved_growth_bytes": (torch.cuda.memory_reserved() - reserved_before) if not p.rehearsal else 0}
    del ladder, active

    def no_room() -> Engine:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by the GPU check: eager CUDA too)")

    nothing = FallbackEngine(StartupLadder(p.plan.device, rungs(None, no_room)), p.cpu_engine(),
                             settings=Settings(fallback_cooldown_s=60.0, fallback_cooldown_max_s=60.0))
    cpu_report = nothing.warmup()
    state = nothing.state()
    served = nothing.run(batch).timing.device
    on_cpu = {"start_mode": cpu_report.start_mode, "reason": state.reason, "breaker": state.breaker.phase,
              "served_on": served}
    ok = (report.start_mode == "fewer_buckets" and exact and len(degraded["failures"]) == expected_failures
          and cpu_report.start_mode == "cpu_fallback" and state.breaker.phase == "open" and served == "cpu")
    p.book.record("capture_oom_degrades", ok, fits=fits, fewer_buckets=degraded, nothing_fits=on_cpu)


def run_paths(model: BertClassifier, plan: Plan, rehearsal: bool, book: CheckBook) -> None:
    paths = Paths(model, plan, rehearsal, book)
    for name, check in (("capture_replay_threads", capture_replay_threads),
                        ("fallback_wraps_graphs", fallback_wraps_graphs),
                        ("pressure_spares_replay", pressure_spares_replay),
                        ("replay_allocation_free", replay_allocation_free),
                        ("capture_oom_degrades", capture_oom_degrades)):
        paths.guarded(name, lambda check=check: check(paths))
