"""The engine as an HTTP worker process sees it: the link to the engine process, the engine's state mirrored into
the worker's Lifecycle, and the chaos control routes relayed to the engine (where the faults act)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from glassbox.service.batching import DROP_REASONS, REJECT_REASONS
from glassbox.service.frontend import EngineInfo, Frontend, build_frontend
from glassbox.service.http.profile import TRACE_PATH
from glassbox.service.ipc.link import ENGINE_SILENT_S, EngineLink
from glassbox.service.ipc.messages import State
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.serving.roster import read_roster
from glassbox.service.settings import Settings
from glassbox.service.types import WarmupReport

if TYPE_CHECKING:
    from glassbox.telemetry import Telemetry

log = logging.getLogger("glassbox.worker")

LIVE_POLL_S = 0.5
FIRST_STATE_WAIT_S = 5.0  # the longest a starting worker waits for the engine's state before it accepts
# Answers relayed from the engine keep their own headers, except those that describe the engine's connection.
_HOP_HEADERS = frozenset({"content-length", "connection", "transfer-encoding"})


class RemoteEngineSide:
    """The engine side (serving/engine_side.EngineSide) of an HTTP worker process: its frontend sends requests to the
    engine process over the engine link. `live` says whether the supervisor still restarts the engine (False once its
    restart budget is spent)."""

    def __init__(self, settings: Settings, frontend: Frontend, link: EngineLink,
                 live: Callable[[], bool] = lambda: True, roster: Callable[[], dict[str, int]] = dict) -> None:
        self._settings = settings
        self._roster = roster  # the server's processes by role, for the scrape
        self._frontend = frontend
        self.link = link
        self._live = live
        self._lifecycle: Lifecycle | None = None
        self._down_since: float | None = None  # when the engine was last lost: its restart time sets Retry-After
        self._poll: asyncio.Task[None] | None = None
        self._state: State | None = None  # the engine's last word
        self._state_known = asyncio.Event()  # set at the engine's first word

    @classmethod
    def build(cls, settings: Settings, socket_path: str, *, worker: int = 0,
              live: Callable[[], bool] = lambda: True) -> RemoteEngineSide:
        holder: list[RemoteEngineSide] = []
        link = EngineLink(socket_path, worker=worker, on_state=lambda state: holder[0].apply(state))
        remote = cls(settings, build_frontend(settings, link, lambda: holder[0].engine_info()), link, live,
                     functools.partial(read_roster, Path(socket_path).parent))
        holder.append(remote)
        return remote

    def engine_info(self) -> EngineInfo:
        state = self._state
        return EngineInfo(state.device, state.engine_kind) if state is not None else EngineInfo("", "")

    @property
    def frontend(self) -> Frontend:
        return self._frontend

    @property
    def routes(self) -> list[Route]:
        """The engine's routes, relayed: the chaos control API (--chaos), the engine trace (--profiling)."""
        routes = []
        if self._settings.chaos:
            routes += [Route("/chaos/faults", self.relay, methods=["POST", "GET", "DELETE"]),
                       Route("/chaos/faults/{fault_id}", self.relay, methods=["DELETE"])]
        if self._settings.profiling:
            routes.append(Route(TRACE_PATH, self.relay, methods=["POST"]))
        return routes

    def bind(self, telemetry: Telemetry, routes: list[str], extra_reasons: dict[str, tuple[str, ...]]) -> None:
        # Rejections and drops happen in the engine process; their series are created at 0 here too, harmlessly
        # (the files of all processes are summed).
        # Batch spans are held in the engine process until a request that rode in them is kept: keep_batches asks.
        telemetry.bind_remote(self.link.scrape, routes=routes,
                              reasons={"rejected": REJECT_REASONS, "dropped": DROP_REASONS, **extra_reasons},
                              keep_batches=self.link.keep_batches, processes=self._roster)

    async def start(self, lifecycle: Lifecycle, on_report: Callable[[WarmupReport], None] | None = None) -> None:
        self._lifecycle = lifecycle
        await self.link.start()
        self._poll = asyncio.ensure_future(self._watch_live())
        # uvicorn accepts on the shared socket once this returns. Until the engine's first state arrives this worker
        # would answer 503 not_ready while its siblings serve (a worker that starts late, or replaces one that
        # died): wait for that word, a few milliseconds when the engine is up. Bounded, so that a worker whose
        # engine is away still starts and answers 503 engine_restarting, /livez and /readyz as designed.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_STATE_WAIT_S):
                await self._state_known.wait()

    async def stop(self, drain_timeout_s: float) -> bool:
        """uvicorn has already waited for in-flight HTTP requests; this waits (bounded) for any submit still out."""
        deadline = time.monotonic() + drain_timeout_s
        while self.link.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # a bounded poll: the link has no event for "nothing in flight"
        drained = self.link.in_flight == 0
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
        await self.link.close()
        return drained

    # -- the engine's state, mirrored ------------------------------------------------------------------------------
    def apply(self, state: State | None) -> None:
        lifecycle = self._lifecycle
        if lifecycle is None:
            return
        self._state = state
        if state is not None:
            self._state_known.set()
        if state is None:
            self._down_since = time.monotonic()
            lifecycle.set_engine_down("the engine process is restarting")
            return
        lifecycle.set_live(state.live and self._live(), state.live_reason or "the engine process is not live")
        if state.phase != "ready":
            lifecycle.set_engine_down(f"the engine process is {state.phase}")
            return
        if self._down_since is not None:
            # Tell the next clients of a restart how long this one took, rounded up.
            self.link.restart_retry_after_s = float(max(1, math.ceil(time.monotonic() - self._down_since)))
            self._down_since = None
        lifecycle.mark_ready(state.device)
        lifecycle.set_engine_up()
        if state.degraded_reason:
            lifecycle.set_degraded(state.device, state.degraded_reason)
        else:
            lifecycle.clear_degraded(state.device)

    async def _watch_live(self) -> None:
        """Twice a second: whether the supervisor gave the engine up, and whether the connected engine went silent
        (stopped or hung: no beat for ENGINE_SILENT_S), which makes this worker unready until it speaks again (its
        next State, a beat, applies as usual)."""
        while True:
            await asyncio.sleep(LIVE_POLL_S)
            lifecycle = self._lifecycle
            if lifecycle is None:
                continue
            if not self._live():
                reason = "the engine process kept failing: its restart budget is spent"
                lifecycle.set_live(False, reason)
                lifecycle.set_engine_down(f"{reason}; it will not be restarted")
                self.link.gone_for_good = (f"{reason} and it will not be restarted: this server cannot serve (/livez "
                                           "says dead); its orchestrator should replace it")
            elif (silent_s := self.link.silent_s()) > ENGINE_SILENT_S:
                lifecycle.set_engine_down(f"the engine process has not answered for {silent_s:.0f} s (stopped or "
                                          "hung)")

    # -- the engine's routes, relayed -----------------------------------------------------------------------------
    async def relay(self, request: Request) -> Response:
        body = await request.body()
        answer = await self.link.call(request.method, request.url.path, request.url.query,
                                      list(request.headers.items()), body)
        headers = {name: value for name, value in answer.headers if name.lower() not in _HOP_HEADERS}
        return Response(answer.body, answer.status, headers=headers)
