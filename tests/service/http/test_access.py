"""API keys and CORS, unit by unit: where the key comes from, how it is compared, which routes it covers, and the
CORS headers and preflights."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from glassbox.service.errors import ConfigurationError, NotFoundError
from glassbox.service.http.access import Access
from glassbox.service.http.auth import BearerKey, covered, load_api_key
from glassbox.service.http.cors import CorsPolicy
from glassbox.service.observer import NullObserver
from glassbox.service.settings import load_settings


def settings(**values: object):  # type: ignore[no-untyped-def]
    return load_settings({k: v for k, v in values.items()}, environ={})


def test_the_key_comes_from_the_flag_or_the_environment_or_a_file(tmp_path: Path) -> None:
    assert load_api_key(settings()) is None
    assert load_api_key(settings(api_key="k3y-from-flag")) == "k3y-from-flag"
    assert load_api_key(load_settings({}, environ={"GLASSBOX_API_KEY": "from-env"})) == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert load_api_key(settings(api_key_file=str(key_file))) == "from-file"
    key_file.write_text("crlf\r\n")
    assert load_api_key(settings(api_key_file=str(key_file))) == "crlf"


@pytest.mark.parametrize(("values", "words"), [
    ({"api_key": "a", "api_key_file": "/dev/null"}, "given twice"),
    ({"api_key_file": "/no/such/key"}, "cannot read it"),
    ({"api_key_file": "EMPTY"}, "is empty"),
    ({"api_key": "has space"}, "printable ASCII without spaces"),
    ({"api_key": "clé"}, "printable ASCII without spaces"),
])
def test_unusable_keys_stop_the_server_with_one_line(tmp_path: Path, values: dict[str, str], words: str) -> None:
    if values.get("api_key_file") == "EMPTY":
        (tmp_path / "empty").write_text("\n")
        values = {"api_key_file": str(tmp_path / "empty")}
    with pytest.raises(ConfigurationError) as error:
        load_api_key(settings(**values))
    assert words in error.value.message


def test_the_key_never_shows_in_the_settings_repr() -> None:
    assert "s3cret-value" not in repr(settings(api_key="s3cret-value"))


@pytest.mark.parametrize(("header", "allowed"), [
    ("Bearer right-key", True), ("bearer right-key", True), ("Bearer  right-key ", True),
    ("Bearer wrong-key", False), ("Basic right-key", False), ("right-key", False), ("", False), (None, False),
    ("Bearer right-keyX", False), ("Bearer right-ke", False), ("Bearer ríght-key", False),
])
def test_bearer_comparison(header: str | None, allowed: bool) -> None:
    raw = None if header is None else header.encode("utf-8").decode("latin-1")  # as Starlette hands headers over
    assert BearerKey("right-key").allows(raw) is allowed


@pytest.mark.parametrize(("path", "methods", "inference", "everything"), [
    ("/v1/classify", ["POST"], True, True), ("/predict", ["POST"], True, True), ("/", ["POST"], True, True),
    ("/info", ["GET"], True, True), ("/tokenize", ["POST"], True, True),
    ("/openapi.json", ["GET"], False, True), ("/docs", ["GET"], False, True),  # the description: no data
    ("/", ["GET"], False, True), ("/health", ["GET"], False, True), ("/readyz", ["GET"], False, True),
    ("/metrics", ["GET"], False, True), ("/v2/health/live", ["GET"], False, True),
    ("/chaos/faults", ["POST"], False, False),  # its own token
    ("/debug/profile", ["POST"], False, False), ("/debug/trace", ["POST"], False, False),  # the profile token
])
def test_what_each_scope_covers(path: str, methods: list[str], inference: bool, everything: bool) -> None:
    async def endpoint(request: Request) -> Response:
        return Response()

    route = Route(path, endpoint, methods=methods)
    assert (covered(route, "inference"), covered(route, "all")) == (inference, everything)


def app_with(access: Access) -> TestClient:
    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    async def missing(request: Request) -> Response:
        raise NotFoundError("no such thing")

    routes = [Route("/predict", hello, methods=["POST"]), Route("/health", hello, methods=["GET"]),
              Route("/thing", missing, methods=["GET"])]
    return TestClient(Starlette(routes=access.apply(routes, NullObserver())))


def test_the_key_guards_covered_routes_only() -> None:
    client = app_with(Access(BearerKey("k"), "inference", None))
    refused = client.post("/predict")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer" and refused.headers["x-request-id"]
    assert client.post("/predict", headers={"Authorization": "Bearer k"}).text == "hello"
    assert client.get("/health").text == "hello"
    assert app_with(Access(BearerKey("k"), "all", None)).get("/health").status_code == 401


def test_cors_headers_for_allowed_origins_and_preflights() -> None:
    origins = CorsPolicy.parse("https://app.example, http://localhost:3000")
    client = app_with(Access(BearerKey("k"), "inference", origins))
    preflight = client.options("/predict", headers={"Origin": "https://app.example",
                                                     "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204  # no key needed: browsers send none on a preflight
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert preflight.headers["access-control-allow-methods"] == "OPTIONS, POST"
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    refused = client.post("/predict", headers={"Origin": "http://localhost:3000"})
    assert refused.status_code == 401  # the browser can read the 401: it carries the CORS headers
    assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "server-timing" in refused.headers["access-control-expose-headers"]
    error = client.get("/thing", headers={"Origin": "https://app.example", "Authorization": "Bearer k"})
    assert error.status_code == 404 and error.headers["access-control-allow-origin"] == "https://app.example"
    stranger = client.get("/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in stranger.headers and stranger.headers["vary"] == "Origin"
    assert "access-control-allow-methods" not in client.options(
        "/health", headers={"Origin": "https://evil.example"}).headers


def test_any_origin_and_no_cors_at_all() -> None:
    anyone = app_with(Access(None, "inference", CorsPolicy.parse("*")))
    assert anyone.get("/health", headers={"Origin": "https://x.example"}).headers["access-control-allow-origin"] == "*"
    assert CorsPolicy.parse(" , ") is None
    plain = app_with(Access(None, "inference", None))
    assert "access-control-allow-origin" not in plain.get("/health", headers={"Origin": "https://x.example"}).headers
    assert plain.options("/health").status_code == 405
