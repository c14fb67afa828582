"""Degraded mode end to end: create_app with a FallbackEngine whose "GPU" is a double raising torch's CUDA errors on
demand and whose secondary is a real CPU engine. No HTTP request fails through an OOM, /readyz and /livez say what
happened, the observer gets one FallbackEvent per transition and engine runs by device, the fallback metrics move,
and while degraded admission follows the slow CPU's measured rate: 429 + Retry-After instead of queueing work it
cannot finish in time.

The fallback clock is the test's (ManualClock): the breaker's cooldown passes when the test says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.batching.records import DROP_DEADLINE, REJECT_PREDICTED_WAIT
from glassbox.service.engines.base import Engine
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.model.loader import load_model
from glassbox.service.observer import FallbackEvent
from glassbox.service.runtime import Runtime
from glassbox.service.settings import Settings
from glassbox.telemetry.fanout import CompositeObserver
from glassbox.telemetry.metrics import build_metrics
from glassbox.telemetry.observer import MetricsObserver
from tests.service.apptools import (
    BOUND_S,
    LABELS,
    RecordingObserver,
    Reference,
    app_settings,
    live_server,
    ready_client,
    until,
    wait_ready,
    wait_until,
)
from tests.service.engines.doubles import GPU_DEVICE, FlakyGpu, ManualClock, SlowCpu, oom

TEXTS = ["a very good movie", "the worst film and a boring plot", "great", "fun music and a short script"]
COOLDOWN_S = 5.0


@dataclass
class FallbackRecorder(RecordingObserver):
    fallbacks: list[FallbackEvent] = field(default_factory=list)

    def on_fallback(self, event: FallbackEvent) -> None:
        self.fallbacks.append(event)

    @property
    def transitions(self) -> list[tuple[bool, str, str]]:
        return [(e.active, e.reason, e.device) for e in self.fallbacks]


@dataclass
class Degradable:
    app: Starlette
    gpu: FlakyGpu
    cpu: Engine
    clock: ManualClock
    observer: FallbackRecorder
    settings: Settings

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime


def degradable_app(model_dir: Path, *, claim_s: float | None = None, metrics: MetricsObserver | None = None,
                   **overrides: Any) -> Degradable:
    """The app over FallbackEngine(FlakyGpu, CPU). With `claim_s` the CPU is a SlowCpu claiming that long per run."""
    settings = app_settings(model_dir, fallback_cooldown_s=COOLDOWN_S, **overrides)
    loaded = load_model(model_dir)
    gpu = FlakyGpu(EagerEngine(loaded.model, "cpu"))
    cpu: Engine = EagerEngine(loaded.model, "cpu")
    if claim_s is not None:
        cpu = SlowCpu(cpu, claim_s)
    recorder = FallbackRecorder()
    observer = recorder if metrics is None else CompositeObserver([recorder, metrics])
    clock = ManualClock()
    engine = FallbackEngine(gpu, cpu, settings=settings, observer=observer, clock=clock)
    app = create_app(settings, engine=engine, observer=observer)
    return Degradable(app, gpu, cpu, clock, recorder, settings)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Reference:
    return Reference(tiny_model_dir, 32)


def classify(client: TestClient, texts: list[str]) -> Any:  # the TestClient's own response type
    return client.post("/v1/classify", json={"texts": texts, "all_scores": True})


def scores_of(response: Any) -> np.ndarray:
    """[n, labels] probabilities in label order."""
    rows = []
    for result in response.json()["results"]:
        by_label = {s["label"]: s["score"] for s in result["scores"]}
        rows.append([by_label[label] for label in LABELS])
    return np.array(rows)


def answered_by_gpu_double(response: Any) -> bool:
    return all(r["label"] == LABELS[-1] and r["score"] > 0.999 for r in response.json()["results"])


@pytest.mark.parametrize(("setting", "status"), [("200", 200), ("503", 503)])
def test_readyz_says_degraded_while_the_cpu_serves(tiny_model_dir: Path, setting: str, status: int) -> None:
    served = degradable_app(tiny_model_dir, ready_when_degraded=setting)
    with ready_client(served.app) as client:
        assert client.get("/readyz").json() == {"status": "ready", "device": GPU_DEVICE, "reason": ""}
        served.gpu.planned.append(oom())
        assert classify(client, TEXTS[:1]).status_code == 200
        readyz = client.get("/readyz")
        assert readyz.status_code == status
        assert readyz.json() == {"status": "degraded", "device": "cpu", "reason": "oom"}
        assert client.get("/livez").json() == {"status": "live", "reason": ""}  # degraded is not dead
        served.clock.advance(COOLDOWN_S)
        assert classify(client, TEXTS[:1]).status_code == 200  # the probe
        back = client.get("/readyz")
        assert (back.status_code, back.json()) == (200, {"status": "ready", "device": GPU_DEVICE, "reason": ""})


def test_no_request_fails_through_an_oom_and_the_gpu_comes_back(tiny_model_dir: Path, reference: Reference) -> None:
    registry = CollectorRegistry()
    served = degradable_app(tiny_model_dir, metrics=MetricsObserver(build_metrics(registry)))

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    with ready_client(served.app) as client:
        responses = [classify(client, TEXTS)]  # on the GPU
        served.gpu.planned.append(oom())
        responses.append(classify(client, TEXTS))  # the OOM batch, re-run on the CPU
        active_during = sample("glassbox_fallback_active")
        responses.append(classify(client, TEXTS[:2]))  # breaker open: the CPU
        served.clock.advance(COOLDOWN_S)
        responses.append(classify(client, TEXTS))  # the probe: the GPU again
        responses.append(classify(client, TEXTS[2:]))
    assert [r.status_code for r in responses] == [200] * 5
    assert [answered_by_gpu_double(r) for r in responses] == [True, False, False, True, True]
    # What the CPU served is the CPU engine's answer.
    np.testing.assert_allclose(scores_of(responses[1]), reference.probs(TEXTS), atol=1e-5)
    np.testing.assert_allclose(scores_of(responses[2]), reference.probs(TEXTS[:2]), atol=1e-5)

    observer = served.observer
    assert observer.transitions == [(True, "oom", "cpu"), (False, "recovered", GPU_DEVICE)]
    assert [(r.status, r.device) for r in observer.requests] == [
        (200, GPU_DEVICE), (200, "cpu"), (200, "cpu"), (200, GPU_DEVICE), (200, GPU_DEVICE)]
    # Requests are split into batches by length bucket; every batch names the device that ran it.
    device_of = {r.request_id: r.device for r in observer.requests}
    for batch in observer.batches:
        assert {device_of[request_id] for request_id in batch.request_ids} == {batch.timing.device}
    runs = {device: sum(b.timing.device == device for b in observer.batches) for device in ("cpu", GPU_DEVICE)}
    assert runs["cpu"] >= 2 and runs[GPU_DEVICE] >= 3
    assert served.runtime.batcher.stats().engine_errors == 0

    assert (active_during, sample("glassbox_fallback_active")) == (1.0, 0.0)
    assert sample("glassbox_fallback_events_total", reason="oom") == 1.0
    assert sample("glassbox_fallback_events_total", reason="recovered") == 1.0
    assert sample("glassbox_engine_runs_total", device="cpu", mode="eager", bucket="none") == runs["cpu"]
    assert sample("glassbox_engine_runs_total", device=GPU_DEVICE, mode="eager", bucket="none") == runs[GPU_DEVICE]


def test_an_unrecoverable_cuda_error_turns_livez_dead_and_requests_still_succeed(tiny_model_dir: Path) -> None:
    served = degradable_app(tiny_model_dir)
    with ready_client(served.app) as client:
        served.gpu.broken = RuntimeError("CUDA error: an illegal memory access was encountered")
        answers = [classify(client, TEXTS[:2]) for _ in range(3)]
        live = client.get("/livez")
        ready = client.get("/readyz")
    assert [r.status_code for r in answers] == [200] * 3
    assert not any(answered_by_gpu_double(r) for r in answers)
    assert live.status_code == 503 and live.json()["status"] == "dead"
    assert "illegal memory access" in live.json()["reason"]
    assert (ready.status_code, ready.json()) == (200, {"status": "degraded", "device": "cpu", "reason": "cuda_fatal"})
    assert served.gpu.calls == 1  # the context is gone: no probe, ever
    assert served.observer.transitions == [(True, "cuda_fatal", "cpu")]


@contextmanager
def live(served: Degradable) -> Iterator[str]:
    def release() -> None:
        if isinstance(served.cpu, SlowCpu):
            served.cpu.gate.set()

    with live_server(served.app, served.settings, before_stop=release) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        yield server.base_url


def test_while_degraded_admission_follows_the_slow_cpus_measured_rate(tiny_model_dir: Path) -> None:
    # The CPU claims one second per batch: 3 tokens/s for the 3-token texts below. Requests are admitted while the
    # predicted wait (the full batches of 2 ahead at that cost, after what is left of the running batch) stays
    # within 2.5 s. (The batch-time cap is raised out of the way: at 1 s a batch, the default 250 ms would run the
    # texts one at a time.)
    served = degradable_app(tiny_model_dir, claim_s=1.0, max_batch_size=2, request_timeout_ms=10_000,
                            max_queue_wait_ms=2500, max_batch_time_ms=10_000)
    cpu = served.cpu
    assert isinstance(cpu, SlowCpu)
    batcher = served.runtime.batcher
    with live(served) as base_url:
        served.gpu.broken = oom()  # the GPU stays out of memory; the clock never reaches a probe

        async def scenario() -> tuple[httpx.Response, list[httpx.Response], list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=base_url, timeout=BOUND_S) as client:
                first = await client.post("/v1/classify", json={"text": "good"})  # measures the CPU
                cpu.gate.clear()
                held = asyncio.ensure_future(client.post("/v1/classify", json={"text": "good"}))
                await asyncio.to_thread(cpu.wait_for_rows, 2)  # the CPU holds the second request for "1 s"
                queued = []
                for i in range(2):  # both ride in the next batch of 2: a wait of ~1 s (the running batch), admitted
                    queued.append(asyncio.ensure_future(client.post("/v1/classify", json={"text": "great"})))
                    await until(lambda n=i + 1: batcher.depth[0] == n, f"{i + 1} requests are queued")
                # now a full batch is ahead of any newcomer: ~1 s + 2 s, over 2.5 s: refused at once
                refused = [await client.post("/v1/classify", json={"text": "fun"}) for _ in range(3)]
                cpu.gate.set()
                return first, [await held, *[await task for task in queued]], refused

        first, served_ok, refused = asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
        stats = batcher.stats()

        served.gpu.broken = None
        served.clock.advance(COOLDOWN_S)
        recovered = httpx.post(base_url + "/v1/classify", json={"text": "good"}, timeout=BOUND_S)
    assert first.status_code == 200
    assert [r.status_code for r in served_ok] == [200] * 3  # everything admitted was answered, none timed out
    assert [r.status_code for r in refused] == [429] * 3
    # Retry-After is the predicted wait at the CPU's measured cost: a full batch (6 tokens at 3 tokens/s) after the
    # running batch's remaining (just under 1 s), rounded up. At the GPU double's rate it would have been 1.
    assert {r.headers["retry-after"] for r in refused} == {"3"}
    assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
    assert served.observer.rejected == [REJECT_PREDICTED_WAIT] * 3
    # The predicted wait refuses any newcomer here, so they were refused before being decoded or tokenized.
    assert [r.stages for r in served.observer.requests if r.status == 429] == [()] * 3
    assert stats.dropped.get(DROP_DEADLINE, 0) == 0
    assert stats.throughput_device == "cpu"

    assert recovered.status_code == 200 and answered_by_gpu_double(recovered)
    assert served.observer.transitions == [(True, "oom", "cpu"), (False, "recovered", GPU_DEVICE)]


def test_readiness_follows_even_when_the_switch_happened_before_the_app_existed(tiny_model_dir: Path) -> None:
    # attach() replays the state: a Lifecycle attached after a fallback still reports it.
    served = degradable_app(tiny_model_dir)
    engine = served.runtime.engine
    assert isinstance(engine, FallbackEngine)
    engine.warmup()
    served.gpu.planned.append(oom())
    engine.run(served.runtime.tokenizer.encode(["good"]))
    app = create_app(served.settings, runtime=served.runtime, observer=served.observer)
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").json()["status"] != "loading", "the app finished warming up")
        assert client.get("/readyz").json() == {"status": "degraded", "device": "cpu", "reason": "oom"}


def test_a_cpu_server_has_no_fallback(tiny_model_dir: Path) -> None:
    runtime: Runtime = create_app(app_settings(tiny_model_dir)).state.runtime
    assert isinstance(runtime.engine, EagerEngine)
