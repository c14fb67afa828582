"""Capacity by a closed loop, against a real server with a fake engine of known speed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from glassbox.chaos.capacity import measure_capacity
from glassbox.service.app import create_app
from glassbox.service.types import EngineResult, TokenBatch
from tests.service.apptools import BOUND_S, FakeEngine, app_settings, live_server, wait_ready


class PacedEngine(FakeEngine):
    """Takes 20 ms per batch, whatever its size: with one client at a time it serves ~50 requests/s."""

    def run(self, batch: TokenBatch) -> EngineResult:
        time.sleep(0.02)  # the engine's work, simulated: what the capacity run must measure
        return super().run(batch)


def test_a_closed_loop_measures_what_the_server_can_serve(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir)
    app = create_app(settings, engine=PacedEngine())
    with live_server(app, settings) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        one = asyncio.run(measure_capacity(server.base_url, ["good", "bad"], connections=1, duration_s=1.0,
                                           warmup_s=0.2))
        many = asyncio.run(measure_capacity(server.base_url, ["good", "bad"], connections=8, duration_s=1.0,
                                            warmup_s=0.2))
    # One client waits for each 20 ms batch: at most 50/s. Eight clients share batches, so more get through.
    assert 0 < one.ok_per_s <= 50 and one.failed == 0
    assert many.ok_per_s > one.ok_per_s and many.failed == 0
    assert many.to_json()["connections"] == 8


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        asyncio.run(measure_capacity("http://127.0.0.1:9", ["x"], connections=0))
