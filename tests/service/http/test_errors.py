"""The app's last-resort handler: an exception no handler expected still gets the JSON error body and is counted."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from service.http.errors import InternalErrors
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
