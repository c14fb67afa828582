"""The slow-client attacker against the real app under uvicorn with its slow-client guard (deadlines of 0.3 s).

What is asserted is what the server does to each mode: trickled headers and bodies are cut with 408 at the guard's
deadline while ordinary requests keep succeeding; slow readers are not cut within these short runs (the
guard's send deadline is 30 s), and the server parses no more of their pipelined requests than the guard's bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from glassbox.chaos.cli import slow_clients as cli
from glassbox.chaos.slowclients import RemoteTargetError, SlowClientConfig, SlowClientReport, run_slow_clients
from glassbox.chaos.slowclients.attack import MIN_STEP_S
from glassbox.chaos.slowclients.config import resolve_target
from glassbox.chaos.slowclients.wire import (
    ResponseScanner,
    body_request_head,
    endless_header_block,
    padded_body,
    pipelined_request,
)
from glassbox.service.app import create_app
from glassbox.service.http import GuardLimits
from tests.service.apptools import BOUND_S, FakeEngine, LiveServer, app_settings, live_server, until, wait_ready
from tests.service.apptools import wait_until as wait_until_sync

GUARD_S = 0.3  # the server's header and body deadlines in these tests
NORMAL_REQUESTS = 5


@dataclass
class Target:
    live: LiveServer
    aborts: list[str]  # the guard's abort reasons, as glassbox_http_aborted_total{reason} would count them

    @property
    def url(self) -> str:
        return self.live.base_url

    def connections(self) -> list[Any]:
        """The server's open connections (its protocol objects), read from the test's thread."""
        while True:
            try:
                return list(self.live.server.server_state.connections)
            except RuntimeError:  # the server thread changed the set while we copied it; copy again
                continue


@pytest.fixture(scope="module")
def _served(tiny_model_dir: Path) -> Iterator[Target]:
    settings = app_settings(tiny_model_dir, header_timeout_s=GUARD_S, body_timeout_s=GUARD_S)
    aborts: list[str] = []
    with live_server(create_app(settings, engine=FakeEngine()), settings, on_abort=aborts.append) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        yield Target(live, aborts)


@pytest.fixture
def target(_served: Target) -> Target:
    wait_until_sync(lambda: not _served.connections(), "the previous test's connections closed")
    _served.aborts.clear()
    return _served


def attack(target: Target, mode: str, **overrides: Any) -> SlowClientConfig:
    values: dict[str, Any] = {"connections": 5, "bytes_per_s": 20.0, "duration_s": 10.0, "ramp_s": 0.1,
                              "reconnect": False}
    values.update(overrides)
    return SlowClientConfig(target=target.url, mode=mode, **values)  # type: ignore[arg-type]


async def with_normal_traffic(target: Target, config: SlowClientConfig) -> tuple[SlowClientReport, list[int]]:
    """Run the attack; once the server holds every attacking connection, send ordinary requests alongside it."""
    task = asyncio.create_task(run_slow_clients(config))
    await until(lambda: len(target.connections()) >= config.connections or task.done(), "the attackers connected")
    async with httpx.AsyncClient(base_url=target.url, timeout=BOUND_S) as client:
        statuses = [(await client.post("/v1/classify", json={"text": f"an ordinary request {i}"})).status_code
                    for i in range(NORMAL_REQUESTS)]
    return await task, statuses


# --- headers and body: the guard cuts them ----------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "reason"), [("headers", "header_timeout"), ("body", "body_timeout")])
def test_trickled_requests_are_cut_with_408_while_ordinary_requests_succeed(target: Target, mode: str,
                                                                            reason: str) -> None:
    report, normal = asyncio.run(with_normal_traffic(target, attack(target, mode)))
    assert normal == [200] * NORMAL_REQUESTS
    assert report.opened == 5
    assert report.closed_by_server == 5
    assert report.still_open_at_end == 0
    assert report.cuts == {"answered": 5, "eof": 0, "reset": 0}
    assert report.statuses == {408: 5}
    assert report.errors == {}
    assert target.aborts == [reason] * 5
    assert report.held.count == 5
    assert report.held.min_s is not None and report.held.min_s >= GUARD_S * 0.8  # cut at the deadline, not before
    assert report.elapsed_s < 10.0  # ended when every slot was done, not at the duration
    assert report.bytes_sent > 0 and report.bytes_received > 0


def test_a_body_that_arrives_in_time_gets_a_real_answer(target: Target) -> None:
    config = attack(target, "body", connections=2, bytes_per_s=20_000.0, body_bytes=200)
    report = asyncio.run(run_slow_clients(config))
    assert report.statuses == {200: 2}  # the trickled body is a valid classify request
    assert report.cuts["answered"] == 2
    assert target.aborts == []


def test_cut_connections_are_reopened_until_the_duration_ends(target: Target) -> None:
    config = attack(target, "headers", connections=3, duration_s=1.2, reconnect=True, reconnect_delay_s=0.0)
    report = asyncio.run(run_slow_clients(config))
    assert report.elapsed_s >= 1.2  # it ran for the whole duration
    assert report.reconnects >= 1
    assert report.reconnects == report.opened - 3
    assert report.opened == report.closed_by_server + report.still_open_at_end
    assert report.still_open_at_end <= 3
    assert report.statuses == {408: report.cuts["answered"]}
    assert len(target.aborts) >= report.closed_by_server
    wait_until_sync(lambda: not target.connections(), "the server saw every attacking socket close")


# --- reader: held, not cut --------------------------------------------------------------------------------------------
def test_slow_readers_are_held_to_the_end_while_ordinary_requests_succeed(target: Target) -> None:
    # Finding: the guard has deadlines for what the client sends, none for what it reads, so the server keeps a
    # slow reader (and the request whose answer it cannot flush) for as long as the reader likes.
    config = attack(target, "reader", connections=3, bytes_per_s=200.0, duration_s=1.0, pipeline_depth=16)
    report, normal = asyncio.run(with_normal_traffic(target, config))
    assert normal == [200] * NORMAL_REQUESTS
    assert report.elapsed_s >= 1.0  # nothing ended it before the duration
    assert report.opened == 3
    assert report.closed_by_server == 0
    assert report.still_open_at_end == 3
    assert target.aborts == []
    assert set(report.statuses) == {200}
    assert sum(report.statuses.values()) >= 3
    # Read at 200 B/s per connection, never faster (one pacing step of slack): the kernel did not read for us.
    step = max(1, round(200.0 * MIN_STEP_S))
    assert 0 < report.bytes_received <= 3 * (200.0 * report.elapsed_s + step)
    wait_until_sync(lambda: not target.connections(), "the server saw every attacking socket close")


def test_stop_ends_the_attack_early_and_closes_every_socket(target: Target) -> None:
    config = attack(target, "reader", connections=4, duration_s=60.0)

    async def scenario() -> SlowClientReport:
        stop = asyncio.Event()
        task = asyncio.create_task(run_slow_clients(config, stop))
        # A request the server has parsed proves the attacker's side of that connection is up (and counted).
        await until(lambda: sum(conn.cycle is not None for conn in target.connections()) >= 4, "4 requests arrived")
        stop.set()
        return await task

    report = asyncio.run(scenario())
    assert report.elapsed_s < 60.0
    assert report.opened == report.still_open_at_end == 4
    wait_until_sync(lambda: not target.connections(), "the server saw every attacking socket close")


def test_the_server_bounds_what_a_slow_reader_can_make_it_queue(target: Target) -> None:
    config = attack(target, "reader", connections=2, bytes_per_s=200.0, duration_s=1.0, pipeline_depth=2000)
    deepest = 0

    async def scenario() -> SlowClientReport:
        nonlocal deepest
        task = asyncio.create_task(run_slow_clients(config))
        while not task.done():
            deepest = max([deepest, *(len(conn.pipeline) for conn in target.connections())])
            await asyncio.sleep(MIN_STEP_S)  # a sampling step, bounded by the attack's own duration
        return await task

    report = asyncio.run(scenario())
    assert report.still_open_at_end == 2
    # The guard stops parsing once max_pipelined requests wait; one 4 KiB parser slice can hold a few more.
    bound = GuardLimits().max_pipelined + 8
    assert deepest <= bound, f"the server queued {deepest} pipelined requests on one slow-reading connection"


# --- bounds ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    {"connections": 0}, {"connections": 1001}, {"duration_s": 601.0}, {"duration_s": 0.0},
    {"bytes_per_s": 0.0}, {"bytes_per_s": float("nan")}, {"mode": "sideways"}, {"target": "https://127.0.0.1:1"},
    {"target": "http://user:pw@127.0.0.1:1"}, {"target": "127.0.0.1:8000"}, {"path": "v1/classify"},
    {"ramp_s": -1.0}, {"body_bytes": 4}, {"pipeline_depth": 0},
])
def test_configs_out_of_bounds_are_refused(change: dict[str, Any]) -> None:
    valid = SlowClientConfig("http://127.0.0.1:8000", 10, "headers", 10.0, 5.0)
    with pytest.raises(ValueError):
        replace(valid, **change)


def test_a_remote_target_is_refused_before_any_connection_unless_allowed() -> None:
    remote = SlowClientConfig("http://192.0.2.1:8000", 1, "headers", 10.0, 1.0)  # TEST-NET-1: never routed
    with pytest.raises(RemoteTargetError, match="not loopback") as refused:
        asyncio.run(run_slow_clients(remote))
    assert "unless --allow-remote is given" in str(refused.value)  # the flag a user types, not a field name
    _, address = asyncio.run(resolve_target(replace(remote, allow_remote=True)))
    assert address[:2] == ("192.0.2.1", 8000)
    _, local = asyncio.run(resolve_target(replace(remote, target="http://localhost:8000")))
    assert local[1] == 8000


# --- the bytes sent and the answers read ------------------------------------------------------------------------------
def test_the_header_block_never_ends() -> None:
    config = SlowClientConfig("http://127.0.0.1:8000", 1, "headers", 10.0, 1.0)
    block = endless_header_block(config).take(20_000)
    assert block.startswith(b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert b"\r\n\r\n" not in block
    assert len(block) == 20_000


def test_the_trickled_body_is_exactly_as_long_as_declared_and_valid_json() -> None:
    config = SlowClientConfig("http://127.0.0.1:8000/prefix/", 1, "body", 100.0, 5.0)
    assert config.declared_body_bytes == 501  # longer than the duration lets it trickle
    assert b"POST /prefix/v1/classify HTTP/1.1\r\n" in body_request_head(config)
    assert b"Content-Length: 501\r\n\r\n" in body_request_head(config)
    body = padded_body(config.declared_body_bytes).take(10_000)
    assert len(body) == 501
    assert json.loads(body)["text"]


def test_a_pipelined_request_is_complete() -> None:
    config = SlowClientConfig("http://127.0.0.1:8000", 1, "reader", 10.0, 1.0, texts_per_request=3)
    head, _, body = pipelined_request(config).partition(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert len(json.loads(body)["texts"]) == 3


def test_the_scanner_follows_pipelined_answers_split_anywhere() -> None:
    stream = (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
              b"HTTP/1.1 100 Continue\r\n\r\n"
              b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n"
              b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 2\r\nconnection: close\r\n\r\n{}")
    scanner = ResponseScanner()
    for i in range(len(stream)):
        scanner.feed(stream[i:i + 1])
    assert scanner.statuses == [200, 100, 204, 408]
    assert scanner.completed == 4
    assert not scanner.lost_framing


def test_the_scanner_counts_a_status_line_before_its_head_is_complete() -> None:
    scanner = ResponseScanner()
    scanner.feed(b"HTTP/1.1 408 Request Timeout\r\ncontent-ty")
    assert scanner.statuses == [408]
    assert scanner.completed == 0


def test_the_scanner_follows_chunked_answers() -> None:
    scanner = ResponseScanner()
    scanner.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                 b"HTTP/1.1 429 Too Many\r\n")
    assert scanner.statuses == [200, 429]
    assert scanner.completed == 1
    assert not scanner.lost_framing


def test_the_scanner_stops_counting_at_an_answer_it_cannot_frame() -> None:
    scanner = ResponseScanner()
    scanner.feed(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nbody until the close HTTP/1.1 200 OK\r\n")
    assert scanner.statuses == [200]
    assert scanner.lost_framing
    scanner = ResponseScanner()
    scanner.feed(b"SSH-2.0-OpenSSH\r\n")
    assert scanner.statuses == []
    assert scanner.lost_framing


# --- the command ------------------------------------------------------------------------------------------------------
def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_command_prints_the_report_as_json(target: Target, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--target", target.url, "--connections", "2", "--mode", "headers", "--rate", "20", "--duration", "10",
            "--ramp", "0", "--no-reconnect", "--json"]
    assert cli.run(parse(argv)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "headers"
    assert out["opened"] == 2
    assert out["closed_by_server"] == 2
    assert out["statuses"] == {"408": 2}
    assert out["held_s"]["count"] == 2


@pytest.mark.parametrize("argv", [
    ["--target", "http://127.0.0.1:1", "--connections", "1001", "--mode", "body", "--rate", "5", "--duration", "1"],
    ["--target", "http://192.0.2.1:1", "--connections", "1", "--mode", "body", "--rate", "5", "--duration", "1"],
])
def test_the_command_refuses_unbounded_or_remote_attacks(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse(argv)) == 2
    assert "glassbox chaos slow-clients:" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--rate", "0"), ("--duration", "9999"), ("--connections", "0")])
def test_a_refused_flag_is_named_as_typed(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = {"--target": "http://127.0.0.1:1", "--connections": "1", "--mode": "body", "--rate": "5",
            "--duration": "1", flag: value}
    assert cli.run(parse([item for pair in argv.items() for item in pair])) == 2
    assert capsys.readouterr().err.startswith(f"glassbox chaos slow-clients: {flag} must be")


def test_the_command_fails_when_no_connection_could_be_opened(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:  # a port that was just free on loopback: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    argv = ["--target", f"http://127.0.0.1:{port}", "--connections", "2", "--mode", "headers", "--rate", "5",
            "--duration", "0.3", "--ramp", "0", "--no-reconnect", "--json"]
    assert cli.run(parse(argv)) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["opened"] == 0
    assert out["errors"] == {"connect_refused": 2}
