"""A worker process starts accepting on the shared socket only once it knows the engine's state (or after a bound):
without that, a worker that came up after its siblings answered 503 not_ready for its first requests while they
served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import glassbox.service.serving.remote as remote_module
from glassbox.service.ipc.messages import State, encode
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.serving.remote import RemoteEngineSide
from tests.service.apptools import app_settings

READY = State("ready", "cpu", "", True, "", 1, "eager-fp32")


def test_start_returns_as_soon_as_the_engine_has_said_it_is_ready(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = RemoteEngineSide.build(app_settings(tiny_model_dir), str(tmp_path / "no-engine.sock"))
    lifecycle = Lifecycle()

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, engine.apply, READY)  # the engine's first word, as the link would hand it over
        started = time.monotonic()
        await engine.start(lifecycle)
        waited = time.monotonic() - started
        ready = lifecycle.readiness().phase == "ready"
        await engine.stop(1.0)
        return ready, waited

    ready, waited = asyncio.run(scenario())
    assert ready  # when uvicorn starts accepting, this worker already says ready
    assert 0.15 <= waited < 2.0


def test_start_gives_up_waiting_when_no_engine_answers(tiny_model_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "FIRST_STATE_WAIT_S", 0.3)
    engine = RemoteEngineSide.build(app_settings(tiny_model_dir), str(tmp_path / "no-engine.sock"))
    lifecycle = Lifecycle()

    async def scenario() -> float:
        started = time.monotonic()
        await engine.start(lifecycle)  # the worker still starts: it answers 503 while the engine is away
        waited = time.monotonic() - started
        await engine.stop(1.0)
        return waited

    assert 0.25 <= asyncio.run(scenario()) < 3.0


def test_a_silent_engine_makes_the_worker_unready_until_it_speaks_and_a_given_up_one_says_so(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped or hung engine process keeps its socket open: only its missing beat tells. And once the supervisor
    gave the engine up, answers stop inviting a retry."""
    monkeypatch.setattr(remote_module, "LIVE_POLL_S", 0.05)
    monkeypatch.setattr(remote_module, "ENGINE_SILENT_S", 0.3)
    path = str(tmp_path / "engine.sock")
    live = {"value": True}
    engine = RemoteEngineSide.build(app_settings(tiny_model_dir), path, live=lambda: live["value"])
    lifecycle = Lifecycle()

    writers: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # accepts the worker and says nothing until told to
        await reader.read()

    async def until(what: str, holds: Callable[[tuple[bool, str]], bool]) -> tuple[bool, str]:
        """The readiness once `holds` says so; each wait is for an event, bounded, never a fixed sleep."""
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            state = lifecycle.readiness()
            if holds((state.ready, state.reason)):
                return state.ready, state.reason
            assert asyncio.get_running_loop().time() < deadline, f"never {what}: {state}"
            await asyncio.sleep(0.02)  # polling the readiness, bounded by the deadline

    async def scenario() -> list[tuple[bool, str]]:
        server = await asyncio.start_unix_server(mute, path)
        asyncio.get_running_loop().call_later(0.05, engine.apply, READY)  # its last word before it went quiet
        await engine.start(lifecycle)
        spoke = await until("ready", lambda seen: seen[0])
        silent = await until("not answered", lambda seen: "has not answered" in seen[1])  # past the 0.3 s bound
        payload = encode(READY)  # it speaks again: a beat, a framed State, through the link as the engine sends it
        writers[0].write(len(payload).to_bytes(4, "little") + payload)
        spoke_again = await until("ready again", lambda seen: seen[0])
        live["value"] = False  # the supervisor gives the engine up
        given_up = await until("given up", lambda seen: "will not be restarted" in seen[1])
        await engine.stop(1.0)
        server.close()
        return [spoke, silent, spoke_again, given_up]

    spoke, silent, spoke_again, given_up = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert spoke[0] and spoke_again[0]
    assert not silent[0] and "has not answered" in silent[1]
    assert not given_up[0] and "will not be restarted" in given_up[1]
    assert "will not be restarted" in engine.link.gone_for_good


def test_an_engine_that_said_it_would_be_quiet_is_not_taken_for_hung_until_that_time_is_over(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export of a torch profiler trace holds the engine process for seconds: it says so first (State.quiet_s),
    and the worker stays ready through that window, then judges silence as before."""
    monkeypatch.setattr(remote_module, "LIVE_POLL_S", 0.05)
    monkeypatch.setattr(remote_module, "ENGINE_SILENT_S", 0.3)
    monkeypatch.setattr("glassbox.service.ipc.link.ENGINE_SILENT_S", 0.3)
    path = str(tmp_path / "engine.sock")
    engine = RemoteEngineSide.build(app_settings(tiny_model_dir), path, live=lambda: True)
    lifecycle = Lifecycle()
    writers: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read()

    async def scenario() -> tuple[bool, bool, str]:
        server = await asyncio.start_unix_server(mute, path)
        quiet = State("ready", "cpu", "", True, "", 1, "eager-fp32", quiet_s=1.5)
        asyncio.get_running_loop().call_later(0.05, lambda: writers[0].write(
            len(encode(quiet)).to_bytes(4, "little") + encode(quiet)))
        await engine.start(lifecycle)
        deadline = asyncio.get_running_loop().time() + 10
        while not lifecycle.readiness().ready:  # the engine's word has arrived
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.9)  # three times the silence bound, inside the announced window
        during = lifecycle.readiness().ready
        while "has not answered" not in lifecycle.readiness().reason:  # after the window, silence counts again
            assert asyncio.get_running_loop().time() < deadline, lifecycle.readiness()
            await asyncio.sleep(0.02)
        after = lifecycle.readiness()
        await engine.stop(1.0)
        server.close()
        return during, after.ready, after.reason

    during, after_ready, after_reason = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert during and not after_ready and "has not answered" in after_reason
