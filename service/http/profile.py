"""Profiles on demand. Off by default; `--profiling` turns both routes on, behind their own bearer token
(GLASSBOX_PROFILE_TOKEN or --profile-token-file), like the chaos control API.

- `POST /debug/profile?seconds=N` records what every thread of the server's processes runs for N seconds and answers
  the profile, in the speedscope format (https://www.speedscope.app reads it; so does any tool that reads speedscope
  files).
- `POST /debug/trace?seconds=N` records the torch profiler's trace of every thread of the process that runs the
  engine (the operators each batch ran, with shapes; on a GPU also the kernels and copies) and answers it as Chrome
  trace JSON, gzipped (https://ui.perfetto.dev and chrome://tracing read it). In the multi-process layout a worker
  relays it to the engine process, where the engine runs.

The sampler is py-spy (a dependency): it reads the interpreter's stacks from outside, without pausing the process
(`--nonblocking`), at 100 samples a second, so a profile costs the server little and shows every thread, the event
loop's and the engine's alike; in the multi-process layout it follows the supervisor's children, so one profile
holds the engine process and every HTTP worker. Linux lets a process read another's memory only if it is allowed to
trace it; a child may not trace its parent where Yama's ptrace_scope is 1 (Ubuntu's default), so with --profiling
each glassbox process says, once at start, that any process of the same user may (PR_SET_PTRACER_ANY). A container
needs the ptrace system call allowed (Docker's default seccomp profile allows it on kernels from 4.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import gzip
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from glassbox.service.errors import ConfigurationError
from glassbox.service.http.auth import BearerKey, read_token
from glassbox.service.settings import Settings

log = logging.getLogger("glassbox")

TOKEN_ENV = "GLASSBOX_PROFILE_TOKEN"
PATH = "/debug/profile"
MAX_SECONDS = 60.0
RATE_HZ = 100
TRACE_PATH = "/debug/trace"
MAX_TRACE_SECONDS = 10.0
# How long the workers are told the engine process may be silent while a trace is written, beyond its window: stopping
# the profiler and writing the trace hold the interpreter, ~3 s for each second of a busy CPU engine on 2 cores.
TRACE_QUIET_S = 20.0
TRACE_QUIET_PER_S = 6.0
MAX_TRACE_BYTES = 128 * 1024 * 1024  # gzipped; the engine process relays it to a worker in one frame
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = -1


def load_profile_token(settings: Settings, environ: Mapping[str, str]) -> str:
    """The profile API's token, from GLASSBOX_PROFILE_TOKEN or --profile-token-file (not both); ConfigurationError
    naming what is missing or wrong."""
    token = read_token("profile token", TOKEN_ENV, "--profile-token-file", settings.profile_token_file, environ)
    if not token:
        raise ConfigurationError(f"--profiling needs a bearer token for the profile API: set {TOKEN_ENV} or pass "
                                 "--profile-token-file PATH")
    if len(token) < 16:
        raise ConfigurationError("the profile token must be at least 16 characters: use a long random one")
    return token


def allow_tracing() -> None:
    """Let a process of this user trace this one (py-spy started by a sibling or a child), where Yama restricts it.
    Does nothing where there is no Yama (the call then fails harmlessly)."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: not a Linux libc
        log.debug("prctl(PR_SET_PTRACER) is not available")


class Profiler:
    """The route and its one-at-a-time rule: a second request while a profile runs answers 409, whichever worker
    process takes it (a lock file of the process tree's root, held with flock)."""

    def __init__(self, token: str, root_pid: int) -> None:
        self._key = BearerKey(token)
        self._root_pid = root_pid
        self._lock_path = Path(tempfile.gettempdir()) / f"glassbox-profile-{root_pid}.lock"

    @property
    def routes(self) -> list[Route]:
        return [Route(PATH, self.profile, methods=["POST"])]

    async def profile(self, request: Request) -> Response:
        seconds = asked_seconds(self._key, request, 10.0, MAX_SECONDS)
        if isinstance(seconds, Response):
            return seconds
        binary = shutil.which("py-spy") or _beside_python("py-spy")
        if binary is None:
            return _error(501, "profiler_missing", "py-spy is not installed where the server runs (pip install "
                                                   "py-spy)")
        with contextlib.ExitStack() as held:
            try:
                handle = held.enter_context(self._lock_path.open("a"))
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes
            except BlockingIOError:
                return _error(409, "profile_running", "a profile is already being recorded; wait for it")
            except OSError as exc:
                return _error(503, "profile_failed", f"cannot take the profile lock {self._lock_path}: {exc}")
            return await self._record(binary, seconds)

    async def _record(self, binary: str, seconds: float) -> Response:
        with tempfile.TemporaryDirectory(prefix="glassbox-profile-") as folder:
            out = Path(folder) / "profile.speedscope.json"
            process = await asyncio.create_subprocess_exec(
                binary, "record", "--pid", str(self._root_pid), "--subprocesses", "--threads", "--nonblocking",
                "--rate", str(RATE_HZ), "--duration", f"{max(1, round(seconds))}", "--format", "speedscope",
                "--output", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, stderr = await process.communicate()
            if process.returncode != 0 or not out.is_file():
                reason = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                log.warning("py-spy failed (exit %s): %s", process.returncode, reason[0])
                return _error(503, "profile_failed", f"py-spy could not profile the server: {reason[0][:300]}")
            body = out.read_bytes()
        return Response(body, 200, media_type="application/json",
                        headers={"Content-Disposition": 'attachment; filename="glassbox.speedscope.json"'})


class TraceUnsupported(Exception):
    """This torch cannot record every thread's operators (its profiler lacks profile_all_threads)."""


class EngineTracer:
    """The torch profiler trace route of the process that runs the engine. One trace at a time per process (the
    torch profiler is process-wide): a second request while one runs answers 409."""

    def __init__(self, token: str, cuda: bool) -> None:
        self._key = BearerKey(token)
        self._cuda = cuda
        self._running = threading.Lock()
        # Set in the engine process: tells the workers how long it may be silent (0: as usual again).
        self.announce_quiet: Callable[[float], None] | None = None

    @property
    def routes(self) -> list[Route]:
        return [Route(TRACE_PATH, self.trace, methods=["POST"])]

    async def trace(self, request: Request) -> Response:
        seconds = asked_seconds(self._key, request, 5.0, MAX_TRACE_SECONDS)
        if isinstance(seconds, Response):
            return seconds
        if not self._running.acquire(blocking=False):
            return _error(409, "trace_running", "a trace is already being recorded; wait for it")
        try:
            # Its own thread, not the loop's default executor: the sleep holds it for the whole window.
            with ThreadPoolExecutor(1, thread_name_prefix="glassbox-trace") as pool:
                body = await asyncio.get_running_loop().run_in_executor(pool, record_trace, seconds, self._cuda,
                                                                        self.announce_quiet)
        except TraceUnsupported as exc:
            return _error(501, "trace_unsupported", str(exc))
        except Exception as exc:  # the profiler failed; the server goes on
            log.warning("the torch profiler trace failed: %s", exc)
            return _error(503, "profile_failed", f"the torch profiler could not record a trace: {exc}"[:400])
        finally:
            self._running.release()
            if self.announce_quiet is not None:
                self.announce_quiet(0.0)
        if len(body) > MAX_TRACE_BYTES:
            return _error(503, "profile_failed", f"the trace is {len(body) >> 20} MiB gzipped, over the "
                                                 f"{MAX_TRACE_BYTES >> 20} MiB limit: ask for fewer seconds")
        return Response(body, 200, media_type="application/gzip",
                        headers={"Content-Disposition": 'attachment; filename="glassbox-engine.trace.json.gz"'})


def record_trace(seconds: float, cuda: bool, announce_quiet: Callable[[float], None] | None = None) -> bytes:
    """The torch profiler's Chrome trace of every thread of this process for `seconds`, gzipped. Blocks. Stopping the
    profiler and writing its trace hold the interpreter for seconds: `announce_quiet` (the engine process's) tells the
    workers first, so that they do not take the silence for a hang."""
    import torch.profiler
    from torch._C._profiler import _ExperimentalConfig

    try:
        config = _ExperimentalConfig(profile_all_threads=True, trace_only=True)  # no event objects: export only
    except TypeError:
        try:
            config = _ExperimentalConfig(profile_all_threads=True)
        except TypeError:
            raise TraceUnsupported(f"torch {torch.__version__} cannot trace threads it did not start the profiler "
                                   "on (no profile_all_threads)") from None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory(prefix="glassbox-trace-") as folder:
        out = Path(folder) / "trace.json"
        prof = torch.profiler.profile(activities=activities, record_shapes=True, experimental_config=config)
        with prof:
            time.sleep(seconds)
            if announce_quiet is not None:
                announce_quiet(TRACE_QUIET_S + TRACE_QUIET_PER_S * seconds)
                time.sleep(0.05)  # the loop sends the word before the profiler stops
        prof.export_chrome_trace(str(out))
        data = out.read_bytes()
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    return gzip.compress(named_threads(data, names), compresslevel=6)  # zlib works without the interpreter lock


_THREAD_NAME = re.compile(rb'"name": "thread (\d+) \([^"]*\)"')


def named_threads(trace: bytes, names: Mapping[int | None, str]) -> bytes:
    """Give the trace's threads their Python names (glassbox-engine-0, MainThread) where the profiler wrote only
    "thread N (process)". On the bytes, not a parsed document: parsing a trace of a few hundred MB would hold the
    interpreter for many seconds."""
    def rename(found: re.Match[bytes]) -> bytes:
        name = names.get(int(found.group(1)))
        return found.group(0) if name is None else b'"name": ' + json.dumps(name).encode()

    return _THREAD_NAME.sub(rename, trace)


def tracer_for(settings: Settings, environ: Mapping[str, str], device: str) -> EngineTracer | None:
    """The engine's trace route when --profiling is on (the token read now), else None."""
    if not settings.profiling:
        return None
    return EngineTracer(load_profile_token(settings, environ), cuda=device.startswith("cuda"))


def profiler_for(settings: Settings, environ: Mapping[str, str], root_pid: int | None = None) -> Profiler | None:
    """The profile API when --profiling is on (its token read now: a missing one fails the start), else None."""
    if not settings.profiling:
        return None
    allow_tracing()
    return Profiler(load_profile_token(settings, environ), root_pid if root_pid is not None else os.getpid())


def asked_seconds(key: BearerKey, request: Request, default: float, most: float) -> float | Response:
    """The window a profile request asks for (`?seconds=`), or the refusal to answer: 401 without the profile token,
    400 for a window that is not from 0.5 to `most` seconds."""
    if not key.allows(request.headers.get("authorization")):
        return _error(401, "unauthorized", "the profile API needs 'Authorization: Bearer <profile token>'",
                      {"WWW-Authenticate": "Bearer"})
    try:
        seconds = float(request.query_params.get("seconds", default))
    except ValueError:
        seconds = float("nan")
    if not 0.5 <= seconds <= most:
        return _error(400, "invalid_parameter", f"seconds must be from 0.5 to {most:g}")
    return seconds


def _beside_python(name: str) -> str | None:
    path = Path(sys.executable).parent / name
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=dict(headers or {}))
