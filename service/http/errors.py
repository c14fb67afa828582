"""The app's answers to errors raised outside a handler's own try: Starlette's HTTPExceptions (no route, a method
the route lacks) and GlassboxErrors, both as the JSON error body every glassbox error has. Requests no route took
are recorded too, so every request the app answers shows in the telemetry."""

from __future__ import annotations

import logging
import time
from typing import ClassVar

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from glassbox.service.errors import GlassboxError, MethodNotAllowedError, NotFoundError, RequestTimeoutError
from glassbox.service.http.context import disconnected_answer, error_body, error_response, observe_answer, request_id_of
from glassbox.service.observer import UNMATCHED_ROUTE, Observer

log = logging.getLogger("glassbox")


async def http_exception(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    request_id = request_id_of(request)
    path = request.url.path
    shown = path if len(path) <= 200 else path[:200] + "..."  # a made-up path can be as long as the header cap
    if status == 404:
        return error_response(NotFoundError(f"no route for {request.method[:20]} {shown}"), request_id, path)
    if status == 405:
        response = error_response(MethodNotAllowedError(f"{request.method[:20]} is not allowed on {shown}"),
                                  request_id, path)
        allowed = allowed_methods(request)
        if allowed:
            response.headers["Allow"] = allowed  # RFC 9110: a 405 names the methods that are allowed
        return response
    if status == 408:
        return error_response(RequestTimeoutError("the request took too long to arrive"), request_id, path)
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    error = GlassboxError(str(detail))
    error.code = "http_error"
    return JSONResponse(error_body(error, path), status, {"X-Request-Id": request_id})


def allowed_methods(request: Request) -> str:
    """Every method some route of the app answers on the request's path. (Starlette's own 405 names only the first
    matching route's, and several paths here have one route per method.)"""
    methods: set[str] = set()
    for route in getattr(request.scope.get("app"), "routes", ()):
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


class UnmatchedRequests:
    """The app's HTTPException handler: http_exception's answer, recorded under the route `unmatched`. Starlette's
    router raises these for requests no route takes (404, and 405 for a path whose route has other methods), which
    never reach a handler; recorded, every request the app answers shows in the requests counter, and one route
    value for them all keeps the label bounded whatever paths clients make up. The record's duration is the handler's
    own: the router leaves no start time to measure from, and routing takes microseconds."""

    CODES: ClassVar[dict[int, str]] = {404: NotFoundError.code, 405: MethodNotAllowedError.code,
                                       408: RequestTimeoutError.code}

    def __init__(self, observer: Observer) -> None:
        self._observer = observer

    async def __call__(self, request: Request, exc: Exception) -> Response:
        start_ns, wall_ns = time.perf_counter_ns(), time.time_ns()
        response = await http_exception(request, exc)
        code = self.CODES.get(response.status_code, "http_error")
        return self._observed(request, response, UNMATCHED_ROUTE, code, start_ns, wall_ns)

    def _observed(self, request: Request, response: Response, route: str, code: str, start_ns: int,
                  wall_ns: int) -> Response:
        """`response`, with its request recorded (and named by `traceresponse` when it was traced)."""
        return observe_answer(self._observer, request, response, route=route, code=code, start_ns=start_ns,
                              wall_ns=wall_ns, request_id=response.headers.get("x-request-id", ""))


class InternalErrors(UnmatchedRequests):
    """The app's last resort, for an exception no handler expected (a bug): the JSON error body every glassbox error
    has, status 500, code `internal_error`, recorded under its route (or `unmatched`). Starlette logs the traceback
    and re-raises after this answer, so the bug still shows."""

    async def __call__(self, request: Request, exc: Exception) -> Response:
        start_ns, wall_ns = time.perf_counter_ns(), time.time_ns()
        request_id = request_id_of(request)
        if isinstance(exc, ClientDisconnect):  # a client that left while its body was read: no bug, nobody to answer
            status, code = disconnected_answer(request)  # or the guard cut it, and its answer is what the client got
            response = Response(status_code=status, headers={"X-Request-Id": request_id})
        else:
            error = GlassboxError(f"the server failed on this request ({type(exc).__name__}); it is logged")
            code = error.code
            response = error_response(error, request_id, request.url.path)
        route = getattr(request.scope.get("route"), "path", UNMATCHED_ROUTE)
        return self._observed(request, response, route, code, start_ns, wall_ns)


async def glassbox_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GlassboxError)
    return error_response(exc, request_id_of(request), request.url.path)
