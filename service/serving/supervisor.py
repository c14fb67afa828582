"""The supervisor of the multi-process layout: one engine process and N HTTP worker processes on one port.

It binds the listening socket itself (so a port in use fails at once, before anything starts) and hands it to every
worker, makes a fresh runtime directory (the engine's Unix socket, the metric files of prometheus_client's
multiprocess mode), starts the engine and the workers with `multiprocessing`'s spawn method, and then watches them:

- an engine process that dies is started again at once (its workers answer 503 engine_restarting meanwhile and
  reconnect by themselves); after ENGINE_RESTART_BUDGET restarts within ENGINE_RESTART_WINDOW_S it is not started
  again and /livez turns false on every worker, so the orchestrator replaces the whole server (with
  --exit-when-dead-s, the supervisor drains and exits EXIT_DEAD once that has lasted so long);
- an engine that cannot load its model (exit EXIT_CONFIG) ends the server with exit code 1: restarting cannot help;
- a worker process that dies is replaced; the other workers' connections are untouched; after WORKER_RESTART_BUDGET
  replacements within WORKER_RESTART_WINDOW_S the server stops with exit code 1 (a worker that cannot live is a bug or
  a broken host, and replacing it forever would leave clients waiting on a port nobody answers);
- everything a child would read from the settings and fail on (the model directory, the API key file, CORS origins,
  the chaos token) is checked before the port is bound, so a bad setting is one line and exit code 1, as in the
  one-process layout;
- SIGTERM or SIGINT drains: the workers stop accepting and finish what they have (uvicorn's graceful shutdown), then
  the engine finishes what it admitted, then the supervisor exits 0. A second SIGINT forces the exit.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

from glassbox.service.errors import GlassboxError
from glassbox.service.frontend import build_frontend
from glassbox.service.lifecycle import EXIT_CONFIG, EXIT_DEAD, DeadClock
from glassbox.service.serving.checks import check_start_settings
from glassbox.service.serving.engine_process import engine_main, startup_error_path
from glassbox.service.serving.http_server import bind, first_request
from glassbox.service.serving.roster import write_roster
from glassbox.service.serving.worker_process import worker_main
from glassbox.service.settings import Settings
from glassbox.service.startup import cannot_start

log = logging.getLogger("glassbox.supervisor")

ENGINE_RESTART_BUDGET = 5
ENGINE_RESTART_WINDOW_S = 600.0
WORKER_RESTART_BUDGET = 10
WORKER_RESTART_WINDOW_S = 60.0
STOP_GRACE_S = 10.0  # beyond the drain timeout, before a child that will not stop is killed
RUNTIME_PREFIX = "glassbox-"
MAX_SOCKET_PATH = 100  # AF_UNIX allows 107 bytes and a NUL on Linux; a margin for the name


@dataclass
class _Child:
    process: BaseProcess
    index: int  # the worker's index; -1 for the engine
    replacement: bool = False  # a worker started in place of one that died


def run(settings: Settings, workers: int) -> int:
    """The worker layout: serve with `workers` HTTP worker processes and one engine process until stopped; the
    process's exit code. The peer of serving/one_process.py's `run`."""
    return Supervisor(settings, workers).run()


class Supervisor:
    def __init__(self, settings: Settings, workers: int) -> None:
        if workers < 1:
            raise ValueError("the multi-process layout needs at least one worker")
        self.settings = settings
        self.workers = workers
        self._context = multiprocessing.get_context("spawn")
        self._stopping = False
        self._forced = False
        self._restarts: deque[float] = deque()
        self._worker_restarts: deque[float] = deque()
        self.generation = 0
        self._roster: dict[str, int | None] = {}
        self._startup_error = ""  # why the engine process could not start (EXIT_CONFIG), as it wrote it

    def run(self) -> int:
        settings = self.settings
        try:
            build_frontend(settings, batcher=_Unused())  # the model directory and tokenizer, checked before binding
            check_start_settings(settings)  # what the workers and the engine read at start: the key file, CORS, chaos
        except GlassboxError as exc:
            return cannot_start(settings.log_format, f"{exc.message} ({exc.code})")
        try:
            listener = bind(settings.host, settings.port)
        except OSError as exc:
            return cannot_start(settings.log_format, exc.strerror or str(exc))
        folder = runtime_folder()
        metrics = folder / "metrics"
        metrics.mkdir()
        # Read by prometheus_client when the children import it: every process writes its metric files there.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
        self._socket_path = str(folder / "engine.sock")
        self._folder = folder
        self._listener = listener
        self._live = self._context.Value("b", 1)
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous = {sig: signal.signal(sig, self._on_signal(wake_write)) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            engine = self._start_engine()
            workers = {i: self._start_worker(i) for i in range(self.workers)}
            log.info("listening on %s with %d HTTP worker processes and one engine process (pid %d); classify "
                     "answers once /readyz says ready", first_request(settings.host, listener.getsockname()[1]),
                     self.workers, engine.process.pid)
            code = self._watch(engine, workers, wake_read)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
        if self._startup_error:  # the weights, which only the engine reads: the one line, as the one-process layout
            cannot_start(settings.log_format, self._startup_error)
        return code

    # -- children ----------------------------------------------------------------------------------------------------
    def _start_engine(self) -> _Child:
        self.generation += 1
        process = self._context.Process(target=engine_main, name="glassbox-engine",
                                        args=(self.settings, self._socket_path, self.generation))
        _start_ignoring_sigint(process)
        return _Child(process, -1)

    def _start_worker(self, index: int, replacement: bool = False) -> _Child:
        process = self._context.Process(target=worker_main, name=f"glassbox-worker-{index}",
                                        args=(self.settings, index, self._listener, self._socket_path, self._live,
                                              replacement))
        _start_ignoring_sigint(process)
        return _Child(process, index, replacement)

    def _watch(self, engine: _Child, workers: dict[int, _Child], wake: int) -> int:
        code = 0
        engine_given_up = False
        dead = DeadClock(self.settings.exit_when_dead_s)
        while not self._stopping:
            self._publish_roster(engine, workers)
            sentinels: list[Any] = [child.process.sentinel for child in workers.values()]
            if not engine_given_up:
                sentinels.append(engine.process.sentinel)
            # Once the engine is given up, --exit-when-dead-s needs a clock: look again every second.
            poll = 1.0 if engine_given_up and dead.after_s > 0 else None
            ready = multiprocessing.connection.wait([*sentinels, wake], poll)
            if wake in ready:
                _drain_pipe(wake)
            if self._stopping:
                break
            if dead.expired(not engine_given_up, time.monotonic()):
                log.error("/livez has said dead for %.0f s: stopping with status %d, so that the process manager "
                          "starts glassbox again (--exit-when-dead-s)", dead.after_s, EXIT_DEAD)
                code = EXIT_DEAD
                break
            if not engine_given_up and engine.process.sentinel in ready:
                engine.process.join()
                exitcode = engine.process.exitcode
                _mark_dead(engine.process.pid)
                if exitcode == EXIT_CONFIG:
                    log.error("the engine process cannot serve this model (exit %d); stopping", exitcode)
                    with contextlib.suppress(OSError):  # the engine's reason, printed once everything has stopped
                        self._startup_error = Path(startup_error_path(self._socket_path)).read_text(encoding="utf-8")
                    code = 1
                    break
                if self._may_restart():
                    # Chaos faults live in the engine process: they die with it, and an experiment must hear so.
                    lost = "; chaos faults armed in it are gone" if self.settings.chaos else ""
                    log.error("the engine process %d exited with %s; starting it again%s", engine.process.pid,
                              exitcode, lost)
                    engine = self._start_engine()
                else:
                    engine_given_up = True
                    self._live.value = 0
                    log.error("the engine process exited with %s; %d restarts in %.0f s spent the restart budget: "
                              "not restarting it, /livez now says dead", exitcode, ENGINE_RESTART_BUDGET,
                              ENGINE_RESTART_WINDOW_S)
            for index, child in list(workers.items()):
                if child.process.sentinel in ready:
                    child.process.join()
                    _mark_dead(child.process.pid)
                    if child.process.exitcode == EXIT_CONFIG and not child.replacement:
                        # A replacement that fails so (a key file caught mid-rewrite) counts against the budget below.
                        log.error("worker %d cannot serve this model; stopping", index)
                        self._stopping = True
                        code = 1
                        continue
                    if not _within_budget(self._worker_restarts, WORKER_RESTART_BUDGET, WORKER_RESTART_WINDOW_S):
                        log.error("worker %d (pid %d) exited with %s; %d worker replacements in %.0f s: stopping",
                                  index, child.process.pid, child.process.exitcode, WORKER_RESTART_BUDGET,
                                  WORKER_RESTART_WINDOW_S)
                        self._stopping = True
                        code = 1
                        continue
                    log.error("worker %d (pid %d) exited with %s; replacing it", index, child.process.pid,
                              child.process.exitcode)
                    workers[index] = self._start_worker(index, replacement=True)
        self._stop(engine, workers, engine_given_up)
        return code

    def _publish_roster(self, engine: _Child, workers: dict[int, _Child]) -> None:
        """Tell the workers, for their scrapes, which process is which (after a start, a restart, a replacement)."""
        roster = {"supervisor": os.getpid(), "engine": engine.process.pid,
                  **{f"worker-{index}": child.process.pid for index, child in sorted(workers.items())}}
        if roster != self._roster:
            write_roster(self._folder, {role: pid for role, pid in roster.items() if pid is not None})
            self._roster = roster

    def _may_restart(self) -> bool:
        return _within_budget(self._restarts, ENGINE_RESTART_BUDGET, ENGINE_RESTART_WINDOW_S)

    def _stop(self, engine: _Child, workers: dict[int, _Child], engine_gone: bool) -> None:
        """Workers first (they stop accepting and finish their requests, which still need the engine), then the
        engine (it finishes anything left in its queue)."""
        deadline = time.monotonic() + self.settings.drain_timeout_s + STOP_GRACE_S
        self._listener.close()  # the workers hold their own copies; this one must not keep the port open
        _terminate([child.process for child in workers.values()], deadline, lambda: self._forced)
        if not engine_gone:
            _terminate([engine.process], time.monotonic() + self.settings.drain_timeout_s + STOP_GRACE_S,
                       lambda: self._forced)
        log.info("stopped")

    def _on_signal(self, wake: int) -> Any:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self._stopping and signum == signal.SIGINT:
                self._forced = True
            self._stopping = True
            with contextlib.suppress(BlockingIOError):  # a full pipe already says "wake up"
                os.write(wake, b"!")

        return handle


class _Unused:
    """The frontend checked at start-up never submits: the supervisor only validates the model directory."""

    async def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the supervisor does not serve requests")

    def check_admission(self, deadline_ns: int) -> None:
        raise RuntimeError("the supervisor does not serve requests")


def _start_ignoring_sigint(process: BaseProcess) -> None:
    """Start a child with SIGINT ignored: an ignored signal stays ignored across exec, so a Ctrl-C (which reaches the
    whole process group) cannot interrupt the child while it imports, before its own code runs; the supervisor stops
    it with SIGTERM. A worker's uvicorn later takes SIGINT for itself; the engine keeps ignoring it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def runtime_folder() -> Path:
    """A fresh folder for the engine's socket and the metric files. A socket path must fit in AF_UNIX's ~107 bytes:
    under a long $TMPDIR the folder goes to /tmp instead. (A supervisor killed with SIGKILL leaves its folder behind:
    nothing here sweeps other servers' folders, since whether one is still in use cannot be told safely from its
    name or a pid, across users, containers sharing /tmp and children still draining.)"""
    base = Path(tempfile.gettempdir())
    if len(str(base / f"{RUNTIME_PREFIX}xxxxxxxx" / "engine.sock").encode()) > MAX_SOCKET_PATH:
        base = Path("/tmp")
    return Path(tempfile.mkdtemp(prefix=RUNTIME_PREFIX, dir=base))


def _within_budget(times: deque[float], budget: int, window_s: float) -> bool:
    """Whether one more restart fits in `budget` restarts per `window_s` (`times`: those so far); counted if so."""
    now = time.monotonic()
    while times and now - times[0] > window_s:
        times.popleft()
    if len(times) >= budget:
        return False
    times.append(now)
    return True


def _terminate(processes: list[BaseProcess], deadline: float, forced: Any) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: a graceful drain
    for process in processes:
        while process.is_alive() and not forced() and time.monotonic() < deadline:
            process.join(0.1)
        if process.is_alive():
            log.error("%s (pid %s) did not stop in time; killing it", process.name, process.pid)
            process.kill()
            process.join()


def _drain_pipe(fd: int) -> None:
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 64):
            pass


def _mark_dead(pid: int | None) -> None:
    """A dead process's live gauges leave the scrape; its counters stay (they never go backwards), folded into one
    file per kind so that restarts do not pile up files every scrape reads."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if pid is None or not path:
        return
    from glassbox.telemetry.multiproc import retire_process

    try:
        retire_process(pid, path)
    except (OSError, RuntimeError):  # a damaged file costs its counts, never the supervisor
        log.exception("could not fold the metric files of process %d", pid)
