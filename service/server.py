"""`glassbox serve`: flags from Settings, the app, and uvicorn with the slow-client guard and a graceful drain.

Drain order on SIGTERM/SIGINT: readiness turns false and the listener closes at once, idle keep-alive connections
close, in-flight (and queued) requests finish within `drain_timeout_s`, then the app's lifespan drains and stops
the batcher, and the process exits 0. A second SIGINT forces the exit. With --exit-when-dead-s, a server whose
/livez has said dead that long drains the same way and exits EXIT_DEAD (3).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import logging
import math
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from glassbox.service.cores import serial_main_thread
from glassbox.service.errors import GlassboxError
from glassbox.service.http import GuardLimits, guarded_protocol
from glassbox.service.lifecycle import EXIT_DEAD, DeadClock
from glassbox.service.observer import NullObserver, Observer
from glassbox.service.secret_flag import add_secret_flag
from glassbox.service.settings import (
    ENV_PREFIX,
    ListError,
    Settings,
    choices_for,
    field_names,
    forwarded_hosts,
    load_settings,
    parse_int_list,
    sources,
    unknown_variables,
)
from glassbox.service.settings_help import GROUPS
from glassbox.service.startup import cannot_start

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
log = logging.getLogger("glassbox")


# --- flags ----------------------------------------------------------------------------------------------------------
def _int_list(raw: str) -> tuple[int, ...]:
    try:
        return parse_int_list(raw)
    except ListError as error:  # argparse puts the flag's name in front of the message
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, in the groups of settings_help.GROUPS, except secrets: those come from their
    GLASSBOX_* variable or a file only (a flag value shows in `ps`), and the flag that would take one is refused with
    a line that says so. Defaults are None so that only flags the user gave override GLASSBOX_* vars. The help shows
    the value in effect without the flag: a `GLASSBOX_*` variable's (and names it), else the default."""
    parser.usage = f"{parser.prog} [options]"  # the groups below list them; the full usage was 60 lines
    parser.epilog = ("Every flag is also a GLASSBOX_* variable (a flag wins). docs/settings.md lists each setting with "
                     "the details its line here leaves out.")
    effective = sources()
    specs = {spec.name: spec for spec in dataclasses.fields(Settings)}
    for title, about, names in GROUPS:
        group = parser.add_argument_group(title, about)
        for name in names:
            _add_flag(group, specs[name], effective[name])


def _add_flag(group: argparse._ArgumentGroup, spec: dataclasses.Field[Any], effective: tuple[str, str]) -> None:
    flag = "--" + spec.name.replace("_", "-")
    default = spec.default
    variable = f"{ENV_PREFIX}{spec.name.upper()}"
    if spec.metadata.get("secret"):
        add_secret_flag(group, flag, variable, f"{flag}-file")
        return
    value, source = effective
    help_text = f"{spec.metadata['help']} (env {variable}"
    if source != "default":
        help_text += f", now: {value} from {variable})"
    else:
        help_text += f", default: {value})" if value != "" else ")"
    help_text = help_text.replace("%", "%%")  # argparse formats help strings with %
    if isinstance(default, bool):
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif isinstance(default, tuple):
        group.add_argument(flag, type=_int_list, default=None, metavar="N,N,...", help=help_text)
    elif isinstance(default, int | float):
        group.add_argument(flag, type=type(default), default=None, metavar=spec.name.upper(), help=help_text)
    else:
        choices = LOG_LEVELS if spec.name == "log_level" else choices_for(spec.name)
        group.add_argument(flag, default=None, choices=choices, help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in field_names()}
    return load_settings({name: value for name, value in overrides.items() if value is not None})


# --- uvicorn ----------------------------------------------------------------------------------------------------------
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


# --- the command ----------------------------------------------------------------------------------------------------
def _workers(settings: Settings) -> int:
    """0 for the one-process layout, else the number of HTTP worker processes (the `workers` setting)."""
    if settings.workers != "auto":
        return int(settings.workers)
    from glassbox.service.engines.factory import choose_device
    from glassbox.service.serving.layout import resolve_workers

    try:
        device = choose_device(settings.device).device
    except GlassboxError:
        device = "cpu"  # the engine reports the unavailable device itself, with its own message
    return resolve_workers(settings.workers, device)


def bind(settings: Settings) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use is an error at once, not after minutes of
    loading and a "startup complete" line. OSError names the address."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror or exc}"
        raise OSError(exc.errno, f"{settings.host}:{settings.port} {reason} (--host, --port)") from None
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




def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"glassbox serve: {exc}", file=sys.stderr)
        return 2
    if settings.log_level.lower() not in LOG_LEVELS:
        print(f"glassbox serve: log level must be one of {', '.join(LOG_LEVELS)}", file=sys.stderr)
        return 2
    # Before anything imports torch: the process that runs the engine keeps its main thread's OpenMP team empty (the
    # engine process of --workers inherits this through its environment).
    serial_main_thread()
    from glassbox.service.app import (  # the composition root; keeps other commands light
        configure_logging,
        create_serving_app,
    )

    workers = _workers(settings)
    # Before the app is built, so the model-loading and start-up lines already go out in this format and level.
    configure_logging(settings, process="supervisor" if workers else "")
    for warning in unknown_variables():
        log.warning("%s", warning)
    raise_open_file_limit()
    if workers:
        from glassbox.service.serving.supervisor import Supervisor

        return Supervisor(settings, workers).run()
    try:
        sock = bind(settings)
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
