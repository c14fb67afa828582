"""Engine threads run at a raised nice value (`--engine-nice`), so the HTTP event loop gets a core first."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from glassbox.service.runtime import build_runtime, lower_thread_priority
from glassbox.service.settings import load_settings
from glassbox.service.types import EngineResult, TokenBatch
from tests.service.apptools import FakeEngine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


class NiceRecorder(FakeEngine):
    """Records the nice value of the thread each batch runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.nice: list[int] = []

    def run(self, batch: TokenBatch) -> EngineResult:
        self.nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return super().run(batch)


def nice_of_a_batch(tiny_model_dir: Path, steps: int) -> int:
    engine = NiceRecorder()
    settings = load_settings({"model": str(tiny_model_dir), "device": "cpu", "engine_nice": steps}, environ={})
    runtime = build_runtime(settings, engine=engine)
    batch = TokenBatch(ids=np.array([[2, 7, 3]], dtype=np.int64), lengths=np.array([3], dtype=np.int64),
                       truncated=np.zeros(1, dtype=bool))
    runtime.batcher.start()
    try:
        asyncio.run(asyncio.wait_for(runtime.batcher.submit(batch, 2**62), 30))
    finally:
        runtime.batcher.stop(timeout_s=30)
    return engine.nice[0]


def test_engine_threads_run_at_the_raised_nice_value_and_the_caller_keeps_its_own(tiny_model_dir: Path) -> None:
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert nice_of_a_batch(tiny_model_dir, 3) == min(19, mine + 3)
    assert nice_of_a_batch(tiny_model_dir, 0) == mine
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # only the engine threads moved


def test_nothing_to_do_at_zero_and_the_setting_is_bounded() -> None:
    assert lower_thread_priority(0) is None
    with pytest.raises(ValueError, match="engine_nice"):
        load_settings({"engine_nice": 20}, environ={})
    with pytest.raises(ValueError, match="engine_nice"):
        load_settings({"engine_nice": -1}, environ={})
