"""The Starlette app and its lifespan: the composition root of the request path.

Routes only decode, call the shared pipeline, and encode; errors map to statuses through glassbox.service.errors. Where
the engine runs is the engine side's business (`EngineSide`, service/serving/engine_side.py): in this process
(service/serving/local.py, the one-process layout and tests) or in the engine process, reached over a Unix socket
(service/serving/remote.py, in each HTTP worker process). The routes, the handlers and the lifespan are the same for
both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import (
    GlassboxError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
    UnsupportedMediaTypeError,
)
from glassbox.service.frontend import Frontend
from glassbox.service.http.access import Access
from glassbox.service.http.api_docs import ApiDocs
from glassbox.service.http.context import (
    FRAMES_CONTENT_TYPE,
    ClientDisconnected,
    deadline_of,
    disconnected_answer,
    error_response,
    http_info,
    latency_ms,
    request_id_of,
    server_timing,
    until_disconnect,
)
from glassbox.service.http.encoding import decoded_body
from glassbox.service.http.errors import InternalErrors, UnmatchedRequests, glassbox_exception
from glassbox.service.http.guard import ABORT_REASONS
from glassbox.service.http.pacing import RefusalPacer
from glassbox.service.http.profile import profiler_for
from glassbox.service.http.tei_routes import TeiRoutes
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.observer import NullObserver, Observer, RequestRecord, SpanOpener, TurnBuffered
from glassbox.service.pipeline import Classified, ClassifyPipeline, StageClock, work_done
from glassbox.service.serving.engine_side import EngineSide, running
from glassbox.service.settings import Settings
from glassbox.service.wire import frames, json_api, kserve, openapi, tei
from glassbox.service.wire.common import parse_query_options

if TYPE_CHECKING:  # the composition root may know telemetry; importing only for types keeps start-up light
    from glassbox.service.engines.base import Engine
    from glassbox.service.runtime import Runtime
    from glassbox.telemetry import Telemetry

log = logging.getLogger("glassbox")

V2_VERSION = "/v2/models/{name}/versions/{version}"  # KServe v2's versioned model routes, under this prefix
Decode = Callable[[Request, bytes], ClassifyRequest]
Encode = Callable[[Classified], tuple[bytes, str, dict[str, str]]]


class Handlers:
    """Route handlers bound to one Frontend. Per-request state lives in locals, never on self."""

    def __init__(self, frontend: Frontend, lifecycle: Lifecycle, observer: Observer) -> None:
        self.frontend = frontend
        self.lifecycle = lifecycle
        self.observer = observer
        self.pipeline = ClassifyPipeline(frontend)
        self.settings = frontend.settings
        per_answer = self.settings.refusals_per_answer
        self._pacer = RefusalPacer(per_answer) if per_answer > 0 else None  # see glassbox.service.http.pacing
        # Tracing names each request's server span when it starts, so the batches it rides in can link to it, and
        # once the request has its outcome says what the traceresponse header is.
        opener = observer if isinstance(observer, SpanOpener) else None
        self._open_span = opener.open_request if opener is not None else None
        self._trace_response = opener.trace_response if opener is not None else None
        self._unobserved: list[RequestRecord] = []  # answered in this turn of the event loop, not yet observed
        self._buffered = observer.buffered if isinstance(observer, TurnBuffered) else contextlib.nullcontext

    async def classify(self, request: Request, route: str, decode: Decode, encode: Encode) -> Response:
        start_ns = time.perf_counter_ns()
        wall_ns = time.time_ns()
        request_id = request_id_of(request)
        clock = StageClock(start_ns)
        status, code, classified = 200, None, None
        headers = request.headers
        traceparent = headers.get("traceparent")
        tracestate = headers.get("tracestate") if traceparent is not None else None  # meaningless without a parent
        span = None
        deadline_ns = 0
        if self._open_span is not None:
            try:
                span = self._open_span(traceparent, tracestate)
            except Exception:  # telemetry must never turn a request into a 500
                log.exception("observer open_request failed")
        try:
            state = self.lifecycle.readiness()
            # While draining, requests that already reached us are served: /readyz tells balancers to stop sending.
            if state.phase in ("loading", "stopped"):
                raise NotReadyError(state.reason or "not ready")
            deadline_ns = deadline_of(request, self.settings.request_timeout_ms, start_ns)
            # Parse covers reading what is left of the body (the protocol guard bounds how long that may take)
            # and decoding it, so that the stages of a request add up to its total.
            body = await request.body()
            # Refused now if any request would be: an overloaded host then spends no decoding or tokenizing on it.
            self.frontend.batcher.check_admission(deadline_ns)
            body = decoded_body(headers.get("content-encoding"), body, self.settings.max_body_bytes)
            parsed = decode(request, body)
            clock.lap("parse")
            classified = await self.pipeline(
                parsed, clock, deadline_ns, request_id, lambda w: until_disconnect(request, w), span
            )
            payload, media_type, extra = encode(classified)
            response: Response = Response(payload, 200, media_type=media_type, headers=extra)
            clock.lap("postprocess")
            if self._pacer is not None:
                self._pacer.answered()
        except (ClientDisconnected, ClientDisconnect):
            status, code = disconnected_answer(request)  # the guard's 408/413 when it cut the request, else 499
            response = Response(b"", status)
        except GlassboxError as error:
            if self._pacer is not None and error.code == OverloadedError.code:
                hold_s = self._pacer.hold_s((deadline_ns - time.perf_counter_ns()) / 1e9)
                if hold_s > 0.0:
                    await asyncio.sleep(hold_s)
            response = error_response(error, request_id, request.url.path)
            status, code = response.status_code, error.code
        # A served request ends where its last stage did, so its stages add up to its total exactly.
        end_ns = clock.mark_ns if classified is not None and status == 200 else time.perf_counter_ns()
        record = RequestRecord(
            request_id=request_id, route=route, method=request.method, status=status, error_code=code,
            start_ns=start_ns, end_ns=end_ns, stages=tuple(clock.spans), traceparent=traceparent,
            wall_start_ns=wall_ns, span=span, tracestate=tracestate,
            http=http_info(request) if span is not None else None,
            **work_done(classified, self.settings.record_text),
        )
        response.headers["X-Request-Id"] = request_id
        response.headers["X-Latency-ms"] = latency_ms(record)
        if record.stages:
            response.headers["Server-Timing"] = server_timing(record)
        if span is not None and self._trace_response is not None:
            try:
                value = self._trace_response(record)
                if value:
                    response.headers["traceresponse"] = value
            except Exception:  # telemetry must never turn a served request into a 500
                log.exception("observer trace_response failed")
        # Observed once the answer is out (Starlette runs a response's background task after sending it, before the
        # request's task ends, so a drain still waits for it): see _observe.
        response.background = BackgroundTask(self._observe, record)
        return response

    async def _observe(self, record: RequestRecord) -> None:
        """Hand `record` to the observers after its answer has gone out, together with the others answered in the
        same turn of the event loop (a finished batch wakes all its requests in one turn): the first of them yields
        once, so that the rest send their answers first, then observes them all, one after another. Between two
        requests' answers the engine's forward passes evict the observers' code and data from the caches; run back
        to back, they pay that once per turn instead of once per request. The wait added is one turn of the loop,
        and none to the answer."""
        unobserved = self._unobserved
        unobserved.append(record)
        if len(unobserved) > 1:
            return  # the first of this turn observes it
        try:
            await asyncio.sleep(0)
        finally:  # cancelled or not, nothing recorded is lost
            self._unobserved = []
            on_request = self.observer.on_request
            try:
                with self._buffered():  # the turn's log lines leave in one write, after the last record
                    for each in unobserved:
                        try:
                            on_request(each)
                        except Exception:  # telemetry must never fail a request, nor stop the others' records
                            log.exception("observer on_request failed")
            except Exception:
                log.exception("observer buffered write failed")

    # --- /v1/classify: JSON or binary frames, by content type -------------------------------------------------------
    async def v1_classify(self, request: Request) -> Response:
        media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        limit = self.settings.max_texts_per_request
        name = self.frontend.model_name
        problem = self.frontend.problem_type
        if media in (FRAMES_CONTENT_TYPE, frames.PAIR_CONTENT_TYPE):
            return await self.classify(
                request, "/v1/classify",
                lambda r, body: frames.decode(body, max_texts=limit, options=parse_query_options(r.query_params),
                                              pairs=media == frames.PAIR_CONTENT_TYPE, problem=problem),
                lambda c: (frames.encode_response(c.result, c.request, name), "application/json", {}),
            )
        if media in ("application/json", ""):
            return await self.classify(
                request, "/v1/classify",
                lambda r, body: json_api.decode(body, max_texts=limit, options=parse_query_options(r.query_params),
                                                problem=problem),
                lambda c: (json_api.encode(c.result, c.request, name), "application/json", {}),
            )

        def unsupported(_r: Request, _body: bytes) -> ClassifyRequest:
            # Refused as a decode error, so the request is timed, counted and observed like any other 4xx.
            raise UnsupportedMediaTypeError(
                f"Content-Type {media[:80]!r} is not supported here; use application/json, {FRAMES_CONTENT_TYPE} "
                f"or {frames.PAIR_CONTENT_TYPE}"
            )

        return await self.classify(request, "/v1/classify", unsupported, lambda c: (b"", "", {}))

    async def tei_predict(self, request: Request) -> Response:
        limit = self.settings.max_texts_per_request
        return await self.classify(
            request, "/predict",
            lambda _r, body: tei.decode(body, max_texts=limit),
            lambda c: (tei.encode(c.result, c.request), "application/json", {}),
        )

    async def v2_infer(self, request: Request) -> Response:
        limit = self.settings.max_texts_per_request
        asked: dict[str, Any] = {}

        def decode(req: Request, body: bytes) -> ClassifyRequest:
            self._check_model_name(req)  # here, not before: an unknown model is a request the observer sees
            parsed, outputs = kserve.decode_infer(body, req.headers.get(kserve.HEADER_LENGTH), max_texts=limit,
                                                  problem=self.frontend.problem_type)
            asked["outputs"] = outputs
            return parsed

        def encode(c: Classified) -> tuple[bytes, str, dict[str, str]]:
            body, headers = kserve.encode_infer(c.result, c.request, asked["outputs"], self.frontend.model_name)
            media = "application/octet-stream" if kserve.HEADER_LENGTH in headers else "application/json"
            return body, media, headers

        route = V2_VERSION + "/infer" if "version" in request.path_params else "/v2/models/{name}/infer"
        return await self.classify(request, route, decode, encode)

    # --- health and metadata ------------------------------------------------------------------------------------
    async def livez(self, request: Request) -> Response:
        live, reason = self.lifecycle.live
        return JSONResponse({"status": "live" if live else "dead", "reason": reason}, 200 if live else 503)

    async def readyz(self, request: Request) -> Response:
        state = self.lifecycle.readiness()
        if state.ready and state.degraded:
            status = 200 if self.settings.ready_when_degraded == "200" else 503
            body = {"status": "degraded", "device": state.device, "reason": state.reason}
            return JSONResponse(body, status)
        body = {"status": "ready" if state.ready else state.phase, "device": state.device, "reason": state.reason}
        return JSONResponse(body, 200 if state.ready else 503)

    async def v2_live(self, request: Request) -> Response:
        live = self.lifecycle.live[0]
        return JSONResponse(kserve.live_status(live), 200 if live else 503)

    async def v2_ready(self, request: Request) -> Response:
        ready = self.lifecycle.readiness().ready
        return JSONResponse(kserve.ready_status(ready), 200 if ready else 503)

    async def v2_server(self, request: Request) -> Response:
        return JSONResponse(kserve.server_metadata())

    async def v2_model(self, request: Request) -> Response:
        self._check_model_name(request)
        frontend = self.frontend
        return JSONResponse(kserve.model_metadata(frontend.model_name, frontend.labels, frontend.problem_type,
                                                  frontend.tokenizer.pairs))

    async def v2_model_ready(self, request: Request) -> Response:
        self._check_model_name(request)
        ready = self.lifecycle.readiness().ready
        return JSONResponse(kserve.model_ready_status(self.frontend.model_name, ready), 200 if ready else 503)

    async def openapi(self, request: Request) -> Response:
        frontend = self.frontend
        return JSONResponse(openapi.build_document(
            frontend.model_name, self.settings.max_texts_per_request, problem=frontend.problem_type,
            reranker=len(frontend.labels) == 1, vocab_size=frontend.tokenizer.vocab_size,
        ))

    def _check_model_name(self, request: Request) -> None:
        """The model (and, on the versioned routes, its version) a /v2 route names must be the one served here."""
        name = request.path_params.get("name")
        if name != self.frontend.model_name:
            raise NotFoundError(f"model {str(name)[:80]!r} is not served here; this server serves "
                                f"{self.frontend.model_name!r}")
        version = request.path_params.get("version")
        if version is not None and version != kserve.MODEL_VERSION:
            raise NotFoundError(f"model {name!r} has no version {version[:40]!r}; its one version is "
                                f"{kserve.MODEL_VERSION!r}")


def create_app(
    settings: Settings,
    *,
    runtime: Runtime | None = None,
    engine: Engine | None = None,
    observer: Observer | None = None,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The one-process app: the engine runs in this process. Loading and checking the model happens here (a bad model
    fails before any socket opens); warm-up runs in the lifespan, in a worker thread, while /readyz says "loading".

    `telemetry` (glassbox.telemetry.setup.build_telemetry) adds /metrics, observes every record next to `observer`, and
    starts and stops with the app; without it the app runs with `observer` alone (default: the NullObserver).
    A `runtime` passed in keeps the observer its batcher was built with.

    With settings.chaos the chaos control API is mounted and the primary engine (or the injected `engine`) runs
    inside the chaos engine; the token is read first, so a missing one fails before the model loads."""
    if telemetry is not None:
        observer = telemetry.compose(observer)
    # The engine (and torch) only where it runs: an HTTP worker of the multi-process layout uses assemble_app alone.
    from glassbox.service.serving.local import LocalEngineSide

    observer = observer or NullObserver()
    access = Access.from_settings(settings)  # the API key is read first: a bad key file fails before the model loads
    side = LocalEngineSide.build(settings, runtime=runtime, engine=engine, observer=observer)
    app = assemble_app(settings, side, observer, telemetry, access)
    app.state.runtime = side.runtime
    app.state.batcher = side.runtime.batcher
    app.state.chaos = side.chaos
    return app


def assemble_app(settings: Settings, side: EngineSide, observer: Observer, telemetry: Telemetry | None,
                 access: Access | None = None, profile_root: int | None = None) -> Starlette:
    """Routes, handlers and the lifespan around an engine side; `observer` is already composed with telemetry's.
    `access` (the API key and CORS) wraps the routes; built from `settings` when not given. `profile_root`: the
    process whose tree the profile API records (default: this one; a worker passes the supervisor)."""
    access = access or Access.from_settings(settings)
    lifecycle = Lifecycle()
    handlers = Handlers(side.frontend, lifecycle, observer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with running(side, lifecycle, telemetry, settings.drain_timeout_s) as drained:
            yield
        log.info("stopped", extra={"drained": drained[0]})

    routes = [
        Route("/v1/classify", handlers.v1_classify, methods=["POST"]),
        Route("/predict", handlers.tei_predict, methods=["POST"]),
        Route("/v2", handlers.v2_server, methods=["GET"]),
        Route("/v2/health/live", handlers.v2_live, methods=["GET"]),
        Route("/v2/health/ready", handlers.v2_ready, methods=["GET"]),
        Route("/v2/models/{name}", handlers.v2_model, methods=["GET"]),
        Route("/v2/models/{name}/ready", handlers.v2_model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", handlers.v2_infer, methods=["POST"]),
        Route(V2_VERSION, handlers.v2_model, methods=["GET"]),
        Route(V2_VERSION + "/ready", handlers.v2_model_ready, methods=["GET"]),
        Route(V2_VERSION + "/infer", handlers.v2_infer, methods=["POST"]),
        Route("/livez", handlers.livez, methods=["GET"]),
        Route("/readyz", handlers.readyz, methods=["GET"]),
        Route("/openapi.json", handlers.openapi, methods=["GET"]),
        Route("/docs", ApiDocs().serve, methods=["GET"]),
        *TeiRoutes(handlers).routes(),
    ]
    if telemetry is not None:
        # /metrics is a route too: a scrape refused for want of the API key counts under it, not as "unmatched".
        declared = [route.path for route in (*routes, *telemetry.routes)]
        side.bind(telemetry, declared, {"aborted": ABORT_REASONS})
        config = side.frontend.config
        telemetry.describe_model(side.frontend.model_name, {"family": config.family, "model_type": config.model_type,
                                                            "problem_type": config.problem_type})
        routes.extend(telemetry.routes)
    routes.extend(side.routes)
    profiler = profiler_for(settings, os.environ, profile_root)
    if profiler is not None:
        routes.extend(profiler.routes)
    app = Starlette(
        routes=access.apply(routes, observer),
        lifespan=lifespan,
        exception_handlers={HTTPException: UnmatchedRequests(observer), GlassboxError: glassbox_exception,
                            ClientDisconnect: InternalErrors(observer), Exception: InternalErrors(observer)},
    )
    # No 307 to the path with (or without) a trailing slash: it would be answered before any route's access check,
    # a client that follows it would resend the body to a route it did not name (DELETE /chaos/faults/ would
    # disarm every fault), and no documented route has two spellings. A path no route takes is a 404.
    app.router.redirect_slashes = False
    app.state.lifecycle = lifecycle
    app.state.observer = observer
    return app
