"""An HTTP worker process of the multi-process layout: uvicorn with the slow-client guard on the listening socket
the supervisor bound (every worker accepts from the same one), the same app as the one-process layout, and the
engine reached over its Unix socket. Started by the supervisor with `multiprocessing`'s spawn method."""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
from typing import Any

from glassbox.service.errors import GlassboxError
from glassbox.service.lifecycle import EXIT_CONFIG
from glassbox.service.observer import NullObserver, Observer
from glassbox.service.serving.orphans import exit_with_parent
from glassbox.service.serving.remote import RemoteEngineSide
from glassbox.service.serving.wiring import process_telemetry
from glassbox.service.settings import Settings

log = logging.getLogger("glassbox.worker")


def worker_main(settings: Settings, index: int, listener: socket.socket, socket_path: str,
                live_flag: Any = None, replacement: bool = False) -> None:
    """The process target. `live_flag` is the supervisor's shared flag (multiprocessing.Value): 0 once the engine's
    restart budget is spent, which /livez then reports. `replacement`: a worker that died is being replaced."""
    from glassbox.service.app import assemble_app
    from glassbox.service.serving.http_server import DrainingServer, uvicorn_config
    from glassbox.service.serving.wiring import configure_logging

    exit_with_parent()
    configure_logging(settings, process=f"worker-{index}")
    telemetry = process_telemetry(settings)
    if telemetry is not None:
        telemetry.process_started("worker", restart=replacement)
    observer: Observer = telemetry.compose(None) if telemetry is not None else NullObserver()
    try:
        side = RemoteEngineSide.build(settings, socket_path, worker=index,
                                  live=(lambda: bool(live_flag.value)) if live_flag is not None else (lambda: True))
        app = assemble_app(settings, side, observer, telemetry, profile_root=os.getppid())
    except GlassboxError as exc:  # a setting it cannot start with: replacing the worker would fail the same way
        log.error("cannot start worker %d: %s (%s)", index, exc.message, exc.code)
        sys.exit(EXIT_CONFIG)
    if settings.gc_freeze:
        gc.collect()
        gc.freeze()  # the app, the tokenizer and the imports are never garbage: collections no longer walk them
    server = DrainingServer(uvicorn_config(app, settings, observer.on_aborted), app.state.lifecycle.begin_drain)
    server.run(sockets=[listener])
    sys.exit(0)
