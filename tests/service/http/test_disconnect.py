"""until_disconnect (service/http/context.py): a client that leaves cancels the work it waits for, whether the guard's
protocol tells the app (the WATCH_DISCONNECT scope extension) or the app has to read `http.disconnect` itself."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request
from uvicorn.config import Config
from uvicorn.server import ServerState

from glassbox.service.http import guarded_protocol
from glassbox.service.http.context import ClientDisconnected, until_disconnect
from glassbox.service.http.guard import WATCH_DISCONNECT
from tests.service.http.conftest import LIMITS
from tests.service.http.test_uvicorn_internals import FakeTransport


def bare_request(receive: Any, extensions: dict[str, Any] | None = None) -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
    if extensions is not None:
        scope["extensions"] = extensions
    return Request(scope, receive)


@pytest.mark.parametrize("by", ["extension", "receive"])
def test_a_client_that_leaves_cancels_the_work(by: str) -> None:
    async def scenario() -> tuple[bool, list[str]]:
        events: list[str] = []
        callbacks: list[Any] = []

        def watch(callback: Any) -> Any:
            callbacks.append(callback)
            return lambda: events.append("unwatched")

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        async def never_receives() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        request = (bare_request(never_receives, {WATCH_DISCONNECT: watch}) if by == "extension"
                   else bare_request(receive))
        work = asyncio.get_running_loop().create_future()
        if by == "extension":
            asyncio.get_running_loop().call_later(0.05, lambda: callbacks[0]())
        with pytest.raises(ClientDisconnected):
            await until_disconnect(request, work)
        return work.cancelled(), events

    cancelled, events = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert cancelled  # what the request waited for is dropped, not left to run for nobody
    assert events == (["unwatched"] if by == "extension" else [])


@pytest.mark.parametrize("by", ["extension", "receive"])
def test_finished_work_returns_its_result_and_stops_watching(by: str) -> None:
    async def scenario() -> tuple[str, list[str], int]:
        events: list[str] = []

        def watch(callback: Any) -> Any:
            return lambda: events.append("unwatched")

        async def never_receives() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        request = bare_request(never_receives, {WATCH_DISCONNECT: watch} if by == "extension" else None)
        result = await until_disconnect(request, asyncio.sleep(0.01, result="answer"))
        await asyncio.sleep(0)
        watchers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.endswith(".watch")]  # type: ignore[union-attr]
        return result, events, len(watchers)

    result, events, tasks_left = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert result == "answer"
    assert events == (["unwatched"] if by == "extension" else [])
    assert tasks_left == 0  # no watcher task outlives the request


def test_the_guard_calls_back_when_the_connection_goes_and_forgets_finished_requests() -> None:
    async def scenario() -> tuple[list[str], int, list[str], object]:
        left: list[str] = []
        seen_after: list[str] = []
        started = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            watch = scope["extensions"][WATCH_DISCONNECT]
            if scope["path"] == "/done":
                unwatch = watch(lambda: left.append("done"))
                unwatch()  # finished before the client left
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
                await send({"type": "http.response.body", "body": b""})
                return
            watch(lambda: left.append("waiting"))
            started.set()
            await asyncio.Event().wait()

        config = Config(app=app, lifespan="off", log_config=None)
        config.load()
        protocol = guarded_protocol(LIMITS, lambda _r: None)(config, ServerState(), {}, asyncio.get_running_loop())
        protocol.connection_made(FakeTransport())  # type: ignore[attr-defined]
        protocol.data_received(b"GET /done HTTP/1.1\r\nHost: t\r\n\r\n")  # type: ignore[attr-defined]
        for _ in range(10):
            await asyncio.sleep(0)
        protocol.data_received(b"GET /waiting HTTP/1.1\r\nHost: t\r\n\r\n")  # type: ignore[attr-defined]
        await started.wait()
        watching = len(protocol._watchers)  # type: ignore[attr-defined]
        protocol.connection_lost(None)  # type: ignore[attr-defined]
        # a late watch on a request whose client already left is told so, not called back
        late = protocol.cycle.scope["extensions"][WATCH_DISCONNECT]  # type: ignore[attr-defined]
        answer = late(lambda: seen_after.append("late"))
        return left, watching, seen_after, answer

    left, watching, seen_after, answer = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert watching == 1  # only the request still waiting: the finished one stopped watching
    assert left == ["waiting"]
    assert seen_after == [] and answer is None


def test_a_client_gone_before_the_work_starts_leaves_no_cancellation_pending() -> None:
    """The work refuses at once (a full queue) for a client that left while its body was tokenized: the request is a
    499, the work never started, and nothing cancels the handler's next await (a pending cancel surfaced there as a
    traceback, and the request was counted as the refusal)."""

    async def scenario() -> tuple[int, bool]:
        async def never_receives() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        started: list[bool] = []

        async def refuses_at_once() -> str:
            started.append(True)
            raise RuntimeError("a full queue")

        request = bare_request(never_receives, {WATCH_DISCONNECT: lambda callback: None})  # the client has left
        with pytest.raises(ClientDisconnected):
            await until_disconnect(request, refuses_at_once())
        await asyncio.sleep(0)  # would raise CancelledError had a cancellation been left pending
        current = asyncio.current_task()
        assert current is not None
        return current.cancelling(), bool(started)

    pending, started = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert pending == 0 and not started
