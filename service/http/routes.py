"""Rebuilding a Starlette route around a wrapped endpoint: how the API key and CORS reach routes without middleware."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Endpoint = Callable[[Request], Awaitable[Response]]


def methods_of(route: Route) -> list[str]:
    """The methods a route was declared with (Starlette adds HEAD to every GET route by itself)."""
    return sorted((route.methods or set()) - {"HEAD"})


def rewrap(route: Route, wrap: Callable[[Endpoint], Endpoint]) -> Route:
    """The same path, methods and name, with `wrap(endpoint)` as the endpoint."""
    return Route(route.path, wrap(route.endpoint), methods=methods_of(route), name=route.name)
