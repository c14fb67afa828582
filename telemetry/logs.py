"""Logs: a JSON-lines formatter (and a plain-text one), their setup from Settings, and a log line per request (the
notable ones by default).

Every JSON line has `time`, `level`, `logger` and `message`; `trace_id`, `span_id` and `request_id` when known
(given as `extra=` fields, or taken from the active OpenTelemetry span); any other `extra=` field as is.
Raw request text is never logged unless `record_text` is on.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import operator
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import IO, Any, NamedTuple

import msgspec
from opentelemetry import trace

from glassbox.service.observer import BatchRecord, FallbackEvent, RequestRecord, milliseconds
from glassbox.service.settings import LogRequests, Settings
from glassbox.service.startup import resolved_format
from glassbox.telemetry.tracing import TEXT_KEY, SpanIds, remote_parent
from glassbox.telemetry.turns import TurnHold

TRACE_LEVEL = 5  # uvicorn's "trace", below DEBUG
ID_FIELDS = ("trace_id", "span_id", "request_id")
REQUEST_LOGGER = "glassbox.request"
# Attributes every LogRecord has; anything else on a record came from `extra=`. uvicorn adds an ANSI-coloured
# copy of its message as `color_message`, which has no place in a log line.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}


def level_number(name: str) -> int:
    """`info`, `DEBUG`, `trace`, ... -> the logging level number; ValueError for an unknown name."""
    if name.strip().lower() == "trace":
        return TRACE_LEVEL
    number = logging.getLevelName(name.strip().upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {name!r}")
    return number


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _RESERVED and not key.startswith("_")}


def _active_span_ids() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": trace.format_trace_id(context.trace_id), "span_id": trace.format_span_id(context.span_id)}


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def __init__(self, service: str = "", process: str = "") -> None:
        super().__init__()
        self._service = service
        self._process = process  # which process of a multi-process server wrote the line: "engine", "worker-2"
        # msgspec's encoder is ~7x faster than json.dumps on a request line. A value (or dict key) JSON has no
        # form for becomes its str(); sets become lists, bytes base64.
        self._encode = msgspec.json.Encoder(enc_hook=str).encode
        self._second: tuple[int, str] = (-1, "")  # one tuple, swapped whole: threads never see half an update

    def format(self, record: logging.LogRecord) -> str:
        line = self._line(record.created, record.levelname.lower(), record.name, record.getMessage(), _extras(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return self._encode(line).decode()

    def format_fields(self, created: float, level: str, logger: str, message: str, fields: dict[str, Any]) -> str:
        """The line `format` would give a record with these attributes and `fields` as its `extra=`, without the
        record (see LogObserver.on_request)."""
        return self._encode(self._line(created, level, logger, message, fields)).decode()

    def _line(self, created: float, level: str, logger: str, message: str, extras: dict[str, Any]) -> dict[str, Any]:
        line: dict[str, Any] = {"time": self._time(created), "level": level, "logger": logger, "message": message}
        if self._service:
            line["service"] = self._service
        if self._process:
            line["process"] = self._process
        if "trace_id" not in extras:
            line.update(_active_span_ids())
        for key in ID_FIELDS:  # ids first, so a reader finds them in the same place on every line
            if extras.get(key):
                line[key] = extras[key]
        for key, value in extras.items():
            line.setdefault(key, value)
        return line

    def _time(self, created: float) -> str:
        """ISO 8601 UTC with microseconds; the date and time of day are formatted once per second."""
        second, micros = divmod(round(created * 1e6), 1_000_000)  # rounded as datetime does, carry included
        cached, text = self._second
        if second != cached:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return f"{text}.{micros:06d}Z"


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`, for a human at a terminal."""

    def __init__(self, process: str = "") -> None:
        where = f" [{process}]" if process else ""
        super().__init__(f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = {**_active_span_ids(), **_extras(record)}
        pairs = " ".join(f"{key}={_compact(value)}" for key, value in fields.items() if value is not None)
        return f"{text} {pairs}" if pairs else text


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))


class LogSetup:
    """What configure_logging changed, so that close() can put it back (tests; a second configuration)."""

    def __init__(self, logger: logging.Logger, handler: logging.Handler) -> None:
        self.logger = logger
        self.handler = handler
        self._previous_level = logger.level
        self._previous_handlers = list(logger.handlers)

    def install(self, level: int) -> None:
        for old in self._previous_handlers:
            self.logger.removeHandler(old)
        self.logger.addHandler(self.handler)
        self.logger.setLevel(level)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()
        for old in self._previous_handlers:
            self.logger.addHandler(old)
        self.logger.setLevel(self._previous_level)


def configure_logging(settings: Settings, *, stream: IO[str] | None = None,
                      logger: logging.Logger | None = None, process: str = "") -> LogSetup:
    """Send `logger` (default: the root, so uvicorn's lines come too) to `stream` (default stderr) in
    `settings.log_format`, at `settings.log_level`, replacing the handlers it had. `process` names this process in
    every line when the server runs as several ("engine", "worker-0", "supervisor")."""
    target = logger if logger is not None else logging.getLogger()
    target_stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(target_stream)
    formatter: logging.Formatter = (JsonFormatter(settings.service_name, process)
                                    if resolved_format(settings.log_format, target_stream) == "json"
                                    else TextFormatter(process))
    handler.setFormatter(formatter)
    setup = LogSetup(target, handler)
    setup.install(level_number(settings.log_level))
    return setup


def sole_json_handler(log: logging.Logger, level: int) -> logging.StreamHandler[Any] | None:
    """The handler a `level` line of `log` goes to when it is the only one, a plain StreamHandler with the JSON
    formatter (what configure_logging installs), and no filter anywhere on the way could drop or change the line;
    None otherwise (another handler, a filter, a text format, pytest's capture: the line then goes through logging as
    usual)."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = log
    while current is not None:
        if current.filters:
            return None
        found.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    if len(found) != 1:
        return None
    handler = found[0]
    if (type(handler) is not logging.StreamHandler or handler.filters or level < handler.level
            or not isinstance(handler.formatter, JsonFormatter)):
        return None
    return handler


class _Line(NamedTuple):
    """A request's line, formatted and waiting for the end of a buffered block, with what logging needs to write it
    its own way if the direct write fails."""

    text: str
    handler: logging.StreamHandler[Any]
    level: int
    record: RequestRecord
    fields: dict[str, Any]


def _write_direct(handler: logging.StreamHandler[Any], name: str, level: int, record: RequestRecord,
                  fields: dict[str, Any], pending: list[_Line] | None = None) -> bool:
    """Write a request's line straight to the handler's stream, under its lock: the same bytes `format` gives, with
    no LogRecord (its ~30 attributes, then the formatter picking the `extra=` fields back out of them): 36.7 -> 19.3
    us a line warm, and lower CPU per request in the live server
    (docs/benchmarks/2026-12-02-log-line-without-logrecord.md). With `pending`, the line is added to it instead, for
    LogObserver.buffered to write. False when writing failed, so the caller goes through logging, which reports the
    error its way."""
    formatter = handler.formatter
    assert isinstance(formatter, JsonFormatter)
    try:
        text = formatter.format_fields(time.time(), "error" if level >= logging.ERROR else "info", name,
                                       f"{record.method} {record.route} {record.status}", fields)
        if pending is not None:
            pending.append(_Line(text + handler.terminator, handler, level, record, fields))
            return True
        with handler.lock or contextlib.nullcontext():
            handler.stream.write(text + handler.terminator)
            handler.flush()
    except Exception:
        return False
    return True


class LogObserver:
    """Implements glassbox.service.observer.Observer: one line per request (INFO; ERROR for 5xx; which ones:
    `requests`), fallbacks and aborts.

    `ids` gives the request's server span ids (TracingObserver.ids_for, when tracing is on and runs first);
    without it, a valid incoming traceparent still gives the trace id.

    `requests`: which requests get a line. "notable" (the server's default) writes one for a 5xx, a 4xx other than
    429 (a client's mistake is worth its line; an overload's refusals are counted, not listed), an answer slower than
    `slow_s`, and a request whose trace is kept (a sampled parent, the ratio, or a 429 within the refusal budget), so
    a line is there for every request someone will look up; "all" writes every request's; "none" none."""

    def __init__(self, logger: logging.Logger | None = None, *, record_text: bool = False,
                 ids: Callable[[RequestRecord], SpanIds | None] | None = None, requests: LogRequests = "all",
                 slow_s: float = 0.25) -> None:
        self._log = logger if logger is not None else logging.getLogger(REQUEST_LOGGER)
        self._record_text = record_text
        self._ids = ids
        self._requests = requests
        self._slow_ns = int(slow_s * 1e9)
        # The lines of an open `buffered` block (only those of the thread that opened it wait).
        self._turn: TurnHold[list[_Line]] = TurnHold(list, self._write_lines)

    def notable(self, record: RequestRecord) -> bool:
        status = record.status
        if status >= 500 or (400 <= status != 429):
            return True
        if record.end_ns - record.start_ns > self._slow_ns:
            return True
        ids = self._ids(record) if self._ids is not None else None
        return ids is not None and ids.sampled

    def on_request(self, record: RequestRecord) -> None:
        if self._requests != "all" and (self._requests == "none" or not self.notable(record)):
            return
        level = logging.ERROR if record.status >= 500 else logging.INFO
        log = self._log
        if not log.isEnabledFor(level):
            return
        fields = self.fields(record)
        direct = sole_json_handler(log, level)
        pending = self._turn.current()
        if direct is not None and _write_direct(direct, log.name, level, record, fields, pending):
            return
        self._through_logging(level, record, fields)

    def buffered(self) -> AbstractContextManager[None]:
        """Request lines written on this thread inside the block leave in one write when it ends (the server opens
        one for the requests answered in one turn of its event loop, usually one engine batch's): a write and a
        flush, each a system call, per turn instead of per line. Lines that go through logging (another handler, a
        filter) are not held. A block opened inside another changes nothing."""
        return self._turn.block()

    def _write_lines(self, lines: list[_Line]) -> None:
        # One write per run of lines for the same handler (nearly always: all of them).
        for handler, group in itertools.groupby(lines, key=operator.attrgetter("handler")):
            run = list(group)
            try:
                with handler.lock or contextlib.nullcontext():
                    handler.stream.write("".join(line.text for line in run))
                    handler.flush()
            except Exception:  # logging reports the failure its way, once per line as unbuffered writes would
                for line in run:
                    self._through_logging(line.level, line.record, line.fields)

    def _through_logging(self, level: int, record: RequestRecord, fields: dict[str, Any]) -> None:
        # makeRecord + handle is what Logger.log does, less the walk up the stack for the caller's file and line:
        # the caller is always this observer.
        log = self._log
        log.handle(log.makeRecord(log.name, level, __file__, 0, "%s %s %d",
                                  (record.method, record.route, record.status), None, "on_request", fields))

    def fields(self, record: RequestRecord) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "request_id": record.request_id,
            "method": record.method,
            "route": record.route,
            "status": record.status,
            "code": record.error_code,
            # The same milliseconds the answer's X-Latency-ms and Server-Timing headers say.
            "duration_ms": milliseconds(record.end_ns - record.start_ns),
            "stages_ms": {stage.name: milliseconds(stage.end_ns - stage.start_ns) for stage in record.stages},
            "texts": record.texts,
            "tokens": record.tokens,
            "max_tokens": record.max_tokens,
            "truncated": record.truncated,
            "device": record.device or None,
            "engine_mode": record.engine_mode or None,
            "batch_ids": list(record.batch_ids),
        }
        fields.update(self._trace_fields(record))
        for key, value in record.attributes.items():
            if key != TEXT_KEY:
                fields.setdefault(key, value)
            elif self._record_text:
                fields["text"] = value
        return fields

    def _trace_fields(self, record: RequestRecord) -> dict[str, Any]:
        ids = self._ids(record) if self._ids is not None else None
        if ids is not None:
            return {"trace_id": ids.trace_id, "span_id": ids.span_id, "trace_sampled": ids.sampled}
        remote = trace.get_current_span(remote_parent(record.traceparent)).get_span_context()
        if remote.is_valid:  # the caller's trace: our own span was not made, so there is no span_id of ours
            return {"trace_id": trace.format_trace_id(remote.trace_id)}
        return {}

    def on_batch(self, record: BatchRecord) -> None:
        if not self._log.isEnabledFor(logging.DEBUG):
            return
        timing = record.timing
        self._log.debug("engine batch %d", record.batch_id, extra={
            "batch_id": record.batch_id, "device": timing.device, "engine_mode": timing.mode,
            "bucket": str(timing.bucket) if timing.bucket is not None else None, "rows": timing.rows,
            "tokens": timing.real_tokens, "padded_tokens": timing.padded_tokens,
            "duration_ms": round(timing.duration_s * 1000, 3), "requests": len(record.request_ids),
            "queue_depth_after": record.queue_depth_after,
        })

    def on_rejected(self, reason: str) -> None:
        pass  # the refused request gets its own line, with its 429, from on_request

    def on_dropped(self, reason: str, items: int) -> None:
        self._log.info("dropped %d queued item(s): %s", items, reason, extra={"reason": reason, "items": items})

    def on_aborted(self, reason: str) -> None:
        self._log.info("connection aborted: %s", reason, extra={"reason": reason})

    def on_fallback(self, event: FallbackEvent) -> None:
        # INFO: the engine itself logs the one WARNING per transition, with the error text and the cooldown.
        level = logging.INFO
        what = "serving from the fallback" if event.active else "serving from the primary again"
        self._log.log(level, "%s on %s (%s)", what, event.device, event.reason,
                      extra={"reason": event.reason, "device": event.device, "fallback_active": event.active})
