"""The app's last-resort handler: an exception no handler expected still gets the JSON error body and is counted."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from glassbox.service.http.errors import InternalErrors
from tests.service.apptools import RecordingObserver


async def broken(request: Request) -> Response:
    raise RuntimeError("a bug")


def test_an_unexpected_exception_is_a_json_500_recorded_under_its_route() -> None:
    observer = RecordingObserver()
    app = Starlette(routes=[Route("/things/{name}", broken, methods=["POST"])],
                    exception_handlers={Exception: InternalErrors(observer)})
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/things/x", headers={"X-Request-Id": "r-1"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "RuntimeError" in response.json()["error"]["message"]
    [record] = observer.requests
    assert (record.route, record.status, record.error_code, record.method) == ("/things/{name}", 500,
                                                                                "internal_error", "POST")


async def reads_its_body(request: Request) -> Response:
    await request.body()
    return Response("read")


def test_a_client_that_leaves_mid_body_is_counted_as_499_not_a_500() -> None:
    observer = RecordingObserver()
    handler = InternalErrors(observer)
    app = Starlette(routes=[Route("/upload", reads_its_body, methods=["POST"])],
                    exception_handlers={ClientDisconnect: handler, Exception: handler})
    scope = {"type": "http", "method": "POST", "path": "/upload", "raw_path": b"/upload", "query_string": b"",
             "headers": [], "http_version": "1.1", "scheme": "http", "server": ("t", 80), "client": None,
             "root_path": ""}
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    [record] = observer.requests
    assert (record.route, record.status, record.error_code) == ("/upload", 499, "client_disconnected")
