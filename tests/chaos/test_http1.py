"""glassbox.chaos.loadgen.http1 against small scripted asyncio servers on 127.0.0.1.

Each server reads whole requests (head + Content-Length body) and answers request number n (counted over all its
connections) with `script(n)`: raw pieces written one after another, yielding to the event loop in between so
the client usually reads them separately, then optionally closing. Assertions are on statuses, on which failures
were raised and on how many connections were opened, never on time.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from glassbox.chaos.loadgen import http1
from glassbox.chaos.loadgen.http1 import HEAD_LIMIT, ConnectFailed, Endpoint, Http1Connection, TransportFailed
from tests.service.apptools import until

BOUND_S = 30.0  # the most any scenario may take; only reached when a test is already failing
POLL_S = 0.005
T = TypeVar("T")


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every scenario runs on the standard event loop and on uvloop, which `glassbox bench` uses."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    yield request.param
    asyncio.set_event_loop_policy(None)


@dataclass(frozen=True)
class Reply:
    pieces: Sequence[bytes] = ()  # () with close=False: never answer
    close: bool = False  # close the connection once the pieces are written


def ok(body: bytes = b'{"ok": true}', head: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return version + b" 200 OK\r\nContent-Length: %d\r\n" % len(body) + head + b"\r\n" + body


class Scripted:
    def __init__(self, script: Callable[[int], Reply]) -> None:
        self.script = script
        self.requests = 0  # read so far, over all connections
        self.accepted = 0
        self.finished = 0  # connections the server's side has let go of

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.partition(b":")[2]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                reply = self.script(self.requests)
                self.requests += 1
                for piece in reply.pieces:
                    writer.write(piece)
                    await writer.drain()
                    for _ in range(3):  # let the client's read run, so that pieces usually arrive one by one
                        await asyncio.sleep(0)
                if reply.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            writer.close()
            self.finished += 1


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), BOUND_S)
    return asyncio.run(bounded())


async def serve(script: Callable[[int], Reply], tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, Scripted]:
    scripted = Scripted(script)
    return await asyncio.start_server(scripted.handle, "127.0.0.1", 0, ssl=tls), scripted


def client_for(server: asyncio.Server, tls: ssl.SSLContext | None = None) -> tuple[Http1Connection, bytes]:
    port = server.sockets[0].getsockname()[1]
    endpoint = Endpoint.parse(f"{'https' if tls else 'http'}://127.0.0.1:{port}")
    return Http1Connection(endpoint, tls), endpoint.render_post("/v1/classify", "application/json", b'{"text": "x"}')


def talk(script: Callable[[int], Reply], requests: int, *, await_server_close: bool = False,
         tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> tuple[list[int | str], int]:
    """Send `requests` POSTs over one Http1Connection: each status or failure name, and connections opened.
    `await_server_close`: after each answer, wait until the client has seen the server close the connection."""
    async def scenario() -> tuple[list[int | str], int]:
        server, scripted = await serve(script, tls[0] if tls else None)
        connection, raw = client_for(server, tls[1] if tls else None)
        out: list[int | str] = []
        for _ in range(requests):
            try:
                out.append(await connection.request(raw))
            except (ConnectFailed, TransportFailed) as exc:
                out.append(type(exc).__name__)
            if await_server_close:
                await until(lambda: connection.peer_closed, "the client saw the server close")
        connection.close()
        server.close()
        await server.wait_closed()
        await until(lambda: scripted.finished == scripted.accepted, "the server let go of every connection")
        assert scripted.accepted == connection.opened
        return out, connection.opened

    return run(scenario)


def always(*pieces: bytes, close: bool = False) -> Callable[[int], Reply]:
    return lambda n: Reply(pieces, close)


# --- framing ---------------------------------------------------------------------------------------------------------
def test_content_length_answers_in_pieces_keep_one_connection() -> None:
    raw = ok(b"0123456789" * 100)
    assert talk(always(raw[:7], raw[7:30], raw[30:500], raw[500:]), 3) == ([200, 200, 200], 1)


def test_chunked_answers_in_several_chunks_with_trailers_keep_one_connection() -> None:
    head = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nRetry-After: 1\r\n\r\n"
    chunks = (b"4\r\n{\"a\"\r\n", b"3;ext=1\r\n: 1\r\n", b"a\r\n, \"b\": 22}\r\n",
              b"0\r\nX-Trailer: yes\r\n", b"X-Checksum: 3a\r\n\r\n")
    assert talk(always(head, *chunks), 3) == ([429, 429, 429], 1)


def test_a_body_that_runs_to_the_end_of_the_connection_is_read_whole_then_replaced() -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\n"
    assert talk(always(head, b"over", b"loaded", close=True), 3) == ([503, 503, 503], 3)


def test_each_answer_says_its_own_retry_after() -> None:
    refused = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nRetry-After: %s\r\n\r\n"
    answers = [refused % b"7", ok(), refused % b"Wed, 21 Oct 2026 07:28:00 GMT", refused % b" 2 "]

    async def scenario() -> list[tuple[int, float | None]]:
        server, _ = await serve(lambda n: Reply((answers[n],)))
        connection, raw = client_for(server)
        seen = [(await connection.request(raw), connection.retry_after_s) for _ in answers]
        connection.close()
        server.close()
        await server.wait_closed()
        return seen

    # The date form is not read (the capacity probe then pauses its default), and a 200 clears the last delay.
    assert run(scenario) == [(429, 7.0), (200, None), (429, None), (429, 2.0)]


def test_bodiless_statuses_need_no_framing() -> None:
    answers = [b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", ok()]
    assert talk(lambda n: Reply((answers[n],)), 3) == ([204, 304, 200], 1)


@pytest.mark.parametrize("interim", [
    (b"HTTP/1.1 100 Continue\r\n\r\n",),
    (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"),
], ids=["100", "100-then-103"])
def test_interim_answers_are_skipped(interim: tuple[bytes, ...]) -> None:
    final = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
    assert talk(always(*interim, final), 2) == ([201, 201], 1)


def test_an_interim_answer_alone_before_the_close_is_a_failure_not_its_status() -> None:
    assert talk(always(b"HTTP/1.1 100 Continue\r\n\r\n", close=True), 2) == (["TransportFailed"] * 2, 2)


# --- when the connection ends ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    ok(head=b"Connection: close\r\n"),
    ok(version=b"HTTP/1.0"),
], ids=["connection-close", "http-1.0"])
def test_answers_that_end_the_connection_make_the_next_request_reconnect(raw: bytes) -> None:
    # The server keeps its side open: the client must go by what the answer said.
    assert talk(always(raw), 3) == ([200, 200, 200], 3)


def test_http_1_0_with_keep_alive_keeps_the_connection() -> None:
    assert talk(always(ok(head=b"Connection: keep-alive\r\n", version=b"HTTP/1.0")), 3) == ([200, 200, 200], 1)


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed() -> None:
    assert talk(always(ok(), close=True), 3, await_server_close=True) == ([200, 200, 200], 3)


def test_a_connection_idle_past_the_reconnect_age_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "IDLE_RECONNECT_S", 0.0)  # every connection counts as too old to reuse
    assert talk(always(ok()), 3) == ([200, 200, 200], 3)


def test_bytes_that_arrive_behind_an_answer_retire_the_connection() -> None:
    # A second answer nobody asked for (as a server sends a 408 before closing an idle connection) would
    # otherwise be taken as the answer to the next request.
    stray = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"
    assert talk(lambda n: Reply((ok() + stray,)), 3) == ([200, 200, 200], 3)


def test_a_101_answer_is_returned_and_the_connection_dropped() -> None:
    switching = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x00"
    assert talk(always(switching), 2) == ([101, 101], 2)


# --- failures --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pieces", [
    (b"SSH-2.0-OpenSSH_9.6\r\n",),
    (b"HTTP/1.1 abc\r\n\r\n",),
    (b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",),
    (b"HTTP/0.9 200 OK\r\nContent-Length: 0\r\n\r\n",),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",),
], ids=["not-http", "bad-status", "http-2.0", "http-0.9", "length-and-chunked", "bad-chunk-size"])
def test_answers_that_are_not_http_1_are_transport_failures(pieces: tuple[bytes, ...]) -> None:
    # The server leaves the connection open: the client must give up on what it read, not wait for more.
    assert talk(always(*pieces), 2) == (["TransportFailed"] * 2, 2)


@pytest.mark.parametrize("pieces", [
    (),
    (b"HTTP/1.1 200 OK\r\nContent-Le",),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"only twenty bytes..."),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n", b"only twenty bytes..."),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"4\r\nabcd\r\n"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"4\r\nabcd\r\n0\r\n"),
], ids=["nothing", "mid-head", "mid-body", "mid-body-connection-close", "mid-chunks", "mid-trailers"])
def test_a_server_that_closes_mid_answer_causes_transport_failures(pieces: tuple[bytes, ...]) -> None:
    assert talk(always(*pieces, close=True), 2) == (["TransportFailed"] * 2, 2)


def test_a_head_longer_than_the_limit_is_a_transport_failure() -> None:
    filler = b"X-Filler: " + b"y" * 1000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + filler * (HEAD_LIMIT // len(filler) + 1)
    assert talk(always(head), 2) == (["TransportFailed"] * 2, 2)


def test_nothing_listening_is_a_connect_failure() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again at once: nothing listens on it while the request runs

    async def scenario() -> None:
        connection = Http1Connection(Endpoint.parse(f"http://127.0.0.1:{port}"))
        with pytest.raises(ConnectFailed):
            await connection.request(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.opened == 0

    run(scenario)


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_request_cancelled_or_timed_out_closes_its_connection(how: str) -> None:
    async def scenario() -> None:
        server, scripted = await serve(lambda n: Reply() if n == 0 else Reply((ok(),)))  # the first never answered
        connection, raw = client_for(server)
        if how == "cancel":
            task = asyncio.ensure_future(connection.request(raw))
            await until(lambda: scripted.requests == 1, "the server read the request")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(None) as deadline:
                    task = asyncio.ensure_future(connection.request(raw))
                    await until(lambda: scripted.requests == 1, "the server read the request")
                    deadline.reschedule(asyncio.get_running_loop().time())  # expire now, while the task waits
                    await task
        await until(lambda: scripted.finished == 1, "the server saw the client close the connection")
        assert await connection.request(raw) == 200
        assert connection.opened == scripted.accepted == 2
        connection.close()
        server.close()
        await server.wait_closed()
        await until(lambda: scripted.finished == 2, "the server let go of both connections")

    run(scenario)


# --- TLS -------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting only the server's fresh self-signed certificate for 127.0.0.1)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    folder: Path = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=BOUND_S)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


def test_tls_keep_alive_chunked_and_close_delimited(tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"2\r\n{}\r\n", b"0\r\n\r\n")
    assert talk(always(*chunked), 3, tls=tls_pair) == ([200, 200, 200], 1)
    unframed = (b"HTTP/1.1 200 OK\r\n\r\n", b"body to the end")
    assert talk(always(*unframed, close=True), 2, tls=tls_pair) == ([200, 200], 2)
    assert talk(always(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", close=True), 1, tls=tls_pair) == (
        ["TransportFailed"], 1)


def test_tls_to_an_untrusted_certificate_is_a_connect_failure(
        tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    assert talk(always(ok()), 1, tls=(tls_pair[0], ssl.create_default_context())) == (["ConnectFailed"], 0)


def test_endpoint_parsing_and_request_rendering() -> None:
    endpoint = Endpoint.parse("http://example.test:8081/prefix/")
    assert (endpoint.host, endpoint.port, endpoint.tls, endpoint.host_header, endpoint.base_path) == (
        "example.test", 8081, False, "example.test:8081", "/prefix")
    assert Endpoint.parse("https://example.test").port == 443
    raw = endpoint.render_post("/v1/classify", "application/json", b"{}")
    assert raw.startswith(b"POST /prefix/v1/classify HTTP/1.1\r\nHost: example.test:8081\r\n")
    assert b"Content-Length: 2\r\n" in raw and raw.endswith(b"\r\n\r\n{}")
    with pytest.raises(ValueError):
        Endpoint.parse("example.test:80")
