"""telemetry/logs.py: JSON lines that parse and carry trace, span and request ids; levels; the per-request line; no
raw text unless asked; end to end through the app next to the tracing observer."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from glassbox.service.app import create_app
from glassbox.service.http.context import latency_ms, server_timing
from glassbox.service.observer import STAGES, FallbackEvent, StageSpan
from glassbox.telemetry.logs import LogObserver, configure_logging, level_number, sole_json_handler
from glassbox.telemetry.tracing import SpanIds
from tests.service.apptools import app_settings, parse_server_timing, ready_client
from tests.telemetry.tracetools import (
    PARENT_SPAN_ID,
    TRACE_ID,
    Fanout,
    batch_record,
    memory_tracing,
    request_record,
    settings,
    traceparent,
)


class Captured:
    def __init__(self, logger: logging.Logger, stream: io.StringIO) -> None:
        self.logger = logger
        self.stream = stream

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


@pytest.fixture
def captured(request: pytest.FixtureRequest) -> Iterator[Captured]:
    """A logger of this test's own (never the root, which pytest watches), configured by configure_logging."""
    overrides = getattr(request, "param", {})
    logger = logging.getLogger(f"test.logs.{request.node.name}")
    logger.propagate = False
    stream = io.StringIO()
    setup = configure_logging(settings(**{"log_level": "info", **overrides}), stream=stream, logger=logger)
    try:
        yield Captured(logger, stream)
    finally:
        setup.close()


def test_every_line_is_json_with_time_level_logger_message(captured: Captured) -> None:
    captured.logger.info("hello %s", "world", extra={"request_id": "r-9", "batch": 3, "color_message": "\x1b[1mhi"})
    captured.logger.debug("below the level")
    try:
        raise ValueError("boom")
    except ValueError:
        captured.logger.exception("failed")
    first, second = captured.lines()
    assert first["message"] == "hello world"
    assert first["level"] == "info"
    assert first["logger"] == captured.logger.name
    assert first["time"].endswith("Z") and first["time"][:4].isdigit()
    assert (first["request_id"], first["batch"], first["service"]) == ("r-9", 3, "glassbox")
    assert "trace_id" not in first and "color_message" not in first
    assert second["level"] == "error"
    assert "ValueError: boom" in second["exception"]


class Opaque:
    def __str__(self) -> str:
        return "opaque!"


def test_values_json_has_no_form_for_still_make_a_json_line(captured: Captured) -> None:
    captured.logger.info("odd", extra={"obj": Opaque(), "keys": {None: 1, 2: "b"}, "ratio": 0.25, "text": "ü ✓"})
    [line] = captured.lines()
    assert (line["obj"], line["keys"], line["ratio"], line["text"]) == ("opaque!", {"None": 1, "2": "b"}, 0.25, "ü ✓")
    assert "ü ✓" in captured.stream.getvalue()  # UTF-8 as is, not \\u escapes


def test_the_time_is_utc_with_microseconds(captured: Captured) -> None:
    record = captured.logger.makeRecord(captured.logger.name, logging.INFO, __file__, 1, "t", (), None)
    for created, text in [(1_700_000_000.25, "2023-11-14T22:13:20.250000Z"),
                          (1_700_000_000.999999, "2023-11-14T22:13:20.999999Z"),
                          (1_700_000_000.9999996, "2023-11-14T22:13:21.000000Z"),  # rounds up into the next second
                          (86_399.000001, "1970-01-01T23:59:59.000001Z")]:
        record.created = created
        captured.logger.handle(record)
        assert captured.lines()[-1]["time"] == text


def test_lines_inside_an_active_span_carry_its_ids(captured: Captured) -> None:
    provider = TracerProvider(shutdown_on_exit=False)  # never the global one
    with provider.get_tracer("test").start_as_current_span("work") as span:
        captured.logger.warning("inside")
    captured.logger.warning("outside")
    inside, outside = captured.lines()
    context = span.get_span_context()
    assert inside["trace_id"] == trace.format_trace_id(context.trace_id)
    assert inside["span_id"] == trace.format_span_id(context.span_id)
    assert "trace_id" not in outside and "span_id" not in outside
    provider.shutdown()


@pytest.mark.parametrize("captured", [{"log_level": "debug"}], indirect=True)
def test_the_level_comes_from_settings(captured: Captured) -> None:
    captured.logger.debug("shown")
    assert [line["message"] for line in captured.lines()] == ["shown"]
    assert level_number("trace") < logging.DEBUG
    assert level_number("WARNING") == logging.WARNING
    with pytest.raises(ValueError, match="unknown log level"):
        level_number("loud")


@pytest.mark.parametrize("captured", [{"log_format": "text"}], indirect=True)
def test_the_text_format_is_one_readable_line(captured: Captured) -> None:
    captured.logger.info("ready", extra={"request_id": "r-1", "stages": {"parse": 0.1}})
    [line] = captured.stream.getvalue().splitlines()
    assert " INFO " in line and line.endswith('ready request_id=r-1 stages={"parse":0.1}')


class TerminalStream(io.StringIO):
    """What stderr is when a person runs the server in a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stream", "shape"), [(TerminalStream(), "text"), (io.StringIO(), "json")],
                         ids=["terminal", "file-or-pipe"])
def test_auto_is_text_at_a_terminal_and_json_anywhere_else(stream: io.StringIO, shape: str) -> None:
    assert settings().log_format == "auto"  # the default
    logger = logging.getLogger(f"test.logs.auto.{shape}")
    setup = configure_logging(settings(), stream=stream, logger=logger)
    try:
        logger.info("ready", extra={"request_id": "r-1"})
    finally:
        setup.close()
    [line] = stream.getvalue().splitlines()
    if shape == "json":
        assert json.loads(line)["message"] == "ready"
    else:
        assert not line.startswith("{") and " INFO " in line and line.endswith("ready request_id=r-1")


def test_an_explicit_format_wins_over_the_terminal() -> None:
    stream = TerminalStream()
    logger = logging.getLogger("test.logs.explicit")
    setup = configure_logging(settings(log_format="json"), stream=stream, logger=logger)
    try:
        logger.info("ready")
    finally:
        setup.close()
    assert json.loads(stream.getvalue())["message"] == "ready"


def test_configure_logging_restores_the_logger_it_changed() -> None:
    logger = logging.getLogger("test.logs.restore")
    before = logging.NullHandler()
    logger.addHandler(before)
    logger.setLevel(logging.ERROR)
    setup = configure_logging(settings(log_level="debug"), stream=io.StringIO(), logger=logger)
    assert logger.handlers == [setup.handler] and logger.level == logging.DEBUG
    setup.close()
    assert logger.handlers == [before] and logger.level == logging.ERROR
    logger.removeHandler(before)


# --- the per-request line --------------------------------------------------------------------------------------------
def test_one_line_per_request_with_route_status_and_stage_durations(captured: Captured) -> None:
    ids = SpanIds("1" * 32, "2" * 16, True)
    record = request_record("req-1", batch_ids=(4,), stage_us=250)
    LogObserver(captured.logger, ids=lambda r: ids if r is record else None).on_request(record)
    [line] = captured.lines()
    assert line["message"] == "POST /v1/classify 200"
    assert (line["route"], line["status"], line["code"], line["request_id"]) == ("/v1/classify", 200, None, "req-1")
    assert (line["trace_id"], line["span_id"], line["trace_sampled"]) == ("1" * 32, "2" * 16, True)
    assert line["stages_ms"] == {stage: 0.25 for stage in STAGES}
    assert line["duration_ms"] == pytest.approx(record.duration_s * 1000, abs=0.001)
    assert (line["texts"], line["tokens"], line["batch_ids"]) == (2, 9, [4])


@contextlib.contextmanager
def only_configured_handler(logger: logging.Logger) -> Iterator[None]:
    """Take pytest's log-capture handlers off `logger` for a while, leaving configure_logging's alone, as in a
    server."""
    others = [handler for handler in logger.handlers if type(handler) is not logging.StreamHandler]
    for handler in others:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in others:
            logger.addHandler(handler)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("traced", [True, False])
@pytest.mark.parametrize("status", [200, 503])
def test_the_direct_request_line_is_the_line_logging_writes(captured: Captured, traced: bool, status: int) -> None:
    """With configure_logging's handler alone, request lines skip the LogRecord (LogObserver.on_request); a second
    handler on the way sends them through logging. Both must write the same line, time aside."""
    ids = SpanIds("1" * 32, "2" * 16, True) if traced else None
    record = request_record("req-1", status=status, batch_ids=(4, 5), stage_us=250, traceparent=traceparent())
    observer = LogObserver(captured.logger, ids=lambda r: ids)
    extra = Records()
    with only_configured_handler(captured.logger):
        assert sole_json_handler(captured.logger, logging.INFO) is not None  # nothing else on the way: direct
        observer.on_request(record)
        captured.logger.addHandler(extra)
        try:
            observer.on_request(record)  # through a LogRecord, to both handlers
        finally:
            captured.logger.removeHandler(extra)
    direct, through_logging = captured.lines()
    assert [r.getMessage() for r in extra.records] == [f"POST /v1/classify {status}"]  # the other handler saw it
    assert direct.pop("time") and through_logging.pop("time")
    assert json.dumps(direct) == json.dumps(through_logging)  # same keys, same order, same values
    assert direct["level"] == ("error" if status >= 500 else "info")


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_a_buffered_block_writes_its_lines_once_at_its_end(captured: Captured) -> None:
    """The server observes the requests answered in one turn of its loop inside one block: the same lines, in the
    same order, as written one by one, in one write when the block ends."""
    stream = CountingStream()
    [handler] = [h for h in captured.logger.handlers if type(h) is logging.StreamHandler]
    handler.setStream(stream)
    observer = LogObserver(captured.logger)
    records = [request_record(f"req-{i}") for i in range(3)]
    with only_configured_handler(captured.logger):
        with observer.buffered():
            for record in records:
                observer.on_request(record)
            assert stream.getvalue() == "" and stream.writes == 0  # held until the block ends
        assert stream.writes == 1
        observer.on_request(request_record("req-after"))  # outside a block: written at once, as before
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["req-0", "req-1", "req-2", "req-after"]
    assert stream.writes == 2
    for line in lines:
        line.pop("time")
        line.pop("request_id")
    assert all(json.dumps(line) == json.dumps(lines[-1]) for line in lines)  # the same line, ids and time aside


def test_inside_a_block_another_threads_lines_and_a_nested_block_are_not_held(captured: Captured) -> None:
    observer = LogObserver(captured.logger)
    with only_configured_handler(captured.logger):
        with observer.buffered():
            worker = threading.Thread(target=observer.on_request, args=(request_record("other-thread"),))
            worker.start()
            worker.join()
            assert [line["request_id"] for line in captured.lines()] == ["other-thread"]
            with observer.buffered():  # nested: the outer block writes
                observer.on_request(request_record("nested"))
            assert len(captured.lines()) == 1
        assert [line["request_id"] for line in captured.lines()] == ["other-thread", "nested"]


def test_a_failed_buffered_write_goes_through_logging_line_by_line(captured: Captured) -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    [handler] = [h for h in captured.logger.handlers if type(h) is logging.StreamHandler]
    handler.setStream(Broken())
    reported: list[str] = []
    handler.handleError = lambda record: reported.append(record.getMessage())  # type: ignore[method-assign]
    observer = LogObserver(captured.logger)
    with only_configured_handler(captured.logger), observer.buffered():
        observer.on_request(request_record("req-1"))
        observer.on_request(request_record("req-2", status=503))
    assert reported == ["POST /v1/classify 200", "POST /v1/classify 503"]  # logging's own error path, per line


def test_a_filter_on_the_way_sends_request_lines_through_logging(captured: Captured) -> None:
    dropped: list[str] = []

    def drop(record: logging.LogRecord) -> bool:
        dropped.append(record.getMessage())
        return False

    with only_configured_handler(captured.logger):
        captured.logger.addFilter(drop)
        try:
            LogObserver(captured.logger).on_request(request_record("req-1"))
        finally:
            captured.logger.removeFilter(drop)
    assert dropped == ["POST /v1/classify 200"] and captured.lines() == []


def test_without_tracing_the_incoming_trace_id_is_still_logged(captured: Captured) -> None:
    observer = LogObserver(captured.logger)
    observer.on_request(request_record("with", traceparent=traceparent()))
    observer.on_request(request_record("without"))
    with_parent, without = captured.lines()
    assert with_parent["trace_id"] == TRACE_ID and "span_id" not in with_parent
    assert PARENT_SPAN_ID not in json.dumps(with_parent)  # the caller's span is not ours to claim
    assert "trace_id" not in without


def test_server_errors_log_at_error_and_fallbacks_at_info(captured: Captured) -> None:
    observer = LogObserver(captured.logger)
    observer.on_request(request_record(status=503, error_code="engine_error"))
    observer.on_request(request_record(status=429, error_code="overloaded"))
    observer.on_fallback(FallbackEvent(True, "oom", "cpu"))
    observer.on_batch(batch_record(1, ("r1",)))  # debug: below this logger's level
    levels = [(line["level"], line.get("code") or line.get("reason")) for line in captured.lines()]
    assert levels == [("error", "engine_error"), ("info", "overloaded"), ("info", "oom")]


@pytest.mark.parametrize("record_text", [False, True])
def test_raw_text_is_logged_only_when_asked(captured: Captured, record_text: bool) -> None:
    LogObserver(captured.logger, record_text=record_text).on_request(
        request_record(attributes={"text": "my secret zebra", "tenant": "t1"}))
    [line] = captured.lines()
    assert line["tenant"] == "t1"
    assert ("zebra" in captured.stream.getvalue()) == record_text
    if record_text:
        assert line["text"] == "my secret zebra"


# --- end to end ------------------------------------------------------------------------------------------------------
def test_the_apps_request_lines_carry_the_ids_of_their_spans(tiny_model_dir: Path, captured: Captured) -> None:
    with memory_tracing() as mem:
        tracer = mem.tracing.observer
        observer = Fanout(tracer, LogObserver(captured.logger, ids=tracer.ids_for))
        with ready_client(create_app(app_settings(tiny_model_dir), observer=observer)) as client:
            plain = client.post("/v1/classify", json={"text": "a good zebra"})
            remote = client.post("/v1/classify", json={"texts": ["zebra", "bad"]},
                                 headers={"traceparent": traceparent(), "X-Request-Id": "mine"})
        spans = mem.spans()
    assert [plain.status_code, remote.status_code] == [200, 200]
    lines = [line for line in captured.lines() if line["logger"] == captured.logger.name and "route" in line]
    assert [line["request_id"] for line in lines] == [plain.headers["x-request-id"], "mine"]
    servers = {str((s.attributes or {})["glassbox.request_id"]): s for s in spans if s.name == "POST /v1/classify"}
    for line in lines:
        context = servers[line["request_id"]].context
        assert line["trace_id"] == trace.format_trace_id(context.trace_id)
        assert line["span_id"] == trace.format_span_id(context.span_id)
        assert set(line["stages_ms"]) == set(STAGES)
        assert line["status"] == 200
    assert lines[1]["trace_id"] == TRACE_ID
    assert "zebra" not in captured.stream.getvalue()


def test_the_log_line_and_the_server_timing_header_print_the_same_milliseconds() -> None:
    # 362_600 ns is 0.3626 ms: printed rounded in one place and truncated in the other it read 0.363 in the answer's
    # Server-Timing and 0.362 in the log line, for the same stage of the same request.
    record = request_record(start_ns=1_000_000_000)
    stages = tuple(StageSpan(s.name, s.start_ns, s.start_ns + 362_600 + i * 111) for i, s in enumerate(record.stages))
    record = dataclasses.replace(record, stages=stages, end_ns=record.start_ns + 15_179_600)
    told = dict(parse_server_timing(server_timing(record)))
    logged = LogObserver(logging.getLogger("test.logs.ms")).fields(record)
    assert told == logged["stages_ms"]
    assert float(latency_ms(record)) == logged["duration_ms"]


def test_the_apps_latency_header_is_the_duration_its_log_line_gives(tiny_model_dir: Path, captured: Captured) -> None:
    observer = LogObserver(captured.logger)
    with ready_client(create_app(app_settings(tiny_model_dir), observer=observer)) as client:
        answers = [client.post("/v1/classify", json={"text": f"good {i}"}) for i in range(8)]
    lines = {line["request_id"]: line for line in captured.lines() if "route" in line}
    for answer in answers:
        line = lines[answer.headers["x-request-id"]]
        assert float(answer.headers["x-latency-ms"]) == line["duration_ms"]
        assert dict(parse_server_timing(answer.headers["server-timing"])) == line["stages_ms"]
