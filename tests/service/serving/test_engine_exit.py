"""The engine process under --exit-when-dead-s: it leaves once dead that long, so the supervisor starts a fresh one."""

from __future__ import annotations

import asyncio
import time

from glassbox.service.lifecycle import EXIT_DEAD, Lifecycle
from glassbox.service.serving.engine_process import _until_stopped


def test_a_dead_engine_exits_dead_after_the_time_set_and_a_stopped_one_exits_0() -> None:
    async def scenario() -> None:
        lifecycle = Lifecycle()
        lifecycle.mark_ready("cpu")
        lifecycle.mark_not_live("unrecoverable CUDA error: an illegal memory access was encountered")
        began = time.monotonic()
        assert await asyncio.wait_for(_until_stopped(asyncio.Event(), lifecycle, 0.5), 30) == EXIT_DEAD
        assert time.monotonic() - began >= 0.5

        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        assert await asyncio.wait_for(_until_stopped(stop, lifecycle, 60.0), 30) == 0  # dead, but asked to stop first
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        assert await asyncio.wait_for(_until_stopped(stop, lifecycle, 0.0), 30) == 0  # 0: never leaves on its own

    asyncio.run(scenario())
