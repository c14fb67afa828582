"""`glassbox serve`: flags and env, the uvicorn wiring, and graceful drain (in-process and as a real subprocess)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from glassbox.chaos.local import free_port
from glassbox.service.http.guard import GuardedHttpToolsProtocol
from glassbox.service.lifecycle import DeadClock, Lifecycle
from glassbox.service.server import add_arguments, settings_from_args
from glassbox.service.serving.http_server import DrainingServer, uvicorn_config
from glassbox.service.settings import Settings, field_names
from tests.service.apptools import until
from tests.service.http.raw import connect, parse_reply, read_one, read_to_eof

BOUND_S = 60.0  # the most any wait in this file may take before the test fails


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="serve")
    add_arguments(parser)
    return parser.parse_args(argv)


# --- flags and environment -------------------------------------------------------------------------------------------
def test_every_settings_field_has_a_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    for name in field_names():
        assert "--" + name.replace("_", "-") in flags


def test_flags_build_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in field_names():
        monkeypatch.delenv("GLASSBOX_" + name.upper(), raising=False)
    args = parse(["--max-batch-size", "7", "--no-cuda-graphs", "--length-buckets", "8,16", "--device", "cpu",
                  "--body-timeout-s", "2.5", "--log-level", "debug"])
    settings = settings_from_args(args)
    assert settings.max_batch_size == 7
    assert settings.cuda_graphs is False
    assert settings.length_buckets == (8, 16)
    assert settings.device == "cpu"
    assert settings.body_timeout_s == 2.5
    assert settings.log_level == "debug"
    assert settings.max_batch_tokens == Settings().max_batch_tokens  # untouched fields keep their defaults


def test_env_applies_unless_a_flag_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_MAX_BATCH_TOKENS", "100")
    monkeypatch.setenv("GLASSBOX_MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("GLASSBOX_CUDA_GRAPHS", "false")
    settings = settings_from_args(parse(["--max-batch-size", "5"]))
    assert settings.max_batch_tokens == 100  # a flag's default must not override the environment
    assert settings.max_batch_size == 5  # a flag the user gave does
    assert settings.cuda_graphs is False
    assert settings_from_args(parse(["--cuda-graphs"])).cuda_graphs is True


@pytest.mark.parametrize("argv", [["--device", "gpu"], ["--length-buckets", "8,x"], ["--port", "eighty"],
                                  ["--log-level", "loud"]])
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(("raw", "reason"), [("16 32", "no spaces"), ("16,16", "16 appears twice"),
                                             ("32,16", "ascending order"), ("0,16", "0 is not allowed")])
def test_a_list_flag_is_parsed_strictly_and_the_error_names_the_flag(
        raw: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--length-buckets", raw])
    assert exc.value.code == 2
    error = capsys.readouterr().err
    assert "argument --length-buckets: " in error and reason in error, error


def test_help_shows_the_value_in_effect_and_where_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in field_names():
        monkeypatch.delenv("GLASSBOX_" + name.upper(), raising=False)
    monkeypatch.setenv("GLASSBOX_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("GLASSBOX_API_KEY", "s3cret-key")
    parser = argparse.ArgumentParser(prog="serve")
    add_arguments(parser)
    helps = {action.dest: action.help or "" for action in parser._actions}
    assert helps["max_batch_size"].endswith("(env GLASSBOX_MAX_BATCH_SIZE, now: 8 from GLASSBOX_MAX_BATCH_SIZE)")
    assert helps["max_batch_tokens"].endswith("(env GLASSBOX_MAX_BATCH_TOKENS, default: 4096)")
    assert "s3cret" not in parser.format_help() and "--api-key " not in parser.format_help()  # a secret: no flag


def test_an_unknown_variable_is_a_warning_at_start_up(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    import glassbox.service.server as server

    monkeypatch.setenv("GLASSBOX_MAX_BATCHSIZE", "8")
    monkeypatch.setattr(server, "_workers", lambda settings: 0)

    def refuse(settings: Settings) -> None:  # stop right after the start-up checks; no model is loaded
        raise server.GlassboxError("stop here")

    monkeypatch.setattr("glassbox.service.serving.one_process.create_serving_app", refuse)
    monkeypatch.setattr("glassbox.service.serving.wiring.configure_logging", lambda settings, process="": None)
    with caplog.at_level("WARNING", logger="glassbox"):
        assert server.run(parse(["--device", "cpu", "--port", "0"])) == 1
    assert ("GLASSBOX_MAX_BATCHSIZE is not a glassbox setting and is ignored; did you mean GLASSBOX_MAX_BATCH_SIZE?"
            in caplog.messages)


def test_a_port_in_use_fails_before_the_model_loads_with_one_plain_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import glassbox.service.server as server

    loaded: list[Settings] = []
    monkeypatch.setattr(server, "_workers", lambda settings: 0)
    monkeypatch.setattr("glassbox.service.serving.one_process.create_serving_app", loaded.append)
    monkeypatch.setattr("glassbox.service.serving.wiring.configure_logging", lambda settings, process="": None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert server.run(parse(["--device", "cpu", "--port", str(port), "--log-format", "text"])) == 1
    assert loaded == []  # never got as far as loading (or logging "startup complete")
    assert capsys.readouterr().err == (f"glassbox serve: cannot start: 127.0.0.1:{port} is in use "
                                       "(--host, --port)\n")


def test_a_start_up_error_is_one_plain_line_on_stderr(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import glassbox.service.server as server
    from glassbox.service.errors import ModelLoadError

    def refuse(settings: Settings) -> None:
        raise ModelLoadError("no model at /nowhere")

    monkeypatch.setattr(server, "_workers", lambda settings: 0)
    monkeypatch.setattr("glassbox.service.serving.one_process.create_serving_app", refuse)
    monkeypatch.setattr("glassbox.service.serving.wiring.configure_logging", lambda settings, process="": None)
    assert server.run(parse(["--device", "cpu", "--port", "0", "--log-format", "text"])) == 1
    assert capsys.readouterr().err == f"glassbox serve: cannot start: no model at /nowhere ({ModelLoadError.code})\n"


def test_uvicorn_is_configured_from_settings(tiny_model_dir: Path) -> None:
    settings = Settings(host="127.0.0.1", port=9123, drain_timeout_s=2.5, header_timeout_s=1.0, max_body_bytes=10,
                        log_level="warning")
    config = uvicorn_config(object(), settings, lambda reason: None)  # type: ignore[arg-type]
    assert (config.host, config.port, config.loop, config.lifespan) == ("127.0.0.1", 9123, "uvloop", "on")
    assert config.access_log is False
    assert config.timeout_graceful_shutdown == 3  # whole seconds, rounded up
    assert isinstance(config.http, type) and issubclass(config.http, GuardedHttpToolsProtocol)
    limits = config.http.guard.limits
    assert (limits.header_timeout_s, limits.max_body_bytes) == (1.0, 10)


def test_keep_alive_and_trusted_proxies_reach_uvicorn() -> None:
    settings = Settings(keep_alive_timeout_s=620, forwarded_allow_ips="10.0.0.0/8, 192.0.2.7")
    config = uvicorn_config(object(), settings, lambda reason: None)  # type: ignore[arg-type]
    assert config.timeout_keep_alive == 620
    assert config.proxy_headers is True and config.forwarded_allow_ips == "10.0.0.0/8,192.0.2.7"
    # uvicorn trusts every peer only for exactly "*": a stray space (a ConfigMap, an env file) must not trust nobody.
    for spelled in (" * ", "*\n", "10.0.0.0/8, *"):
        trusted = uvicorn_config(object(), Settings(forwarded_allow_ips=spelled), lambda reason: None)  # type: ignore[arg-type]
        assert trusted.forwarded_allow_ips == "*", spelled
    assert Settings().keep_alive_timeout_s > 60  # above the 60 s idle timeout of AWS ALB and ingress-nginx


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout_and_not_before() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    gate = threading.Event()
    gate.set()
    server = uvicorn.Server(uvicorn_config(gated_app(gate), Settings(keep_alive_timeout_s=1), lambda reason: None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    async def scenario() -> None:
        await until(lambda: server.started, "uvicorn started")
        reader, writer = await connect(port)
        writer.write(b"GET /one HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_one(reader)).status == 200
        await asyncio.sleep(0.5)  # idle, but not for long: the connection still serves
        writer.write(b"GET /two HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_one(reader)).status == 200
        idle_from = time.monotonic()
        assert await read_to_eof(reader) == b""  # then closed by the server, quietly
        assert time.monotonic() - idle_from >= 0.8

    try:
        asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    finally:
        server.should_exit = True
        thread.join(BOUND_S)
        sock.close()


# --- the open-file limit --------------------------------------------------------------------------------------------
LIMIT_PROBE = ("import resource; from glassbox.service.serving.http_server import raise_open_file_limit; "
               "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))")


def _hard_limit_for_test() -> int:
    """A hard limit the test may set without privileges: no higher than the one it runs under (a user without
    CAP_SYS_RESOURCE cannot raise it, and many hosts give 4096 or less), and 8192 at most."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)


@pytest.mark.parametrize("case", ["raised", "low-hard"])
def test_serve_raises_the_open_file_limit_to_the_hard_one_and_warns_when_that_is_low(case: str) -> None:
    """Each connection holds a file; past the limit the event loop resets new connections without an answer or a
    log line, so a default soft limit of 1024 capped a server at ~1000 connections for no reason."""
    import resource

    hard = _hard_limit_for_test() if case == "raised" else 256
    if hard < 256:
        pytest.skip(f"the hard open-file limit here is {hard}, below the test's soft limit of 256")
    given, after, warned = (256, hard), (hard, hard), hard < 4096

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, given)

    done = subprocess.run([sys.executable, "-c", LIMIT_PROBE], capture_output=True, text=True, timeout=BOUND_S,
                          preexec_fn=limit, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"({after[0]},", f"{after[1]})"] * 2
    assert (f"the open-file limit is {after[0]} " in done.stderr) is warned, done.stderr


# --- drain, in-process: readiness, the listener, in-flight requests --------------------------------------------------
def gated_app(gate: threading.Event) -> Any:
    """An ASGI app whose requests answer only once `gate` is set, so a request can be held in flight."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        await asyncio.to_thread(gate.wait, BOUND_S)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def gated_server(exit_when_dead_s: float = 0.0) -> tuple[DrainingServer, Lifecycle, threading.Event, threading.Thread,
                                                         int]:
    """A DrainingServer over gated_app on a free port, its lifecycle ready (and watched for liveness), in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    lifecycle = Lifecycle()
    lifecycle.mark_ready("cpu")
    gate = threading.Event()
    config = uvicorn_config(gated_app(gate), Settings(drain_timeout_s=10), lambda reason: None)
    server = DrainingServer(config, lifecycle.begin_drain, live=lambda: lifecycle.live,
                            exit_when_dead_s=exit_when_dead_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, lifecycle, gate, thread, sock.getsockname()[1]


def stop_gated(server: DrainingServer, gate: threading.Event, thread: threading.Thread) -> None:
    server.should_exit = True
    gate.set()
    thread.join(BOUND_S)


def test_signal_drops_readiness_closes_the_listener_and_finishes_in_flight() -> None:
    server, lifecycle, gate, thread, port = gated_server()

    async def scenario() -> None:
        reader, writer = await connect(port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
        half_reader, half_writer = await connect(port)
        half_writer.write(b"GET /half HTTP/1.1\r\nHost: t\r\n")  # its header block has begun: in flight
        fresh_reader, fresh_writer = await connect(port)  # accepted, but its request is still in transit
        await until(lambda: len(server.server_state.tasks) == 1 and len(server.server_state.connections) == 3,
                    "the held request reached the app")
        server.handle_exit(signal.SIGTERM, None)
        await until(lambda: not lifecycle.readiness().ready, "readiness dropped")
        assert lifecycle.readiness().phase == "draining"
        deadline = time.monotonic() + BOUND_S
        while True:  # connections may be accepted until the loop runs the drain callback, then never again
            try:
                _, probe = await connect(port)
            except ConnectionRefusedError:
                break
            probe.close()
            assert time.monotonic() < deadline, "the listener kept accepting after the signal"
            await asyncio.sleep(0.01)
        assert thread.is_alive()  # still draining: three requests are in flight
        half_writer.write(b"\r\n")
        fresh_writer.write(b"GET /fresh HTTP/1.1\r\nHost: t\r\n\r\n")
        gate.set()
        for reply_reader in (reader, half_reader, fresh_reader):
            reply = parse_reply(await read_to_eof(reply_reader))
            assert (reply.status, reply.body, reply.headers.get("connection")) == (200, b"ok", "close")

    try:
        asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    finally:
        stop_gated(server, gate, thread)
    assert not thread.is_alive()


def test_a_server_dead_for_exit_when_dead_s_drains_and_exits_3() -> None:
    """--exit-when-dead-s: Docker's restart policies and systemd restart a process that exits, not one whose /livez
    fails, so a dead server leaves, by the same drain as SIGTERM: a request in flight is still answered."""
    server, lifecycle, gate, thread, port = gated_server(exit_when_dead_s=0.5)

    async def scenario() -> None:
        reader, writer = await connect(port)
        writer.write(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
        await until(lambda: len(server.server_state.tasks) == 1, "the held request reached the app")
        dead_at = time.monotonic()
        lifecycle.mark_not_live("the device fell off the bus")
        await until(lambda: lifecycle.readiness().phase == "draining", "the dead server began to drain")
        assert time.monotonic() - dead_at >= 0.5  # not before it had been dead for the time set
        assert thread.is_alive()  # the request in flight is still being served
        gate.set()
        reply = parse_reply(await read_to_eof(reader))
        assert (reply.status, reply.body) == (200, b"ok")

    try:
        asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    finally:
        stop_gated(server, gate, thread)
    assert not thread.is_alive() and server.exit_code == 3


def test_the_dead_clock_needs_an_unbroken_stretch_and_never_runs_at_0() -> None:
    clock = DeadClock(10.0)
    assert not clock.expired(False, 100.0) and not clock.expired(False, 109.9)
    assert not clock.expired(True, 110.0)  # alive again: the count starts over
    assert not clock.expired(False, 111.0) and not clock.expired(False, 120.9) and clock.expired(False, 121.0)
    off = DeadClock(0.0)
    assert not off.expired(False, 0.0) and not off.expired(False, 1e9)


# --- drain, for real: `python -m glassbox.service serve` under load, then SIGTERM -------------------------------------
TEXTS = ["a very good movie", "the worst film and a boring plot", "great acting", "slow and sad", "fun music",
         "the ending was awful", "best cast", "a long script"]


def classify_request(texts: list[str], *, expect_continue: bool = False) -> tuple[bytes, bytes]:
    body = json.dumps({"texts": texts}).encode()
    head = (f"POST /v1/classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode()
    if expect_continue:
        head += b"Expect: 100-continue\r\n"
    return head + b"\r\n", body


async def one_request(port: int) -> str | int:
    """A status when the server answered, else why not:
    - "refused": the listener is closed;
    - "reset": the connection was still in the kernel's accept queue (never handed to the server) when the listener
      closed; Linux resets those. Nothing in this test makes the server itself close a connection it has accepted,
      so a reset here is not a request the server dropped;
    - "lost": the server accepted the connection and closed it without an answer (a failure)."""
    try:
        reader, writer = await connect(port)
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:  # reset during the handshake: it never reached the server's accept()
        return "reset"
    try:
        head, body = classify_request(TEXTS)
        writer.write(head + body)
        await writer.drain()
        raw = await read_to_eof(reader)
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    finally:
        writer.close()
    return parse_reply(raw).status if raw else "lost"


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, in_a_row: int = 1, workers: int = 0) -> None:
    """Until every one of `workers` HTTP worker processes has started its server (a worker still starting does not
    accept yet, so the connections below cannot reach it) and /readyz answers 200 on `in_a_row` new connections in
    a row (each goes to one of the workers: 20 in a row means, short of a one-in-500,000 draw, that every one of two
    is ready)."""
    deadline = time.monotonic() + BOUND_S
    while log.read_text().count("Application startup complete") < workers:
        assert proc.poll() is None, f"serve exited early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"the workers did not all start:\n{log.read_text()}"
        time.sleep(0.05)  # polling the log, bounded by the deadline
    streak = 0
    while streak < in_a_row:
        assert proc.poll() is None, f"serve exited early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"serve did not become ready:\n{log.read_text()}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                ok = sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
        streak = streak + 1 if ok else 0
        if not ok:
            time.sleep(0.05)  # polling the socket, bounded by the deadline


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "two-workers"])
def test_sigterm_under_load_loses_no_accepted_request_and_exits_0(tiny_model_dir: Path, tmp_path: Path,
                                                                  workers: int) -> None:
    # With workers, the drain covers every process: the workers finish what they accepted (the engine process still
    # serves them), then the engine stops, then the supervisor exits 0.
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
            "--port", str(port), "--threads", "1", "--max-length", "32", "--length-buckets", "16,32",
            "--batch-buckets", "1,8", "--drain-timeout-s", "30", "--workers", str(workers),
            # ten clients at once on 2 shared cores may predict waits over the default bound: this test is about the
            # drain, and every request it sends must be admitted
            "--max-queue-wait-ms", "60000"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=Path(__file__).resolve().parents[2])
    try:
        wait_ready(proc, port, log, in_a_row=20 if workers else 1, workers=workers)
        outcomes, anchor, refused_while_alive = asyncio.run(asyncio.wait_for(burst_then_sigterm(proc, port), BOUND_S))
        code = proc.wait(BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    answered = [o for o in outcomes if isinstance(o, int)]
    assert answered and set(answered) == {200}, f"accepted requests must all succeed: {outcomes}\n{text}"
    assert "lost" not in outcomes, outcomes
    assert anchor == 200, text
    assert refused_while_alive, f"new connections were not refused during the drain: {outcomes}\n{text}"
    assert "draining" in text
    assert code == 0, text
    if workers:  # every worker finished its server, then the engine stopped after them
        assert text.count("Finished server process") == workers, text
        assert text.index("engine stopped") > text.rindex("Finished server process"), text


async def burst_then_sigterm(proc: subprocess.Popen[bytes], port: int) -> tuple[list[str | int], int, bool]:
    # The anchor is in the app (100 Continue proves its handler asked for the body) with half its body sent when
    # the signal arrives; the drain must wait for it, which keeps the process alive while refusals are checked.
    reader, writer = await connect(port)
    head, body = classify_request(TEXTS, expect_continue=True)
    writer.write(head)
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)).startswith(b"HTTP/1.1 100")
    writer.write(body[: len(body) // 2])

    outcomes: list[str | int] = []
    enough_done = asyncio.Event()

    async def worker() -> None:
        for _ in range(6):
            outcomes.append(await one_request(port))
            if len(outcomes) >= 20:
                enough_done.set()

    workers = [asyncio.ensure_future(worker()) for _ in range(10)]
    await asyncio.wait_for(enough_done.wait(), BOUND_S)
    proc.send_signal(signal.SIGTERM)
    refused_while_alive = False
    while not refused_while_alive:
        result = await one_request(port)
        if result == "refused":
            refused_while_alive = proc.poll() is None
            break
        outcomes.append(result)
    await asyncio.gather(*workers)
    writer.write(body[len(body) // 2:])
    anchor = await read_one(reader)
    writer.close()
    return outcomes, anchor.status, refused_while_alive
