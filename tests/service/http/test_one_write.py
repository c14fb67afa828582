"""An answer's header block and body leave in one write (service/http/one_write.py), through the guard's protocol on
a transport that records every write, and the order of bytes on the wire stays what uvicorn meant."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from glassbox.service.http import guarded_protocol
from glassbox.service.http.one_write import OneWriteAnswers
from tests.service.http.conftest import LIMITS
from tests.service.http.test_uvicorn_internals import FakeTransport

App = Callable[[Any, Any, Any], Awaitable[None]]
HEAD = [(b"content-type", b"text/plain"), (b"content-length", b"5")]


class RecordingTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def serve(app: App, *requests: bytes, transport: RecordingTransport | None = None) -> RecordingTransport:
    """The guard's protocol on a recording transport: `requests` in, the app run until it has nothing left to do."""
    config = Config(app=app, lifespan="off", log_config=None)
    config.load()
    protocol = guarded_protocol(LIMITS, lambda _reason: None)(config, ServerState(), {}, asyncio.get_running_loop())
    transport = transport or RecordingTransport()
    protocol.connection_made(transport)  # type: ignore[attr-defined]
    for raw in requests:
        protocol.data_received(raw)  # type: ignore[attr-defined]
        for _ in range(20):  # the app's task, its flush at the end of the turn, the next pipelined request
            await asyncio.sleep(0)
    # Until the app's tasks have all finished (an event, bounded), then a few turns for the flushes they scheduled.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while [task for task in asyncio.all_tasks() if task is not asyncio.current_task() and not task.done()]:
        assert loop.time() < deadline, "the app never finished"
        await asyncio.sleep(0.005)  # polling the tasks, bounded by the deadline
    for _ in range(20):
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport


async def plain(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": b"hello"})


def test_header_block_and_body_go_out_in_one_write() -> None:
    transport = asyncio.run(serve(plain, b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert len(transport.written) == 1
    assert transport.written[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.written[0].endswith(b"\r\n\r\nhello")


def test_pipelined_answers_keep_their_order_one_write_each() -> None:
    async def echo_path(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": HEAD})
        await send({"type": "http.response.body", "body": scope["path"].encode()[:5].ljust(5, b".")})

    pipelined = b"GET /one HTTP/1.1\r\nHost: t\r\n\r\nGET /two HTTP/1.1\r\nHost: t\r\n\r\n"
    transport = asyncio.run(serve(echo_path, pipelined))
    assert [w[-5:] for w in transport.written] == [b"/one.", b"/two."]
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") for w in transport.written)


def test_a_streamed_body_sends_its_headers_with_the_first_chunk_and_loses_nothing() -> None:
    transport = RecordingTransport()

    async def streamed(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"transfer-encoding", b"chunked")]})
        await asyncio.sleep(0.02)
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.sleep(0.02)
        await send({"type": "http.response.body", "body": b"last", "more_body": False})

    asyncio.run(serve(streamed, b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n", transport=transport))
    assert transport.written[0].startswith(b"HTTP/1.1 200 OK\r\n") and transport.written[0].endswith(b"first\r\n")
    assert b"last" in b"".join(transport.written[1:])


def test_a_head_answer_without_a_body_write_is_flushed_when_it_completes() -> None:
    transport = asyncio.run(serve(plain, b"HEAD /a HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert len(transport.written) == 1 and transport.written[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.written[0].endswith(b"\r\n\r\n")  # no body on a HEAD answer


def test_a_connection_close_answer_is_written_before_the_close() -> None:
    transport = asyncio.run(serve(plain, b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
    assert transport.closed
    assert len(transport.written) == 1 and transport.written[0].endswith(b"hello")
    # HEAD writes no body, and uvicorn closes before the response completes: only the close's flush writes it
    transport = asyncio.run(serve(plain, b"HEAD /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
    assert transport.closed
    assert len(transport.written) == 1 and transport.written[0].startswith(b"HTTP/1.1 200 OK\r\n")


def test_an_interim_100_continue_is_never_held() -> None:
    transport = RecordingTransport()
    answers = OneWriteAnswers(transport)
    answers.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert transport.written == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # at once: the client waits for it
    answers.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert len(transport.written) == 1  # held for its body
    answers.discard()
    answers.flush()
    assert len(transport.written) == 1  # an aborted connection writes nothing more
    answers.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.closed = True
    answers.flush()
    assert len(transport.written) == 1  # a transport already closing gets nothing
