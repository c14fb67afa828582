"""API keys: `--api-key` / `GLASSBOX_API_KEY` / `--api-key-file`, checked as `Authorization: Bearer KEY` on the routes
they cover, compared in constant time.

There is no ASGI middleware in glassbox (timings travel as records), so the check wraps route endpoints instead: a
request without the key gets 401 `unauthorized` with `WWW-Authenticate: Bearer` before its handler runs. Scope
`inference` (the default) leaves the probes, `/metrics` and the API's description (`/docs`, `/openapi.json`)
open, so orchestrators, Prometheus and a browser need no key; `all` covers them too. The chaos control API and the
profile API keep their own tokens and are never covered.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from glassbox.service.errors import ConfigurationError, UnauthorizedError
from glassbox.service.http.context import error_response, observe_answer, request_id_of
from glassbox.service.http.routes import Endpoint, rewrap
from glassbox.service.observer import Observer
from glassbox.service.settings import ApiKeyScope, Settings

log = logging.getLogger("glassbox")

# Answer without a key under the default scope: liveness, readiness and health probes, and the metrics scrape.
PROBE_PATHS = frozenset({"/livez", "/readyz", "/health", "/ping", "/v2/health/live", "/v2/health/ready",
                         "/v2/models/{name}/ready", "/v2/models/{name}/versions/{version}/ready",
                         "/metrics"})
# The API's description, open under the default scope too: a browser cannot send the key, and the document holds no
# data (what it describes, the inference routes, still need the key).
DOC_PATHS = frozenset({"/docs", "/openapi.json"})
OWN_AUTH_PREFIXES = ("/chaos/", "/debug/")  # the chaos control and profile APIs check their own bearer tokens


def load_api_key(settings: Settings) -> str | None:
    """The key from GLASSBOX_API_KEY / --api-key or from --api-key-file (not both), or None when none is set.
    Raises ConfigurationError, before any socket opens, for an unreadable or empty file or an unusable key."""
    path = settings.api_key_file
    if path and settings.api_key:
        raise ConfigurationError("the API key is given twice (--api-key or GLASSBOX_API_KEY, and --api-key-file); "
                                 "give one")
    key = settings.api_key
    if path:
        try:
            key = Path(path).expanduser().read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--api-key-file {path}: cannot read it ({exc})") from None
        if not key:
            raise ConfigurationError(f"--api-key-file {path} is empty; put the API key in it")
    if not key:
        return None
    if not all("!" <= char <= "~" for char in key):
        raise ConfigurationError("the API key must be printable ASCII without spaces (it travels in a header)")
    return key


def read_token(name: str, variable: str, file_flag: str, path: str, environ: Mapping[str, str]) -> str:
    """A bearer token from its environment variable or from the file `file_flag` names (not both; a file's trailing
    newline is not part of it); "" when neither gives one. ConfigurationError for a token given twice, a file that
    cannot be read or is empty, or a token a header cannot carry. The chaos and profile APIs' tokens are read so."""
    from_env = environ.get(variable, "").rstrip("\r\n")
    if path and from_env:
        raise ConfigurationError(f"the {name} is given twice ({variable} and {file_flag}); give one")
    token = from_env
    if path:
        try:
            token = Path(path).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{file_flag} {path}: cannot read it ({exc})") from None
        if not token:
            raise ConfigurationError(f"{file_flag} {path} is empty; put the {name} in it")
    if not all("!" <= char <= "~" for char in token):
        raise ConfigurationError(f"the {name} must be printable ASCII without spaces (it travels in a header)")
    return token


class BearerKey:
    """Checks `Authorization: Bearer <key>`. SHA-256 digests are compared with hmac.compare_digest, so neither the
    key's content nor its length leaks through timing."""

    def __init__(self, key: str) -> None:
        self._digest = hashlib.sha256(key.encode("ascii")).digest()

    def allows(self, authorization: str | None) -> bool:
        scheme, _, credentials = (authorization or "").partition(" ")
        given = hashlib.sha256(credentials.strip().encode("latin-1")).digest()  # headers arrive as latin-1
        return hmac.compare_digest(given, self._digest) and scheme.lower() == "bearer"

    def guard(self, endpoint: Endpoint, route: str, observer: Observer) -> Endpoint:
        """`endpoint` behind the key. A refusal is observed like any answered request (route, 401, `unauthorized`),
        so a client hammering without the key shows on the dashboards."""

        async def guarded(request: Request) -> Response:
            if self.allows(request.headers.get("authorization")):
                return await endpoint(request)
            start_ns, wall_ns = time.perf_counter_ns(), time.time_ns()
            request_id = request_id_of(request)
            error = UnauthorizedError("this route needs the API key: send 'Authorization: Bearer <key>'")
            response = error_response(error, request_id, request.url.path)
            response.headers["WWW-Authenticate"] = UnauthorizedError.challenge
            return observe_answer(observer, request, response, route=route, code=error.code, start_ns=start_ns,
                                  wall_ns=wall_ns, request_id=request_id, timed=True)

        return guarded


def covered(route: Route, scope: ApiKeyScope) -> bool:
    if route.path.startswith(OWN_AUTH_PREFIXES):
        return False
    if scope == "all":
        return True
    health_root = route.path == "/" and "POST" not in (route.methods or ())  # GET / is TEI's health probe
    return route.path not in PROBE_PATHS and route.path not in DOC_PATHS and not health_root


def protect(routes: Sequence[BaseRoute], key: BearerKey, scope: ApiKeyScope, observer: Observer) -> list[BaseRoute]:
    """The routes, those the scope covers with their endpoints behind the key."""
    def guarded(route: Route) -> Route:
        return rewrap(route, lambda endpoint: key.guard(endpoint, route.path, observer))

    return [guarded(route) if isinstance(route, Route) and covered(route, scope) else route for route in routes]
