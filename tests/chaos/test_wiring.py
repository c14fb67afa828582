"""--chaos wired through the real app on the CPU with the tiny model: the engine each configuration builds, a
simulated OOM taking the real fallback path (requests succeed, /readyz degraded, fallback metrics) and recovering
after disarm, an OOM failing requests with --no-cpu-fallback, the chaos gauge on /metrics, and `glassbox serve
--chaos` refusing to start without a token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from glassbox.chaos.client import TOKEN_ENV
from glassbox.chaos.engine import ChaosEngine
from glassbox.service.app import create_app
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.settings import Settings
from glassbox.telemetry import build_telemetry
from tests.service.apptools import BOUND_S, FakeEngine, app_settings, ready_client, wait_until

TOKEN = "chaos-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = ["a very good movie", "the worst film and a boring plot", "great"]


@pytest.fixture(autouse=True)
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


def settings_for(model_dir: Path, **overrides: Any) -> Settings:
    # Short cooldowns, so recovery after a disarm takes one bounded poll, not the default 5 s.
    return app_settings(model_dir, chaos=True, fallback_cooldown_s=0.02, fallback_cooldown_max_s=0.05, **overrides)


def metric(client: TestClient, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name}{labels} is not on /metrics")


def classify(client: TestClient) -> Any:
    return client.post("/v1/classify", json={"texts": TEXTS})


def test_on_a_cpu_with_fallback_the_chaos_engine_sits_inside_a_real_fallback(tiny_model_dir: Path) -> None:
    engine = create_app(settings_for(tiny_model_dir)).state.runtime.engine
    assert isinstance(engine, FallbackEngine)
    assert isinstance(engine.primary, ChaosEngine) and isinstance(engine.primary.inner, EagerEngine)
    assert isinstance(engine.secondary, EagerEngine) and engine.secondary is not engine.primary.inner
    assert engine.kind == "fallback(chaos(eager-fp32), eager-fp32)"


def test_without_fallback_or_without_chaos_the_engine_is_what_it_was(tiny_model_dir: Path) -> None:
    alone = create_app(settings_for(tiny_model_dir, cpu_fallback=False)).state.runtime.engine
    assert isinstance(alone, ChaosEngine) and isinstance(alone.inner, EagerEngine)
    plain = create_app(app_settings(tiny_model_dir)).state.runtime.engine
    assert isinstance(plain, EagerEngine)  # chaos off: no wrapper, and no CPU-behind-CPU fallback


def test_an_injected_engine_is_wrapped_as_it_is(tiny_model_dir: Path) -> None:
    fake = FakeEngine()
    engine = create_app(settings_for(tiny_model_dir), engine=fake).state.runtime.engine
    assert isinstance(engine, ChaosEngine) and engine.inner is fake


def test_a_simulated_oom_falls_back_shows_in_readyz_and_metrics_and_recovers_after_disarm(
        tiny_model_dir: Path) -> None:
    settings = settings_for(tiny_model_dir)
    app = create_app(settings, telemetry=build_telemetry(settings))
    with ready_client(app) as client:
        assert metric(client, "glassbox_chaos_fault_active", fault="oom") == 0.0
        assert classify(client).status_code == 200
        fault = client.post("/chaos/faults", json={"fault": "oom", "ttl_s": 600}, headers=AUTH).json()
        assert metric(client, "glassbox_chaos_fault_active", fault="oom") == 1.0

        answers = [classify(client) for _ in range(3)]
        assert [r.status_code for r in answers] == [200] * 3  # no request fails through the OOM
        ready = client.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "degraded", "device": "cpu", "reason": "oom"})
        assert metric(client, "glassbox_fallback_active") == 1.0
        assert metric(client, "glassbox_fallback_events_total", reason="oom") == 1.0
        assert metric(client, "glassbox_gpu_oom_total") >= 1.0

        assert client.delete(f"/chaos/faults/{fault['id']}", headers=AUTH).status_code == 200
        assert metric(client, "glassbox_chaos_fault_active", fault="oom") == 0.0

        def recovered() -> bool:
            assert classify(client).status_code == 200  # once the cooldown passes, one of these is the probe
            return bool(client.get("/readyz").json()["status"] == "ready")

        wait_until(recovered, "the primary engine served again after the disarm")
        assert metric(client, "glassbox_fallback_active") == 0.0
        assert metric(client, "glassbox_fallback_events_total", reason="recovered") == 1.0
        assert app.state.runtime.batcher.stats().engine_errors == 0


def test_an_oom_with_a_batch_budget_disarms_itself_and_sets_the_gauge_back(tiny_model_dir: Path) -> None:
    settings = settings_for(tiny_model_dir)
    app = create_app(settings, telemetry=build_telemetry(settings))
    with ready_client(app) as client:
        client.post("/chaos/faults", json={"fault": "oom", "ttl_s": 600, "batches": 1}, headers=AUTH)
        assert client.post("/v1/classify", json={"text": "great"}).status_code == 200
        assert client.get("/chaos/faults", headers=AUTH).json() == {"faults": []}
        assert metric(client, "glassbox_chaos_fault_active", fault="oom") == 0.0
        assert metric(client, "glassbox_fallback_events_total", reason="oom") == 1.0


def test_without_cpu_fallback_an_oom_fails_the_batch_with_a_5xx(tiny_model_dir: Path) -> None:
    app = create_app(settings_for(tiny_model_dir, cpu_fallback=False))
    with ready_client(app) as client:
        client.post("/chaos/faults", json={"fault": "oom", "ttl_s": 600}, headers=AUTH)
        failed = classify(client)
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "engine_error"
        assert "(OutOfMemoryError)" in failed.json()["error"]["message"]  # its text is in the server log
        client.delete("/chaos/faults", headers=AUTH)
        assert classify(client).status_code == 200


def test_shutdown_disarms_everything(tiny_model_dir: Path) -> None:
    settings = settings_for(tiny_model_dir)
    app = create_app(settings, engine=FakeEngine(), telemetry=build_telemetry(settings))
    with ready_client(app) as client:
        client.post("/chaos/faults", json={"fault": "latency", "ttl_s": 600, "delay_ms": 1}, headers=AUTH)
    assert app.state.chaos.board.faults() == []


def test_serve_with_chaos_and_no_token_exits_1_with_one_clear_line(tiny_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--chaos", "--model", str(tiny_model_dir),
            "--device", "cpu", "--port", "0", "--log-format", "text"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=BOUND_S,
                          cwd=Path(__file__).resolve().parents[2])
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "cannot start" in output and TOKEN_ENV in output and "--chaos-token-file" in output
    assert "Traceback" not in output
