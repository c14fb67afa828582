"""The one-process layout (`--workers 0`): the engine on a thread beside the HTTP event loop, in this process.

Its peer is the worker layout (serving/supervisor.py). Both are started by `glassbox serve` (service/server.py) after
the common start-up (settings, logging, the open-file limit), and both follow one sequence: bind the port (a port in
use fails at once), check and load what the server needs (a bad setting or model fails before anything listens),
serve until SIGTERM/SIGINT or --exit-when-dead-s, drain, and return the exit code (service/lifecycle.py).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette

from glassbox.service.errors import GlassboxError
from glassbox.service.observer import NullObserver, Observer
from glassbox.service.serving.http_server import DrainingServer, bind, uvicorn_config
from glassbox.service.serving.wiring import process_telemetry
from glassbox.service.settings import Settings
from glassbox.service.startup import cannot_start


def create_serving_app(settings: Settings) -> Starlette:
    """The app `glassbox serve` runs in one process: `create_app` with telemetry wired in unless `--no-telemetry`."""
    # The composition root, imported only here: it brings the model, torch and telemetry along.
    from glassbox.service.app import create_app

    return create_app(settings, telemetry=process_telemetry(settings))


def run(settings: Settings) -> int:
    """Serve in this process until stopped; the process's exit code."""
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        return cannot_start(settings.log_format, exc.strerror or str(exc))
    try:
        app = create_serving_app(settings)
    except GlassboxError as exc:
        sock.close()
        return cannot_start(settings.log_format, f"{exc.message} ({exc.code})")
    state: Any = app.state
    observer: Observer = getattr(state, "observer", None) or NullObserver()
    lifecycle = state.lifecycle
    server = DrainingServer(uvicorn_config(app, settings, observer.on_aborted), lifecycle.begin_drain,
                            live=lambda: lifecycle.live, exit_when_dead_s=settings.exit_when_dead_s)
    server.run(sockets=[sock])
    return server.exit_code
