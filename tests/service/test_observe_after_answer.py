"""A request's record reaches the observers after its answer has gone out, together with the others answered in the
same turn of the event loop; none is lost when an observer raises or the request's task is cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from glassbox.service.app import Handlers, create_app
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.observer import RequestRecord
from glassbox.service.settings import Settings
from tests.service.apptools import RecordingObserver, app_settings, ready_client


def record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id=request_id, route="/v1/classify", method="POST", status=200, error_code=None,
                         start_ns=1, end_ns=2)


def handlers(observer: Any) -> Handlers:
    frontend: Any = SimpleNamespace(settings=Settings())  # _observe needs nothing of the frontend
    return Handlers(frontend, Lifecycle(), observer)


def test_records_of_one_loop_turn_are_observed_together_once_every_answer_of_the_turn_is_out() -> None:
    observer = RecordingObserver()
    side = handlers(observer)
    first = [record(f"r{i}") for i in range(4)]
    later = record("later")

    async def scenario() -> None:
        tasks = [asyncio.create_task(side._observe(r)) for r in first]
        await asyncio.sleep(0)  # every task took its first step, as four requests answered in one turn do
        assert observer.requests == []
        await asyncio.gather(*tasks)
        assert observer.requests == first
        await side._observe(later)  # a later turn is a group of its own
        assert observer.requests == [*first, later]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_cancelled_request_task_still_has_its_turns_records_observed() -> None:
    observer = RecordingObserver()
    side = handlers(observer)
    records = [record(f"r{i}") for i in range(3)]

    async def scenario() -> None:
        tasks = [asyncio.create_task(side._observe(r)) for r in records]
        await asyncio.sleep(0)
        tasks[0].cancel()  # the one that yields, waiting to observe them all
        await asyncio.gather(*tasks, return_exceptions=True)
        assert tasks[0].cancelled()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert observer.requests == records


class FailsOnce(RecordingObserver):
    def on_request(self, record: RequestRecord) -> None:
        if record.request_id == "r0":
            raise RuntimeError("telemetry backend is down")
        super().on_request(record)


def test_an_observer_that_raises_on_one_record_still_gets_the_others() -> None:
    observer = FailsOnce()
    side = handlers(observer)
    records = [record(f"r{i}") for i in range(3)]

    async def scenario() -> None:
        await asyncio.gather(*(side._observe(r) for r in records))

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert observer.requests == records[1:]


class SeesAnswers(RecordingObserver):
    """Notes, for each record, whether its answer had been sent when the record arrived."""

    def __init__(self, sent: set[str]) -> None:
        super().__init__()
        self.sent = sent
        self.answered_first: list[bool] = []

    def on_request(self, record: RequestRecord) -> None:
        self.answered_first.append(record.request_id in self.sent)
        super().on_request(record)


def test_through_the_app_a_request_is_observed_after_its_answer_went_out(tiny_model_dir: Path) -> None:
    sent: set[str] = set()
    observer = SeesAnswers(sent)
    app = create_app(app_settings(tiny_model_dir), observer=observer)

    async def watched(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = dict(scope["headers"]).get(b"x-request-id", b"").decode()

        async def watch(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                sent.add(request_id)

        await app(scope, receive, watch)

    with ready_client(watched) as client:  # type: ignore[arg-type]
        ok = client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "ok"})
        bad = client.post("/v1/classify", content=b"{", headers={"Content-Type": "application/json",
                                                                  "X-Request-Id": "bad"})
    assert (ok.status_code, bad.status_code) == (200, 400)
    assert [r.request_id for r in observer.requests] == ["ok", "bad"]
    assert observer.answered_first == [True, True]
