"""CORS for browsers, from `--cors-allow-origin` (TEI's flag): a comma-separated list of origins, or `*`.

Without the flag glassbox sends no CORS headers at all, so a browser page on another origin cannot read its answers
(TEI allows any origin by default; here that takes `--cors-allow-origin '*'`). With it, every route's answer to an
allowed `Origin` carries `Access-Control-Allow-Origin` and exposes glassbox's timing headers, and each path answers
the browser's preflight `OPTIONS` with the methods it takes. Preflights need no API key: browsers never send one.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from glassbox.service.errors import GlassboxError
from glassbox.service.http.context import error_response, request_id_of
from glassbox.service.http.routes import Endpoint, methods_of, rewrap

ALLOWED_HEADERS = "authorization, content-type, x-request-id, x-request-timeout-ms, traceparent, tracestate"
EXPOSED_HEADERS = ("x-request-id, x-latency-ms, server-timing, traceresponse, retry-after, "
                   "inference-header-content-length")
PREFLIGHT_MAX_AGE_S = 600


class CorsPolicy:
    def __init__(self, origins: Sequence[str]) -> None:
        self._any = "*" in origins
        self._origins = frozenset(origin.rstrip("/") for origin in origins if origin != "*")

    @classmethod
    def parse(cls, raw: str) -> CorsPolicy | None:
        origins = [part.strip() for part in raw.split(",") if part.strip()]
        return cls(origins) if origins else None

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin`, None when it is not allowed."""
        if not origin:
            return None
        if self._any:
            return "*"
        return origin if origin.rstrip("/") in self._origins else None

    def decorate(self, request: Request, response: Response) -> Response:
        allowed = self.allow_origin(request.headers.get("origin"))
        if allowed is not None:
            response.headers["Access-Control-Allow-Origin"] = allowed
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        if not self._any:
            response.headers["Vary"] = "Origin"  # the answer depends on the Origin header: caches must know
        return response

    def wrap(self, endpoint: Endpoint) -> Endpoint:
        async def with_headers(request: Request) -> Response:
            try:
                response = await endpoint(request)
            except GlassboxError as error:  # answered here, so an error reaches the browser's script too
                response = error_response(error, request_id_of(request), request.url.path)
            return self.decorate(request, response)

        return with_headers

    def preflight(self, methods: list[str]) -> Endpoint:
        async def answer(request: Request) -> Response:
            response = Response(status_code=204)
            if self.allow_origin(request.headers.get("origin")) is not None:
                response.headers["Access-Control-Allow-Methods"] = ", ".join(methods)
                response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
                response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
            return self.decorate(request, response)

        return answer

    def apply(self, routes: Sequence[BaseRoute]) -> list[BaseRoute]:
        """Every route wrapped, plus one OPTIONS route per path that answers preflights."""
        wrapped = [rewrap(route, self.wrap) if isinstance(route, Route) else route for route in routes]
        by_path: dict[str, set[str]] = {}
        for route in routes:
            if isinstance(route, Route):
                by_path.setdefault(route.path, set()).update(methods_of(route))
        preflights: list[BaseRoute] = [Route(path, self.preflight(sorted(methods | {"OPTIONS"})), methods=["OPTIONS"])
                                       for path, methods in by_path.items()]
        return wrapped + preflights
