"""The guard's protection against clients that send fast but read slowly: a bounded pipeline per connection and a
send deadline. The pipeline bound under a real slow reader is shown in tests/chaos/test_slowclients.py; here, that
slicing the parser's input loses and reorders nothing, and the send deadline's bookkeeping on a fake loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from glassbox.service.http import GuardLimits, guarded_protocol
from tests.service.http.conftest import GuardServer, tiny_app
from tests.service.http.raw import connect, get, post, read_one


def test_a_deep_pipeline_in_one_write_is_answered_whole_and_in_order(guard_server: GuardServer) -> None:
    # 400 requests in one write: far past the pipeline bound, so most wait unparsed until earlier ones are answered.
    sizes = [(i * 37) % 1500 for i in range(400)]
    wire = b"".join(post("/echo", b"b" * size, close=False) if size % 2 else get(close=False) for size in sizes)

    async def scenario() -> list[bytes]:
        reader, writer = await connect(guard_server.port)
        writer.write(wire)
        bodies = [(await read_one(reader)).body for _ in sizes]
        writer.close()
        return bodies

    bodies = asyncio.run(scenario())
    assert bodies == [str(size).encode() if size % 2 else b"ok" for size in sizes]
    assert guard_server.aborts == []


class FakeTimer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Records call_later instead of running it, so a test fires deadlines by hand."""

    def __init__(self) -> None:
        self.timers: list[FakeTimer] = []

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> FakeTimer:
        timer = FakeTimer(delay, lambda: callback(*args))
        self.timers.append(timer)
        return timer

    def pending(self, delay: float) -> list[FakeTimer]:
        return [t for t in self.timers if t.delay == delay and not t.cancelled]


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def is_closing(self) -> bool:
        return self.closing or self.aborted

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def guarded_connection(limits: GuardLimits, aborts: list[str]) -> tuple[Any, FakeLoop, FakeTransport]:
    config = uvicorn.Config(tiny_app, http="httptools", log_config=None, lifespan="off")
    config.load()
    loop, transport = FakeLoop(), FakeTransport()
    protocol = guarded_protocol(limits, aborts.append)(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=loop,
    )
    protocol.connection_made(transport)
    return protocol, loop, transport


def test_answers_left_undrained_past_the_send_deadline_drop_the_connection() -> None:
    limits, aborts = GuardLimits(send_timeout_s=7.0), []
    protocol, loop, transport = guarded_connection(limits, aborts)
    protocol.pause_writing()  # the transport's buffer went over its high-water mark
    [deadline] = loop.pending(7.0)
    deadline.callback()
    assert transport.aborted and aborts == ["send_timeout"]


def test_a_closed_connection_whose_answers_stay_undrained_is_still_dropped_at_the_send_deadline() -> None:
    # close() (after an error reply, or a `Connection: close` answer) waits for the buffer to drain: a client that
    # never reads would hold it for good.
    limits, aborts = GuardLimits(send_timeout_s=7.0), []
    protocol, loop, transport = guarded_connection(limits, aborts)
    protocol.pause_writing()
    transport.closing = True
    [deadline] = loop.pending(7.0)
    deadline.callback()
    assert transport.aborted and aborts == ["send_timeout"]


def test_a_client_that_drains_in_time_is_not_dropped() -> None:
    limits, aborts = GuardLimits(send_timeout_s=7.0), []
    protocol, loop, transport = guarded_connection(limits, aborts)
    protocol.pause_writing()
    protocol.resume_writing()
    assert loop.pending(7.0) == [] and not transport.aborted and aborts == []
    protocol.pause_writing()  # a later stall starts a fresh deadline
    assert len(loop.pending(7.0)) == 1
