"""A second scrape target that goes through what a healthy CPU server never does, so the Degradation & chaos
panels have series to show: a CPU fallback (with GPU OOMs, failed probes and a recovery), a chaos fault switched
on and off, and an observer that raises (telemetry errors).

It is the real app under uvicorn with real telemetry (`build_telemetry`), in this process. Only the "GPU" is a
stand-in: a CPU engine that raises CUDA's out-of-memory error while told to, wrapped in the real FallbackEngine
with a real CPU engine as its secondary. The chaos fault is set the way the chaos module sets it, through
`Telemetry.set_chaos_fault`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from glassbox.service.app import create_app
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.model.loader import load_model
from glassbox.service.observer import NullObserver, RequestRecord
from glassbox.service.runtime import build_runtime
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport
from glassbox.telemetry import build_telemetry
from glassbox.telemetry.setup import Telemetry
from tests.service.apptools import app_settings, live_server, wait_until

CHAOS_FAULT = "latency_spike"


class FlakyGpu:
    """Implements the Engine protocol: `inner`'s results, or CUDA's OOM error while `failing` is set."""

    def __init__(self, inner: EagerEngine) -> None:
        self.inner = inner
        self.failing = threading.Event()

    @property
    def device(self) -> str:
        return self.inner.device

    @property
    def kind(self) -> str:
        return "flaky-" + self.inner.kind

    def warmup(self) -> WarmupReport:
        return self.inner.warmup()

    def run(self, batch: TokenBatch) -> EngineResult:
        if self.failing.is_set():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB (injected by a test)")
        return self.inner.run(batch)

    def health(self) -> EngineHealth:
        return self.inner.health()


class FailingObserver(NullObserver):
    """Raises on every request record; the composite observer counts it as a telemetry error."""

    def on_request(self, record: RequestRecord) -> None:
        raise RuntimeError("observer failure injected by a test")


@dataclass
class DegradedTarget:
    port: int
    base_url: str
    gpu: FlakyGpu
    engine: FallbackEngine
    telemetry: Telemetry

    def set_chaos(self, active: bool) -> None:
        self.telemetry.set_chaos_fault(CHAOS_FAULT, active)

    @property
    def degraded(self) -> bool:
        return bool(self.engine.state().reason)


@contextmanager
def degraded_target(model_dir: Path) -> Iterator[DegradedTarget]:
    # Short cooldowns: probes follow each other within a second, so a recovery needs only a few requests.
    settings = app_settings(model_dir, fallback_cooldown_s=0.05, fallback_cooldown_max_s=0.2, model_name="tiny",
                            max_length=64, length_buckets=(16, 32, 64))
    telemetry = build_telemetry(settings)
    failing = FailingObserver()
    observer = telemetry.compose(failing)  # what the batcher and the fallback engine report to
    model = load_model(model_dir).model
    gpu = FlakyGpu(EagerEngine(model, executor="python"))
    engine = FallbackEngine(gpu, EagerEngine(model, executor="python"), settings=settings, observer=observer)
    runtime = build_runtime(settings, engine=engine, observer=observer)
    app = create_app(settings, runtime=runtime, observer=failing, telemetry=telemetry)
    with live_server(app, settings) as server:
        base_url = f"http://127.0.0.1:{server.port}"
        wait_until(lambda: httpx.get(f"{base_url}/readyz").status_code == 200, "the degraded target is ready")
        yield DegradedTarget(server.port, base_url, gpu, engine, telemetry)
