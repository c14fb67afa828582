"""The watch process (glassbox.chaos.watch): looks at a live HTTP target from a process of its own, hands them to the
runner as they come, ends when asked, and says so when it dies; the session records its looks and watches from the
runner's own loop where the process cannot start."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from glassbox.chaos.client import ChaosClient
from glassbox.chaos.metrics_scrape import WANTED_SAMPLES, Observation
from glassbox.chaos.phases import Session
from glassbox.chaos.record import Timeline
from glassbox.chaos.schema import load_experiment
from glassbox.chaos.watch import WatchProcess
from tests.chaos.test_run_experiments import EXPERIMENTS


class _Target(BaseHTTPRequestHandler):
    """/metrics says the fallback is active from the third look on; /readyz follows it."""

    looks: ClassVar[list[tuple[str, dict[str, list[str]]]]] = []

    def do_GET(self) -> None:  # the name BaseHTTPRequestHandler calls
        url = urlsplit(self.path)
        self.looks.append((url.path, parse_qs(url.query)))
        active = sum(1 for path, _ in self.looks if path == "/metrics") >= 3
        if url.path == "/metrics":
            body = (f"# TYPE glassbox_fallback_active gauge\nglassbox_fallback_active {1.0 if active else 0.0}\n"
                    f"# TYPE glassbox_fallback_events counter\n"
                    f'glassbox_fallback_events_total{{reason="oom"}} {1.0 if active else 0.0}\n').encode()
            kind = "text/plain; version=0.0.4"
        else:
            body = b'{"status": "degraded"}' if active else b'{"status": "ready"}'
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    _Target.looks = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _collect(watch: WatchProcess, count: int) -> list[Observation]:
    seen: list[Observation] = []
    async for obs in watch.observations():
        seen.append(obs)
        if len(seen) == count:
            break
    return seen


def test_the_watch_looks_from_its_own_process_and_stops_when_asked(target: str) -> None:
    async def run() -> tuple[list[Observation], int | None, float, float, int]:
        watch = WatchProcess(target, 0.05)
        before = time.monotonic()
        await watch.start()
        assert watch.process is not None
        pid = watch.process.pid
        seen = await asyncio.wait_for(_collect(watch, 4), 30)
        after = time.monotonic()
        await watch.stop()
        return seen, watch.process.returncode, before, after, pid

    seen, code, before, after, pid = asyncio.run(run())
    assert pid != os.getpid() and code == 0
    assert [o.error for o in seen] == [""] * 4
    # Its clock is the runner's: every look lies between the start and the fourth look's arrival, in order.
    times = [o.t_s for o in seen]
    assert before <= times[0] and times == sorted(times) and times[-1] <= after
    assert [o.fallback_active for o in seen] == [False, False, True, True]
    assert [o.ready for o in seen] == ["ready", "ready", "degraded", "degraded"]
    metrics = [query for path, query in _Target.looks if path == "/metrics"]
    assert metrics and all(q.get("name[]") == list(WANTED_SAMPLES) for q in metrics)


def test_a_watch_process_that_dies_says_so(target: str) -> None:
    async def run() -> list[Observation]:
        watch = WatchProcess(target, 0.05)
        await watch.start()
        assert watch.process is not None
        first = await asyncio.wait_for(_collect(watch, 1), 30)
        watch.process.send_signal(signal.SIGKILL)
        rest = [obs async for obs in watch.observations()]
        return first + rest

    seen = asyncio.run(run())
    assert seen[0].error == "" and seen[-1].metrics is None and seen[-1].ready is None
    assert "the watch process exited with -9" in seen[-1].error


def _session(url: str, timeline: Timeline, http: httpx.AsyncClient, chaos: ChaosClient) -> Session:
    return Session(load_experiment(EXPERIMENTS / "oom-fallback.yaml"), url, chaos, http, timeline)


def _watch_for(url: str, seconds: float) -> tuple[Session, Timeline]:
    async def run() -> tuple[Session, Timeline]:
        timeline = Timeline()
        async with httpx.AsyncClient(trust_env=False) as http, ChaosClient(url, None) as chaos:
            session = _session(url, timeline, http, chaos)
            stop = asyncio.Event()
            watching = asyncio.create_task(session.watch(0.05, stop))
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.wait_for(watching, 30)
        return session, timeline

    return asyncio.run(run())


def test_the_session_records_the_processes_looks_and_marks_the_fallback(target: str) -> None:
    session, timeline = _watch_for(target, 2.0)
    assert len(session.observations) >= 3 and all(o.error == "" for o in session.observations)
    assert [e.kind for e in timeline.events].count("fallback_seen") == 1


def test_the_session_looks_from_its_own_loop_when_the_process_cannot_start(
        target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def cannot(self: WatchProcess) -> None:
        raise OSError("no interpreter")

    monkeypatch.setattr(WatchProcess, "start", cannot)
    session, timeline = _watch_for(target, 0.5)
    kinds = [e.kind for e in timeline.events]
    assert kinds[0] == "watch_inline" and "no interpreter" in timeline.events[0].text
    assert len(session.observations) >= 3 and "fallback_seen" in kinds


def test_the_session_goes_on_looking_from_its_own_loop_when_the_process_dies(target: str) -> None:
    async def run() -> tuple[Session, Timeline]:
        timeline = Timeline()
        async with httpx.AsyncClient(trust_env=False) as http, ChaosClient(target, None) as chaos:
            session = _session(target, timeline, http, chaos)
            stop = asyncio.Event()
            started = asyncio.Event()
            real_start = WatchProcess.start

            async def start(self: WatchProcess) -> None:
                await real_start(self)
                started.set()
                assert self.process is not None
                asyncio.get_running_loop().call_later(0.3, self.process.send_signal, signal.SIGKILL)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(WatchProcess, "start", start)
                watching = asyncio.create_task(session.watch(0.05, stop))
                await started.wait()
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.wait_for(watching, 30)
        return session, timeline

    session, timeline = asyncio.run(run())
    died = [i for i, o in enumerate(session.observations) if "the watch process exited with -9" in o.error]
    assert len(died) == 1 and "watch_inline" in [e.kind for e in timeline.events]
    # Looks went on after the process died, from the runner's loop.
    assert len(session.observations) - died[0] - 1 >= 3
    assert all(o.error == "" for o in session.observations[died[0] + 1:])
