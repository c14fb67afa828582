"""The slow-client guard against real sockets and a real uvicorn server (deadlines of 0.3 s, caps of 1 KiB / 2 KiB)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from glassbox.service.http import GuardLimits
from glassbox.service.settings import Settings
from tests.service.http.conftest import LIMITS, SEND_ERRORS, WATCHED_ANSWERED, GuardServer
from tests.service.http.raw import Reply, connect, get, parse_reply, post, read_one, read_to_eof, request, trickle


def assert_error(reply: Reply, status: int, code: str) -> None:
    assert reply.status == status
    assert reply.json()["error"]["code"] == code
    assert reply.json()["error"]["message"]
    assert reply.headers["connection"] == "close"
    assert reply.headers["content-type"] == "application/json"
    assert reply.rest == b""  # and then EOF: read_to_eof returned


HEADER_TRICKLE = b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 500  # 10 s at one byte per 20 ms
BODY_TRICKLE = b"x" * 500


async def trickled_headers(port: int) -> tuple[Reply, float]:
    reader, writer = await connect(port)
    start = time.monotonic()
    raw, sent = await trickle(reader, writer, HEADER_TRICKLE, every_s=0.02)
    writer.close()
    # The server answered while the client was still sending: a timer reset by each byte would never have fired.
    assert sent < len(HEADER_TRICKLE)
    return parse_reply(raw), time.monotonic() - start


async def trickled_body(port: int, path: str = "/echo") -> bytes:
    reader, writer = await connect(port)
    writer.write(post(path, b"", length=len(BODY_TRICKLE), close=False))  # keep-alive: only the guard may close it
    raw, sent = await trickle(reader, writer, BODY_TRICKLE, every_s=0.02)
    writer.close()
    assert sent < len(BODY_TRICKLE)
    return raw


def test_trickled_headers_get_408_at_the_header_deadline(guard_server: GuardServer) -> None:
    reply, elapsed = asyncio.run(trickled_headers(guard_server.port))
    assert_error(reply, 408, "request_timeout")
    assert reply.json()["error"]["message"] == "the request headers did not arrive within 0.3 s (--header-timeout-s)"
    assert guard_server.aborts == ["header_timeout"]
    assert elapsed >= LIMITS.header_timeout_s * 0.8  # not closed early: the deadline is the whole block's


def test_a_silent_connection_gets_408_counted_from_connection_open(guard_server: GuardServer) -> None:
    async def scenario() -> Reply:
        reader, writer = await connect(guard_server.port)
        raw = await read_to_eof(reader)
        writer.close()
        return parse_reply(raw)

    assert_error(asyncio.run(scenario()), 408, "request_timeout")
    assert guard_server.aborts == ["header_timeout"]


def test_trickled_body_gets_408_at_the_body_deadline(guard_server: GuardServer) -> None:
    reply = parse_reply(asyncio.run(trickled_body(guard_server.port)))
    assert_error(reply, 408, "request_timeout")
    assert guard_server.aborts == ["body_timeout"]


def test_body_deadline_after_the_response_started_just_closes(guard_server: GuardServer) -> None:
    # /early answers before reading the body; when the body then stalls there is nothing left to answer.
    reply = parse_reply(asyncio.run(trickled_body(guard_server.port, "/early")))
    assert reply.status == 200
    assert reply.body == b"ok"
    assert reply.rest == b""  # closed without a second (408) response
    assert guard_server.aborts == ["body_timeout"]


def test_oversized_header_block_gets_431(guard_server: GuardServer) -> None:
    reply = asyncio.run(request(guard_server.port, get(extra=b"X-Big: " + b"b" * 2000 + b"\r\n")))
    assert_error(reply, 431, "header_too_large")
    assert reply.json()["error"]["message"] == (  # the limit, and the flag that sets it
        f"the request header block is larger than the limit of {LIMITS.max_header_bytes} bytes (--max-header-bytes)")
    assert guard_server.aborts == ["header_too_large"]


def test_a_huge_header_line_that_never_ends_gets_431_before_it_is_complete(guard_server: GuardServer) -> None:
    async def scenario() -> bytes:
        reader, writer = await connect(guard_server.port)
        # 100-byte pieces of one endless header value: httptools reports no header until it ends, so only the
        # raw byte count can catch it (well before the header deadline).
        line = b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 4000
        raw, sent = await trickle(reader, writer, line, every_s=0.01, step=100)
        writer.close()
        assert sent < len(line)
        return raw

    assert_error(parse_reply(asyncio.run(scenario())), 431, "header_too_large")
    assert guard_server.aborts == ["header_too_large"]


def test_declared_body_over_the_cap_gets_413_before_any_body_is_sent(guard_server: GuardServer) -> None:
    reply = asyncio.run(request(guard_server.port, post("/echo", b"", length=LIMITS.max_body_bytes + 1)))
    assert_error(reply, 413, "payload_too_large")  # no body was sent: waiting for it would have given 408
    assert reply.json()["error"]["message"] == (
        f"the request body is larger than the limit of {LIMITS.max_body_bytes} bytes (--max-body-bytes)")
    assert guard_server.aborts == ["body_too_large"]


def test_streamed_chunked_body_over_the_cap_gets_413(guard_server: GuardServer) -> None:
    chunk = b"%x\r\n" % 1000 + b"c" * 1000 + b"\r\n"
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    reply = asyncio.run(request(guard_server.port, head + chunk * 3 + b"0\r\n\r\n"))
    assert_error(reply, 413, "payload_too_large")
    assert guard_server.aborts == ["body_too_large"]


def test_bytes_the_parser_refuses_get_a_json_400(guard_server: GuardServer) -> None:
    for raw in (b"NOT HTTP AT ALL\r\n\r\n", b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x01b\r\n\r\n"):
        reply = asyncio.run(request(guard_server.port, raw))
        assert_error(reply, 400, "invalid_http")
    assert guard_server.aborts == ["invalid_http"] * 3


def test_bytes_the_parser_refuses_log_no_warning(guard_server: GuardServer, caplog: pytest.LogCaptureFixture) -> None:
    # The guard answers, counts (glassbox_http_aborted_total) and logs (at info) each one; uvicorn's own WARNING
    # "Invalid HTTP request received." said it again, once per connection of any client that speaks something else to
    # the port (a TLS probe, a scanner): a warning a day of such traffic turns into noise nobody can act on.
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        assert_error(asyncio.run(request(guard_server.port, b"NOT HTTP AT ALL\r\n\r\n")), 400, "invalid_http")
    assert guard_server.aborts == ["invalid_http"] * 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def pipelined_behind_a_slow_answer(port: int, bad: bytes) -> tuple[Reply, Reply]:
    reader, writer = await connect(port)
    writer.write(get("/slow", close=False) + bad)
    await writer.drain()
    first = await read_one(reader)
    second = parse_reply(await read_to_eof(reader))
    writer.close()
    return first, second


CHUNKED_POST = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_broken_chunked_framing_inside_a_body_is_answered_at_once(guard_server: GuardServer) -> None:
    raw = CHUNKED_POST + b"5\r\nhello\r\nZZZ\r\n"
    reply = asyncio.run(request(guard_server.port, raw))  # the request being read is the bad one: no one to wait for
    assert_error(reply, 400, "invalid_http")
    assert guard_server.aborts == ["invalid_http"]


def test_a_bad_request_pipelined_behind_a_good_one_is_answered_after_it(guard_server: GuardServer) -> None:
    cases = ((b"NOT HTTP AT ALL\r\n\r\n", 400, "invalid_http"),
             (b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 2000 + b"\r\n\r\n", 431, "header_too_large"),
             # a queued request whose own body is bad never runs, and is answered after the one ahead of it
             (CHUNKED_POST + b"5\r\nhello\r\nZZZ\r\n", 400, "invalid_http"),
             (post("/echo", b"x" * 3000, close=False), 413, "payload_too_large"))
    for bad, status, code in cases:
        first, second = asyncio.run(pipelined_behind_a_slow_answer(guard_server.port, bad))
        assert (first.status, first.body) == (200, b"ok")  # the good request ahead is answered, not cut off
        assert_error(second, status, code)


def test_requests_within_the_limits_pass_on_one_keep_alive_connection(guard_server: GuardServer) -> None:
    async def scenario() -> list[Reply]:
        reader, writer = await connect(guard_server.port)
        replies = []
        for raw in (get(close=False), post("/echo", b"e" * LIMITS.max_body_bytes, close=False),
                    get(close=False, extra=b"X-Fill: " + b"f" * 800 + b"\r\n")):
            writer.write(raw)
            replies.append(await read_one(reader))
        writer.close()
        return replies

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [200, 200, 200]
    assert replies[1].body == str(LIMITS.max_body_bytes).encode()
    assert guard_server.aborts == []


def test_keep_alive_idleness_is_not_a_header_timeout(guard_server: GuardServer) -> None:
    async def scenario() -> tuple[bool, Reply]:
        reader, writer = await connect(guard_server.port)
        writer.write(get(close=False))
        await read_one(reader)
        # Stay idle for twice the header deadline (uvicorn's keep-alive timeout here is 5 s): nothing may arrive.
        try:
            await asyncio.wait_for(reader.read(1), LIMITS.header_timeout_s * 2)
            closed_while_idle = True
        except TimeoutError:
            closed_while_idle = False
        writer.write(get(close=False))
        second = await read_one(reader)
        writer.close()
        return closed_while_idle, second

    closed_while_idle, second = asyncio.run(scenario())
    assert not closed_while_idle
    assert second.status == 200
    assert guard_server.aborts == []


def test_normal_clients_keep_working_while_slow_clients_attack(guard_server: GuardServer) -> None:
    attackers = 24
    normal_requests = 40

    async def normal_client() -> list[int]:
        statuses = []
        reader, writer = await connect(guard_server.port)
        for i in range(normal_requests):
            if i % 2:
                writer.write(get(close=False))
            else:
                writer.write(post("/echo", b"n" * 100, close=False))
            statuses.append((await read_one(reader)).status)
        writer.close()
        fresh = await asyncio.gather(*(request(guard_server.port, get()) for _ in range(10)))
        return statuses + [r.status for r in fresh]

    async def header_attacker() -> Reply:
        return (await trickled_headers(guard_server.port))[0]

    async def body_attacker() -> Reply:
        return parse_reply(await trickled_body(guard_server.port))

    async def scenario() -> tuple[list[int], list[Reply]]:
        attack = [asyncio.ensure_future(header_attacker()) for _ in range(attackers // 2)]
        attack += [asyncio.ensure_future(body_attacker()) for _ in range(attackers // 2)]
        statuses = await normal_client()
        return statuses, list(await asyncio.gather(*attack))

    statuses, attack_replies = asyncio.run(scenario())
    assert statuses == [200] * (normal_requests + 10)
    assert [r.status for r in attack_replies] == [408] * attackers
    assert sorted(guard_server.aborts) == ["body_timeout"] * (attackers // 2) + ["header_timeout"] * (attackers // 2)


def test_limits_come_from_settings() -> None:
    settings = Settings(header_timeout_s=1.5, body_timeout_s=2.5, max_header_bytes=100, max_body_bytes=200)
    assert GuardLimits.from_settings(settings) == GuardLimits(1.5, 2.5, 100, 200)


def test_a_request_that_waited_in_the_pipeline_and_then_breaks_its_body_is_answered(guard_server: GuardServer) -> None:
    async def scenario() -> tuple[Reply, Reply]:
        reader, writer = await connect(guard_server.port)
        writer.write(get("/slow", close=False) + CHUNKED_POST + b"5\r\nhello\r\n")  # the POST waits behind /slow
        await writer.drain()
        first = await read_one(reader)  # the POST runs now, reading the rest of its body
        writer.write(b"ZZZ\r\n")
        await writer.drain()
        second = parse_reply(await read_to_eof(reader))
        writer.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert (first.status, first.body) == (200, b"ok")
    assert_error(second, 400, "invalid_http")


def test_a_client_that_leaves_with_requests_pipelined_is_not_answered_into_a_closed_socket(
        guard_server: GuardServer) -> None:
    async def scenario() -> None:
        _reader, writer = await connect(guard_server.port)
        writer.write(get("/slow-watched", close=False) * 3)  # one running, two queued behind it
        await writer.drain()
        writer.close()

    SEND_ERRORS.clear()
    WATCHED_ANSWERED.clear()
    asyncio.run(scenario())
    # The running request's handler got to its answer (0.2 s after it started): only then does "no send error"
    # mean anything.
    assert WATCHED_ANSWERED.wait(30), "the running request's handler never finished"
    assert SEND_ERRORS == []
