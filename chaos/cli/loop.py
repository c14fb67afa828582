"""The event loop the load-generating commands (`glassbox bench`, `glassbox chaos run`) run on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run on uvloop when it is installed (it comes with uvicorn[standard]): the generator's per-request cost
    is mostly event-loop work, and it shares the machine with whatever it measures. Under the overload experiment
    the runner's generator spent 0.19 ms of CPU a request on uvloop against 0.22 on asyncio's own loop, and the 429
    P99 it read was 0.5-1.1 ms lower (docs/benchmarks/2026-12-04-chaos-runner-uvloop.md)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())
