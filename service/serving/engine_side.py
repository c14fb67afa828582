"""What an engine side is (where batches run, as the app sees it) and the one sequence that starts and drains it.

Two implement it: LocalEngineSide (serving/local.py: the engine in this process) and RemoteEngineSide
(serving/remote.py: an HTTP worker's link to the engine process). The app's lifespan (service/app.py) and the engine
process (serving/engine_process.py) both run theirs through `running`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from starlette.routing import Route

from glassbox.service.frontend import Frontend
from glassbox.service.lifecycle import Lifecycle

if TYPE_CHECKING:
    from glassbox.service.types import WarmupReport
    from glassbox.telemetry import Telemetry


class EngineSide(Protocol):
    """Where batches run, as the app sees it: the frontend the handlers use, routes of its own (the chaos control
    API, or its relay), telemetry binding, and what starts and stops with the app."""

    @property
    def frontend(self) -> Frontend: ...

    @property
    def routes(self) -> list[Route]: ...

    def bind(self, telemetry: Telemetry, routes: list[str], extra_reasons: dict[str, tuple[str, ...]]) -> None: ...

    async def start(self, lifecycle: Lifecycle, on_report: Callable[[WarmupReport], None] | None = None) -> None: ...

    async def stop(self, drain_timeout_s: float) -> bool: ...


@contextlib.asynccontextmanager
async def running(side: EngineSide, lifecycle: Lifecycle, telemetry: Telemetry | None,
                  drain_timeout_s: float) -> AsyncIterator[list[bool]]:
    """The one start and drain sequence of every process that serves an engine side (the one-process app, each HTTP
    worker's app, the engine process): telemetry starts, then the side (warm-up goes on while /readyz says loading);
    on the way out readiness turns to draining, the side finishes what it admitted within `drain_timeout_s`, the
    lifecycle says stopped and telemetry flushes and stops. Yields a list that holds, once out, whether the drain
    finished in time."""
    if telemetry is not None:
        await telemetry.start()
    await side.start(lifecycle, telemetry.warmed_up if telemetry is not None else None)
    drained: list[bool] = []
    try:
        yield drained
    finally:
        lifecycle.begin_drain()
        drained.append(await side.stop(drain_timeout_s))
        lifecycle.mark_stopped()
        if telemetry is not None:
            await telemetry.stop()
