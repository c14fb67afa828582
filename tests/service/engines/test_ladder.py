"""The start-up ladder on the CPU: real CUDA graph engines (rehearsal capturer) whose capture runs out of memory
above a batch size, the way a small or shared GPU would; the ladder settles on fewer buckets, then eager, and a
FallbackEngine around it starts degraded on the CPU when nothing fits, instead of failing start-up."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from glassbox.service.buckets import BucketTable
from glassbox.service.engines.base import Engine
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.factory import build_engine, capped, cuda_rungs
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.faults import GpuStartupError
from glassbox.service.engines.graph_capture import CapturedGraph, EagerRehearsalCapturer, Forward
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.engines.ladder import Rung, StartupLadder
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.settings import Settings
from tests.service.engines.doubles import ManualClock, RecordingListener, oom
from tests.service.engines.graph_fixtures import one_thread
from tests.service.engines.test_graphs import token_batch

TABLE = BucketTable(batches=(1, 2, 4, 8), lengths=(8, 16))
__all__ = ["one_thread"]  # an autouse fixture, used by name


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


class OomAtCapture(EagerRehearsalCapturer):
    """Captures like the rehearsal, but raises torch's CUDA out-of-memory error when a graph's batch is larger than
    `fits`: what capture on a GPU without room for the largest graphs does. None: nothing fits."""

    def __init__(self, fits: int | None) -> None:
        super().__init__()
        self.fits = fits

    def capture(self, forward: Forward) -> CapturedGraph:
        rows = forward().shape[0]  # the bucket's batch
        if self.fits is None or rows > self.fits:
            raise oom()
        return super().capture(forward)


class Rigged:
    """Rungs like the factory's (graphs on TABLE, on fewer buckets, eager), over a GPU where `fits` rows fit a graph
    and `eager_error` (if any) is what building the eager engine raises. Counts builds, collects and releases."""

    def __init__(self, model: BertClassifier, fits: int | None, eager_error: BaseException | None = None) -> None:
        self.model, self.fits, self.eager_error = model, fits, eager_error
        self.built: list[str] = []
        self.collects = self.releases = 0
        self.engines: list[weakref.ref[Engine]] = []

    def graphs(self, table: BucketTable) -> Callable[[], Engine]:
        def build() -> Engine:
            self.built.append(f"graphs<={table.max_batch}")
            engine = CudaGraphEngine(self.model, "cpu", "fp32", table, capturer=OomAtCapture(self.fits))
            self.engines.append(weakref.ref(engine))
            return engine
        return build

    def eager(self) -> Engine:
        self.built.append("eager")
        if self.eager_error is not None:
            raise self.eager_error
        return EagerEngine(self.model, "cpu", "fp32", executor="python")

    def ladder(self) -> StartupLadder:
        rungs = [Rung("as_configured", "graphs x8", self.graphs(TABLE))]
        for limit in (4, 2):
            table = capped(TABLE, limit)
            assert table is not None
            rungs.append(Rung("fewer_buckets", f"graphs x{limit}", self.graphs(table)))
        rungs.append(Rung("eager_cuda", "eager", self.eager))
        return StartupLadder("cuda:0", rungs, release_cache=self.release, collect=self.collect)

    def collect(self) -> int:
        self.collects += 1
        return gc.collect()

    def release(self) -> None:
        self.releases += 1


def test_all_buckets_fit_so_nothing_degrades(loaded: LoadedModel) -> None:
    rig = Rigged(loaded.model, fits=8)
    ladder = rig.ladder()
    report = ladder.warmup()
    assert report.start_mode == "as_configured" and rig.built == ["graphs<=8"]
    assert ladder.failures == [] and rig.collects == 0


def test_a_capture_oom_retries_with_fewer_buckets_and_says_so_once(
    loaded: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rigged(loaded.model, fits=2)
    ladder = rig.ladder()
    with caplog.at_level(logging.INFO, logger="glassbox.engine"):
        report = ladder.warmup()
    assert rig.built == ["graphs<=8", "graphs<=4", "graphs<=2"]
    assert report.start_mode == "fewer_buckets" and report.kind == "graph-rehearsal-fp32"
    assert set(report.buckets) == set(capped(TABLE, 2).all())  # type: ignore[union-attr]
    # Each failed rung was dropped, collected and its cache released before the next was built...
    assert rig.collects == rig.releases == 2
    assert [ref() for ref in rig.engines[:2]] == [None, None]  # ...and really freed, not kept alive by a traceback
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("GPU start-up degraded to graphs x2 on cuda:0 (start mode fewer_buckets) after: "
                                  "graphs x8: OutOfMemoryError: CUDA out of memory")
    # It serves: small batches replay, larger ones run eagerly on the same device.
    batch = token_batch([5, 3], loaded.config.vocab_size)
    assert ladder.replays(batch) and ladder.run(batch).timing.mode == "graph"
    wide = token_batch([5] * 4, loaded.config.vocab_size)
    assert not ladder.replays(wide) and ladder.run(wide).timing.mode == "eager"


def test_when_no_graph_fits_eager_cuda_serves(loaded: LoadedModel) -> None:
    rig = Rigged(loaded.model, fits=None)
    ladder = rig.ladder()
    report = ladder.warmup()
    assert rig.built == ["graphs<=8", "graphs<=4", "graphs<=2", "eager"]
    assert report.start_mode == "eager_cuda" and ladder.kind == "eager-fp32"
    assert not ladder.replays(token_batch([3], loaded.config.vocab_size))


def test_when_nothing_fits_the_ladder_raises_the_fault(loaded: LoadedModel) -> None:
    rig = Rigged(loaded.model, fits=None, eager_error=oom())
    ladder = rig.ladder()
    with pytest.raises(GpuStartupError, match="every GPU start-up rung failed") as raised:
        ladder.warmup()
    assert raised.value.fault == "oom" and len(ladder.failures) == 4
    assert not ladder.health().ok and "no GPU engine" in ladder.health().detail


def test_a_sticky_cuda_error_stops_the_ladder_at_once(loaded: LoadedModel) -> None:
    rig = Rigged(loaded.model, fits=8)
    rungs = [Rung("as_configured", "broken", lambda: _raise(RuntimeError("CUDA error: an illegal memory access"))),
             Rung("eager_cuda", "eager", rig.eager)]
    with pytest.raises(GpuStartupError) as raised:
        StartupLadder("cuda:0", rungs, release_cache=rig.release, collect=rig.collect).warmup()
    assert raised.value.fault == "cuda_fatal" and rig.built == []


def test_an_error_that_is_not_a_cuda_fault_fails_start_up_as_it_is(loaded: LoadedModel) -> None:
    rig = Rigged(loaded.model, fits=8)
    rungs = [Rung("as_configured", "bug", lambda: _raise(ValueError("a bug"))), Rung("eager_cuda", "e", rig.eager)]
    with pytest.raises(ValueError, match="a bug"):
        StartupLadder("cuda:0", rungs).warmup()
    assert rig.built == []


def test_nothing_fits_so_the_server_starts_degraded_on_the_warm_cpu_and_a_probe_brings_the_gpu_back(
    loaded: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rigged(loaded.model, fits=None, eager_error=oom())
    clock, listener = ManualClock(), RecordingListener()
    cpu = EagerEngine(loaded.model, "cpu", "fp32", executor="python")
    engine = FallbackEngine(rig.ladder(), cpu, settings=Settings(fallback_cooldown_s=5.0), clock=clock)
    engine.attach(listener)
    with caplog.at_level(logging.WARNING):
        report = engine.warmup()  # no exception: the process stays live and serves
    assert (report.start_mode, report.device) == ("cpu_fallback", "cpu")
    state = engine.state()
    assert (state.reason, state.breaker.phase, state.ooms) == ("oom", "open", 1)
    assert listener.calls == [("degraded", "cpu", "oom")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "GPU start-up failed (oom) on cuda:0: starting degraded on cpu (start mode cpu_fallback); next GPU probe")
    batch = token_batch([4, 2], loaded.config.vocab_size)
    assert engine.run(batch).timing.device == "cpu"
    # The GPU frees up; after the cooldown one probe builds the last rung (eager) and it serves again.
    rig.eager_error = None
    clock.advance(5.0)
    probed = engine.run(batch)
    assert engine.state().reason == "" and listener.calls[-1][0] == "cleared"
    np.testing.assert_allclose(probed.logits, cpu.run(batch).logits, atol=1e-5)
    assert rig.built[-1] == "eager"


def test_a_sticky_error_at_start_up_marks_not_live_but_still_serves_from_the_cpu(loaded: LoadedModel) -> None:
    rungs = [Rung("as_configured", "broken", lambda: _raise(RuntimeError("CUDA error: device-side assert")))]
    listener = RecordingListener()
    cpu = EagerEngine(loaded.model, "cpu", "fp32", executor="python")
    engine = FallbackEngine(StartupLadder("cuda:0", rungs, release_cache=lambda: None), cpu)
    engine.attach(listener)
    assert engine.warmup().start_mode == "cpu_fallback"
    assert [call[0] for call in listener.calls] == ["not_live", "degraded"]
    assert engine.run(token_batch([3], loaded.config.vocab_size)).timing.device == "cpu"


def test_the_factory_ladder_halves_the_largest_batch_bucket_then_goes_eager(loaded: LoadedModel) -> None:
    settings = Settings(batch_buckets=(1, 2, 4, 8, 16, 32), length_buckets=(16, 32, 64, 128, 256))
    rungs = cuda_rungs(loaded, settings, "cuda:0", 256)  # nothing is built: no device needed
    assert [(r.mode, r.detail) for r in rungs] == [
        ("as_configured", "CUDA graphs on 30 buckets (batch up to 32)"),
        ("fewer_buckets", "CUDA graphs on 25 buckets (batch up to 16)"),
        ("fewer_buckets", "CUDA graphs on 20 buckets (batch up to 8)"),
        ("eager_cuda", "eager CUDA (fp16)"),
    ]
    eager_only = cuda_rungs(loaded, settings.replace(cuda_graphs=False), "cuda:0", 256)
    assert [(r.mode, r.detail) for r in eager_only] == [("as_configured", "eager CUDA (fp16)")]
    ladder = build_engine(loaded, settings, "cuda:0", 256)
    assert isinstance(ladder, StartupLadder) and ladder.device == "cuda:0" and ladder.active is None
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())  # built lazily, at warm-up
    with pytest.raises(Exception, match="before warmup"):
        ladder.run(token_batch([3], loaded.config.vocab_size))


def _raise(error: BaseException) -> Engine:
    raise error
