"""A worker process starts accepting on the shared socket only once it knows the engine's state (or after a bound):
without that, a worker that came up after its siblings answered 503 not_ready for its first requests while they
served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import service.serving.remote as remote_module
from service.ipc.messages import State
from service.lifecycle import Lifecycle
from service.serving.remote import RemoteEngine
from tests.service.apptools import app_settings

READY = State("ready", "cpu", "", True, "", 1, "eager-fp32")


def test_start_returns_as_soon_as_the_engine_has_said_it_is_ready(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = RemoteEngine.build(app_settings(tiny_model_dir), str(tmp_path / "no-engine.sock"))
    lifecycle = Lifecycle()

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, engine.apply, READY)  # the engine's first word, as the link would hand it over
        started = time.monotonic()
        await engine.start(lifecycle)
        waited = time.monotonic() - started
        ready = lifecycle.readiness().phase == "ready"
        await engine.stop(1.0)
        return ready, waited

    ready, waited = asyncio.run(scenario())
    assert ready  # when uvicorn starts accepting, this worker already says ready
    assert 0.15 <= waited < 2.0


def test_start_gives_up_waiting_when_no_engine_answers(tiny_model_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "FIRST_STATE_WAIT_S", 0.3)
    engine = RemoteEngine.build(app_settings(tiny_model_dir), str(tmp_path / "no-engine.sock"))
    lifecycle = Lifecycle()

    async def scenario() -> float:
        started = time.monotonic()
        await engine.start(lifecycle)  # the worker still starts: it answers 503 while the engine is away
        waited = time.monotonic() - started
        await engine.stop(1.0)
        return waited

    assert 0.25 <= asyncio.run(scenario()) < 3.0
