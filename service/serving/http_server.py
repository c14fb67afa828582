"""The HTTP server both layouts run: uvicorn with the slow-client guard and a graceful drain, on a socket bound first.

The one-process layout (serving/one_process.py) runs one DrainingServer; the worker layout (serving/supervisor.py)
binds the socket and each HTTP worker (serving/worker_process.py) runs a DrainingServer on it.

Drain order on SIGTERM/SIGINT: readiness turns false and the listener closes at once, idle keep-alive connections
close, in-flight (and queued) requests finish within `drain_timeout_s`, then the app's lifespan drains and stops
the engine side, and the process exits 0. A second SIGINT forces the exit. With --exit-when-dead-s, a server whose
/livez has said dead that long drains the same way and exits EXIT_DEAD (3).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import resource
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from glassbox.service.http import GuardLimits, guarded_protocol
from glassbox.service.lifecycle import EXIT_DEAD, DeadClock
from glassbox.service.settings import Settings, forwarded_hosts

log = logging.getLogger("glassbox")

BACKLOG = 2048  # connections the kernel queues before the server accepts them


def uvicorn_config(app: Starlette, settings: Settings, on_abort: Callable[[str], None]) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guarded_protocol(GuardLimits.from_settings(settings), on_abort),
        ws="none",
        lifespan="on",
        # uvicorn takes whole seconds here; round up so a drain is never cut shorter than asked.
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_timeout_s)),
        timeout_keep_alive=settings.keep_alive_timeout_s,
        # Behind a trusted proxy, X-Forwarded-For and -Proto give the client address and scheme (the spans'
        # client.address and url.scheme); the connection's own peer stays network.peer.address (the guard keeps it).
        proxy_headers=True,
        forwarded_allow_ips=forwarded_hosts(settings.forwarded_allow_ips),
        access_log=False,  # telemetry logs every request with its timings
        log_config=None,  # keep the logging configured above
        log_level=settings.log_level.lower(),
    )


def first_request(host: str, port: int) -> str:
    """The start-up line's second half: the URL to try first, as a command to paste."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    return (f"{url} (try: curl -s {url}/v1/classify -H 'content-type: application/json' "
            """-d '{"text": "a wonderful film"}')""")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with readiness dropped and the listener closed as soon as the signal arrives.

    uvicorn alone would notice the signal at its next 100 ms tick and then re-raise it after shutdown, so the process
    would die by the signal instead of exiting 0."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], object],
                 live: Callable[[], tuple[bool, str]] | None = None, exit_when_dead_s: float = 0.0) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        # --exit-when-dead-s: liveness is read once a second; dead that long, the server drains and exits EXIT_DEAD.
        self._live = live
        self._dead = DeadClock(exit_when_dead_s)
        self.exit_code = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:  # listening; the model may still be loading (the "ready: device=..." line says when)
            listeners = [sock for server in getattr(self, "servers", ()) for sock in server.sockets or ()]
            port = listeners[0].getsockname()[1] if listeners else self.config.port
            log.info("listening on %s; classify answers once /readyz says ready", first_request(self.config.host, port))

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self._live is None or counter % 10:
            return False
        live, reason = self._live()
        if not self._dead.expired(live, time.monotonic()):
            return False
        log.error("/livez has said dead for %.0f s (%s): draining and exiting with status %d, so that the process "
                  "manager starts glassbox again (--exit-when-dead-s)", self._dead.after_s, reason, EXIT_DEAD)
        self.exit_code = EXIT_DEAD
        self.should_exit = True
        self.begin_drain()
        return True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
            return
        self.should_exit = True
        if self._loop is not None:
            # A signal handler may interrupt code holding the lifecycle's lock; run the drain as a loop callback.
            self._loop.call_soon_threadsafe(self.begin_drain)

    def begin_drain(self) -> None:
        if self._draining:  # a repeated SIGTERM
            return
        self._draining = True
        self._on_drain()
        for listener in getattr(self, "servers", ()):  # absent while the lifespan is still starting
            listener.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close now, busy ones after their response
        log.info("draining: not ready, listener closed, finishing in-flight requests (up to %.1fs)",
                 self.config.timeout_graceful_shutdown or 0)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening before the model loads: a port in use is an error at once, not after
    minutes of loading and a "startup complete" line. Inheritable, so the worker layout's processes serve it too.
    OSError names the address and the flags that set it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror or exc}"
        raise OSError(exc.errno, f"{host}:{port} {reason} (--host, --port)") from None
    sock.set_inheritable(True)
    return sock


# Below this many open files a busy server can run out: each connection holds one, and past the limit the event loop
# (libuv) accepts a new connection only to reset it, with no answer, no log line and no metric of glassbox's own.
FEW_OPEN_FILES = 4096


def raise_open_file_limit() -> tuple[int, int]:
    """The soft limit on open files raised to the hard one (as Go's runtime does on Linux): a default soft
    limit of 1024 caps a server at ~1000 connections for no reason. Returns (soft, hard) as they are after; a warning
    when even that is low. Child processes inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # a sandbox may refuse; the limit stays as it was
            log.debug("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    if soft != resource.RLIM_INFINITY and soft < FEW_OPEN_FILES:
        log.warning("the open-file limit is %d (hard limit %s): about that many connections at once, and past it new "
                    "connections are reset without an answer; raise it (docker run --ulimit nofile=65536, systemd "
                    "LimitNOFILE=, ulimit -n)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft, hard
