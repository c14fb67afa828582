from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import uvicorn

from glassbox.service.http import GuardLimits, guarded_protocol

LIMITS = GuardLimits(header_timeout_s=0.3, body_timeout_s=0.3, max_header_bytes=1024, max_body_bytes=2048,
                     linger_s=1.0)


SEND_ERRORS: list[Exception] = []  # what tiny_app's sends raised
WATCHED_ANSWERED = threading.Event()  # set when a /slow-watched request's handler has sent (or failed to send)


async def tiny_app(scope, receive, send):  # type: ignore[no-untyped-def]
    """`/echo` reads the whole body and answers its length; `/early` answers before reading; `/slow` answers after
    0.2 s, `/slow-watched` too while it waits for a disconnect; anything else: ok."""
    if scope["type"] != "http":
        return
    body = b"ok"
    if scope["path"] == "/slow":
        await asyncio.sleep(0.2)
    watcher = None
    if scope["path"] == "/slow-watched":  # as an app that watches for a disconnect while it works (which reads on)
        await receive()
        watcher = asyncio.ensure_future(receive())
        await asyncio.sleep(0.2)
    if scope["path"] == "/echo":
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        body = str(size).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except Exception as exc:  # an answer sent into a closed connection: the server should have said it was gone
        SEND_ERRORS.append(exc)
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
            WATCHED_ANSWERED.set()


@dataclass
class GuardServer:
    port: int
    aborts: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def _guard_server_module() -> Iterator[GuardServer]:
    # A socket that already listens: clients can connect before the server thread's loop is up (the kernel queues
    # them), so no readiness wait is needed.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    state = GuardServer(port=sock.getsockname()[1])
    config = uvicorn.Config(
        tiny_app, loop="uvloop", http=guarded_protocol(LIMITS, state.aborts.append), ws="none", lifespan="off",
        log_config=None, log_level="warning", access_log=False, timeout_keep_alive=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield state
    server.should_exit = True
    thread.join(10)
    assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture
def guard_server(_guard_server_module: GuardServer) -> GuardServer:
    _guard_server_module.aborts.clear()
    return _guard_server_module
