"""What the app records for a request the protocol guard cut short: the answer the client got from the guard, not a
client disconnect that never happened."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from glassbox.service.app import create_app
from tests.service.apptools import (
    BOUND_S,
    FakeEngine,
    RecordingObserver,
    app_settings,
    live_server,
    wait_ready,
    wait_until,
)

GUARD_S = 0.3


def test_a_body_cut_at_its_deadline_is_recorded_as_the_408_the_client_got(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir, body_timeout_s=GUARD_S)
    observer = RecordingObserver()
    aborts: list[str] = []
    with live_server(create_app(settings, engine=FakeEngine(), observer=observer), settings,
                     on_abort=aborts.append) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        body = b'{"text": "a body that never ends"}'
        with socket.create_connection(("127.0.0.1", live.port), timeout=BOUND_S) as sock:
            sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"X-Request-Id: trickle\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        wait_until(lambda: any(r.request_id == "trickle" for r in observer.requests), "the request was recorded")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert aborts == ["body_timeout"]
    [record] = [r for r in observer.requests if r.request_id == "trickle"]
    assert (record.route, record.status, record.error_code) == ("/v1/classify", 408, "request_timeout")
