"""The engine process of the multi-process layout: model, device, batcher, CPU fallback, breaker and chaos faults,
served to the HTTP workers over a Unix socket (service/ipc/hub.py).

Started by the supervisor (service/serving/supervisor.py) with `multiprocessing`'s spawn method. It loads and warms
up the model while telling every worker that connects it is loading, then ready; fallback and recovery are pushed
to the workers as they happen. On SIGTERM it finishes what it admitted, tells the workers, and exits 0. A model that
cannot be loaded exits with EXIT_CONFIG, which the supervisor does not retry. With --exit-when-dead-s, an engine
that has been dead that long drains and exits EXIT_DEAD, which the supervisor restarts like a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import uvloop
from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from glassbox.service.errors import GlassboxError
from glassbox.service.ipc.hub import EngineHub
from glassbox.service.ipc.messages import State
from glassbox.service.lifecycle import EXIT_CONFIG, EXIT_DEAD, DeadClock, Lifecycle
from glassbox.service.observer import NullObserver, Observer
from glassbox.service.serving.orphans import exit_with_parent
from glassbox.service.serving.wiring import process_telemetry
from glassbox.service.settings import Settings

if TYPE_CHECKING:
    from glassbox.service.serving.local import LocalEngineSide

log = logging.getLogger("glassbox.engine")



def startup_error_path(socket_path: str) -> str:
    """Where an engine that exits EXIT_CONFIG leaves its reason (`message (code)`), beside its socket."""
    return os.path.join(os.path.dirname(socket_path), "engine-startup-error")


class BroadcastingLifecycle(Lifecycle):
    """A Lifecycle that tells the workers about every change, from whichever thread made it (the fallback engine
    reports from the engine thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.hub: EngineHub | None = None
        self.quiet_until = 0.0  # time.monotonic() until which the workers were told this process may be silent

    def announce_quiet(self, seconds: float) -> None:
        """Tell the workers this process may not be heard from for `seconds` (0: from now on, as usual)."""
        self.quiet_until = time.monotonic() + seconds if seconds > 0 else 0.0
        self._changed()

    def _changed(self) -> None:
        hub = self.hub
        if hub is not None:
            self._loop.call_soon_threadsafe(hub.broadcast)

    def mark_ready(self, device: str) -> None:
        super().mark_ready(device)
        self._changed()

    def begin_drain(self) -> bool:
        began = super().begin_drain()
        self._changed()
        return began

    def set_degraded(self, device: str, reason: str) -> None:
        super().set_degraded(device, reason)
        self._changed()

    def clear_degraded(self, device: str) -> None:
        super().clear_degraded(device)
        self._changed()

    def mark_not_live(self, reason: str) -> None:
        super().mark_not_live(reason)
        self._changed()


def state_of(lifecycle: Lifecycle, generation: int, engine_kind: str = "") -> State:
    readiness = lifecycle.readiness()
    live, live_reason = lifecycle.live
    quiet_until = getattr(lifecycle, "quiet_until", 0.0)
    return State(phase=readiness.phase, device=readiness.device,
                 degraded_reason=readiness.reason if readiness.degraded else "", live=live, live_reason=live_reason,
                 generation=generation, engine_kind=engine_kind,
                 quiet_s=max(0.0, quiet_until - time.monotonic()) if quiet_until else 0.0)


def engine_main(settings: Settings, socket_path: str, generation: int) -> None:
    """The process target. Exits 0 after a drain, EXIT_CONFIG when the model cannot be served, 1 on a crash."""
    exit_with_parent()
    # Only the supervisor stops the engine (SIGTERM, once the workers have finished): a Ctrl-C reaches the whole
    # process group at once, and the engine must outlive the workers' drain. Ignored from the first instant, so a
    # Ctrl-C while the model loads is not a KeyboardInterrupt traceback either (the supervisor stops everything).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from glassbox.service.serving.wiring import configure_logging

    configure_logging(settings, process="engine")
    if settings.profiling:  # a worker's py-spy records this process too
        from glassbox.service.http.profile import allow_tracing

        allow_tracing()
    try:
        code = uvloop.run(serve_engine(settings, socket_path, generation))
    except GlassboxError as exc:
        try:  # the supervisor says it, in the one "cannot start" line
            Path(startup_error_path(socket_path)).write_text(f"{exc.message} ({exc.code})", encoding="utf-8")
        except OSError:
            log.error("cannot start the engine: %s (%s)", exc.message, exc.code)
        code = EXIT_CONFIG
    sys.exit(code)


async def serve_engine(settings: Settings, socket_path: str, generation: int) -> int:
    # The model and torch are imported here, in the process that runs them: the supervisor imports this module for
    # engine_main (the spawn target) and must not load them with it.
    from glassbox.service.serving.engine_side import running
    from glassbox.service.serving.local import LocalEngineSide

    telemetry = process_telemetry(settings)
    observer: Observer = telemetry.compose(None) if telemetry is not None else NullObserver()
    side = LocalEngineSide.build(settings, observer=observer)  # raises GlassboxError for a model it cannot serve
    loop = asyncio.get_running_loop()
    lifecycle = BroadcastingLifecycle(loop)
    kind = side.runtime.engine.kind
    hub = EngineHub(side.runtime.batcher, state=lambda: state_of(lifecycle, generation, kind),
                    control=_control_app(side), scrape=telemetry.scrape_text if telemetry is not None else None,
                    keep=telemetry.keep_batches if telemetry is not None else None)
    lifecycle.hub = hub
    if side.tracer is not None:  # a trace's export holds this process: the workers are told, so they wait for it
        side.tracer.announce_quiet = lifecycle.announce_quiet
    if telemetry is not None:
        side.bind(telemetry, [], {})
        telemetry.process_started("engine", restart=generation > 1)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # from the supervisor; SIGINT is ignored (engine_main)
    if os.path.exists(socket_path):
        os.unlink(socket_path)  # left by the engine process this one replaces
    await hub.listen(socket_path)
    try:
        async with running(side, lifecycle, telemetry, settings.drain_timeout_s) as drained:
            log.info("engine process %d (generation %d) listening on %s", os.getpid(), generation, socket_path)
            code = await _until_stopped(stop, lifecycle, settings.exit_when_dead_s)
    finally:
        hub.broadcast()  # the workers hear "stopped" before the link closes
        await hub.close()
    log.info("engine stopped", extra={"drained": drained[0]})
    return code


async def _until_stopped(stop: asyncio.Event, lifecycle: Lifecycle, exit_when_dead_s: float) -> int:
    """0 once the supervisor asks the engine to stop. With --exit-when-dead-s, EXIT_DEAD once liveness has been false
    that long (an unrecoverable CUDA error, a failed warm-up): the supervisor then starts a fresh engine process, with
    a fresh CUDA context, within its restart budget."""
    if exit_when_dead_s <= 0:
        await stop.wait()
        return 0
    dead = DeadClock(exit_when_dead_s)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):  # liveness has no event of its own: read once a second
                await stop.wait()
        live, reason = lifecycle.live
        if not stop.is_set() and dead.expired(live, time.monotonic()):
            log.error("the engine has been dead for %.0f s (%s): exiting with status %d so that the supervisor starts "
                      "a fresh engine process (--exit-when-dead-s)", exit_when_dead_s, reason, EXIT_DEAD)
            return EXIT_DEAD
    return 0


def _control_app(side: LocalEngineSide) -> Starlette | None:
    """The engine's own routes (the chaos control API, the engine trace), answered for the workers that relay them."""
    if not side.routes:
        return None
    from glassbox.service.http.errors import glassbox_exception, http_exception

    app = Starlette(routes=side.routes,
                    exception_handlers={HTTPException: http_exception, GlassboxError: glassbox_exception})
    app.router.redirect_slashes = False  # as the workers' app (service/app.py): a path no route takes is a 404
    return app
