"""Slow-client guard: header/body deadlines and size caps, enforced inside uvicorn's httptools protocol.

ASGI middleware only sees a request once its headers are parsed, so a client that trickles its header block (or its
body, before the app reads it) would hold a connection and a buffer for as long as it likes. This protocol subclass
watches each request from its first byte: the header block must be complete within `header_timeout_s` (for the
first request of a connection, counted from the connection opening), and the body within `body_timeout_s` of the
end of headers. Sizes are capped as bytes arrive, and a declared Content-Length over the cap is refused before any
body is read. Idleness between keep-alive requests stays uvicorn's business (`timeout_keep_alive`).

Two limits protect against clients that send quickly but read slowly. uvicorn queues pipelined requests without a
bound of its own (every running request's receive() resumes reading), so a client could park thousands of parsed
requests in memory on one connection; here reading stops while `max_pipelined` requests wait and resumes as they
are answered, leaving the backlog in the client's socket. And a connection whose answers stop draining (the
transport's write buffer stays over its high-water mark) for `send_timeout_s` is dropped.

Being the protocol, it also knows two things the app cannot see cheaply: when a client leaves (it calls the app back,
the WATCH_DISCONNECT scope extension, instead of a watcher task per request), and when an answer's header block and
body can leave in one write (service/http/one_write.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from glassbox.service.errors import HeaderTooLargeError, InvalidHttpError, PayloadTooLargeError, RequestTimeoutError
from glassbox.service.http.one_write import OneWriteAnswers
from glassbox.service.settings import Settings

AbortReason = Literal["header_timeout", "body_timeout", "header_too_large", "body_too_large", "send_timeout",
                      "invalid_http"]
ABORT_REASONS: tuple[AbortReason, ...] = (
    "header_timeout", "body_timeout", "header_too_large", "body_too_large", "send_timeout", "invalid_http",
)


# An ASGI scope extension the guard offers each request: `scope["extensions"][WATCH_DISCONNECT](callback)` calls
# `callback` once if the client leaves before the request is answered, and returns a function that stops watching,
# or None when the client has left already.
# The protocol sees the connection go; an app that waited for `http.disconnect` on receive() instead would need a task
# of its own per request (service/http/context.py: until_disconnect).
WATCH_DISCONNECT = "glassbox.watch_disconnect"
# The connection's own peer (address, port), offered as `scope["extensions"][PEER]`: uvicorn's proxy-headers middleware
# replaces `scope["client"]` with the address a trusted proxy forwarded, and the proxy's own address would be lost.
PEER = "glassbox.peer"
# Set on a request the guard cut short while the app had it (a body too slow or too large): `(status, error code)` of
# the answer the guard gave the client instead of the app's, so that the app records that answer rather than a client
# disconnect (its receive() says http.disconnect all the same).
ABORTED = "glassbox.aborted"

Phase = Literal["idle", "headers", "body"]
# Bytes handed to the parser at a time: a read can hold hundreds of small pipelined requests, and parsing stops
# between slices once the pipeline is full. One slice holds a normal request whole.
_PARSE_SLICE = 4096
log = logging.getLogger("glassbox.http")


@dataclass(frozen=True, slots=True)
class GuardLimits:
    header_timeout_s: float = 5.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 16384
    max_body_bytes: int = 4 * 1024 * 1024
    # After an error reply the write side is shut and the rest of the request is read and dropped for this long,
    # so the client sees our reply instead of a reset caused by unread bytes.
    linger_s: float = 1.0
    max_pipelined: int = 16  # parsed requests allowed to wait behind the running one on a connection
    send_timeout_s: float = 30.0  # longest the client may leave our answers undrained

    @classmethod
    def from_settings(cls, settings: Settings) -> GuardLimits:
        return cls(settings.header_timeout_s, settings.body_timeout_s, settings.max_header_bytes,
                   settings.max_body_bytes)


def reply_for(reason: AbortReason, limits: GuardLimits) -> tuple[int, str, str]:
    """(status, stable error code, message) of the answer to an aborted request; the message names the limit and the
    flag that sets it, so a client (or its operator) knows what to change."""
    replies: dict[AbortReason, tuple[int, str, str]] = {
        "header_timeout": (408, RequestTimeoutError.code, f"the request headers did not arrive within "
                                                          f"{limits.header_timeout_s:g} s (--header-timeout-s)"),
        "body_timeout": (408, RequestTimeoutError.code, f"the request body did not arrive within "
                                                        f"{limits.body_timeout_s:g} s (--body-timeout-s)"),
        "header_too_large": (431, HeaderTooLargeError.code, f"the request header block is larger than the limit of "
                                                            f"{limits.max_header_bytes} bytes (--max-header-bytes)"),
        "body_too_large": (413, PayloadTooLargeError.code, f"the request body is larger than the limit of "
                                                           f"{limits.max_body_bytes} bytes (--max-body-bytes)"),
        # Never sent: a response is already on the wire when answers stop draining, so the connection is dropped.
        "send_timeout": (408, RequestTimeoutError.code, "the client stopped reading its answers"),
        "invalid_http": (400, InvalidHttpError.code, "the request is not valid HTTP/1.1 and could not be parsed (a bad "
                                                     "request line, header, Content-Length or chunked framing)"),
    }
    return replies[reason]


def error_reply(status: int, code: str, message: str, default_headers: list[tuple[bytes, bytes]],
                kserve: bool = False) -> bytes:
    """A whole error response, written by the protocol itself. `kserve`: the request was for a /v2 route, whose
    clients read the Open Inference Protocol's `{"error": "message"}`."""
    body = json.dumps({"error": message} if kserve else {"error": {"code": code, "message": message}}).encode()
    head = [STATUS_LINE[status]]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
    return b"".join([*head, b"\r\n", body])


@dataclass(frozen=True, slots=True)
class _Binding:
    limits: GuardLimits
    on_abort: Callable[[str], None]


class _HoldableFlow(FlowControl):
    """uvicorn's flow control with a hold: while held, resume_reading() (which every running request's receive()
    calls) leaves reading paused."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__(transport)
        self.held = False

    def hold(self) -> None:
        self.held = True
        self.pause_reading()

    def release(self) -> None:
        self.held = False
        self.resume_reading()

    def resume_reading(self) -> None:
        if not self.held:
            super().resume_reading()


# uvicorn's WARNING for bytes its parser refuses (HttpToolsProtocol.data_received), logged before it calls
# send_400_response. The guard answers each such request, counts it (glassbox_http_aborted_total, reason
# "invalid_http") and logs it at info, so uvicorn's line said it again, as a warning, once per connection of any
# client speaking something else to the port (a TLS health check, a scanner).
PARSER_REFUSED = "Invalid HTTP request received."


class _ParserRefusalsAnswered(logging.LoggerAdapter):  # type: ignore[type-arg]
    """uvicorn's "uvicorn.error" logger, for one connection, less the PARSER_REFUSED warning; everything else passes."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, None)
        self._logger = logger

    @property
    def level(self) -> int:  # uvicorn reads it to skip building trace lines
        return self._logger.level

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg != PARSER_REFUSED:
            self.logger.warning(msg, *args, **kwargs)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One instance per connection, like its parent. `guard` is bound by `guarded_protocol`."""

    guard: ClassVar[_Binding]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.logger = _ParserRefusalsAnswered(self.logger)  # type: ignore[assignment]
        self._phase: Phase = "idle"
        self._serial = 0  # messages begun on this connection
        self._raw_header_bytes = 0
        self._parsed_header_bytes = 0
        self._body_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._stash = b""  # bytes read but not parsed while the pipeline is full
        self._kserve = False  # the current request is for a /v2 route: errors in the protocol's shape
        self._aborted = False
        self._close_after_request = False
        self._last_reply = b""  # an error reply that waits for the answers still owed on this connection
        self._running: RequestResponseCycle | None = None  # the request whose app runs now (uvicorn runs one at a time)
        self._watchers: dict[RequestResponseCycle, Callable[[], None]] = {}  # WATCH_DISCONNECT callbacks, by request

    # --- connection events -----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = self._held_flow = _HoldableFlow(transport)
        self._answers = OneWriteAnswers(transport)
        self._header_timer = self.loop.call_later(self.guard.limits.header_timeout_s, self._header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn marks only the last request parsed as disconnected; with requests pipelined that one is still queued,
        # and the running one would write its answer to the closed transport (a RuntimeError, then a 500 counted
        # against the availability SLO for a client that simply left). Every request owed an answer learns it now.
        for cycle in (self._running, *(queued for queued, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                self._disconnect(cycle)
        self._watchers.clear()
        for timer in (self._header_timer, self._body_timer, self._linger_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._linger_timer = self._send_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.guard.limits.send_timeout_s, self._send_deadline)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def on_response_complete(self) -> None:
        self._answers.flush()  # a HEAD answer's header block has no body to ride with
        queued = bool(self.pipeline)  # uvicorn answers one request at a time: this starts the next one, if any
        upcoming = self.pipeline[-1][0] if queued else None  # uvicorn queues with appendleft and starts with pop
        super().on_response_complete()
        if upcoming is not None and not any(cycle is upcoming for cycle, _ in self.pipeline):
            self._running = upcoming
        if self._last_reply and not queued and not self.transport.is_closing():  # every answer owed is out
            reply, self._last_reply = self._last_reply, b""
            self._reply_and_close(reply)
            return
        if self._held_flow.held and len(self.pipeline) < self.guard.limits.max_pipelined:
            self._held_flow.release()
            stash, self._stash = self._stash, b""
            if stash and not self.transport.is_closing():
                self.data_received(stash)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refuses, as the guard's own JSON 400 (uvicorn's is plain text), counted
        as an abort. Inside a request's body, that request is the bad one: answered at once if nothing is owed ahead
        of it. Between requests, the requests before it are answered first."""
        cycle = self.cycle
        inside = cycle is not None and not cycle.response_complete and cycle.more_body
        self._abort("invalid_http", cycle if inside else None)

    def _unqueue(self, cycle: RequestResponseCycle) -> bool:
        """Take `cycle` out of the pipeline if it waits there (it will never run); whether it did."""
        kept = [entry for entry in self.pipeline if entry[0] is not cycle]
        if len(kept) == len(self.pipeline):
            return False
        self.pipeline.clear()
        self.pipeline.extend(kept)
        return True

    def _reply_and_close(self, reply: bytes) -> None:
        self._answers.flush()
        self.transport.write(reply)
        if self.transport.can_write_eof():  # let the client read the reply before the close resets the connection
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(self.guard.limits.linger_s, self.transport.close)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        """Parse `data` a slice at a time, so that once `max_pipelined` requests wait, the rest of what one read
        brought stays raw bytes (at most one read's worth, since reading is paused) instead of parsed requests."""
        if self._aborted:
            return  # lingering after an error reply: drop the rest
        if self._held_flow.held:
            self._stash += data
            return
        for start in range(0, len(data), _PARSE_SLICE):
            if self._aborted:
                return
            if self._held_flow.held:
                self._stash += data[start:]
                return
            self._parse(data[start:start + _PARSE_SLICE])

    def _parse(self, data: bytes) -> None:
        phase, serial = self._phase, self._serial
        super().data_received(data)
        if self._aborted or self._phase != "headers":
            return
        # Every byte of this chunk belongs to the header block when the block was open (or about to open) before it
        # and is still open after it; this catches a huge line trickled in before httptools reports any header.
        same_block = (phase == "headers" and self._serial == serial) or (phase == "idle" and self._serial == serial + 1)
        if same_block:
            self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self.guard.limits.max_header_bytes:
                self._abort("header_too_large", None)

    # --- parser callbacks --------------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = "headers"
        self._serial += 1
        self._raw_header_bytes = self._parsed_header_bytes = self._body_bytes = 0
        self._kserve = False
        if self._header_timer is None:  # the first request's deadline already runs from connection_made
            self._header_timer = self.loop.call_later(self.guard.limits.header_timeout_s, self._header_deadline)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._kserve = self.url == b"/v2" or self.url.startswith((b"/v2/", b"/v2?"))
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._count_header_bytes(len(name) + len(value) + 4)  # ": " and CRLF

    def on_headers_complete(self) -> None:
        if self._aborted:
            return
        self._phase = "body"
        self._cancel_header_timer()
        declared, chunked = self._declared_body()
        if declared is not None and declared > self.guard.limits.max_body_bytes:
            self._abort("body_too_large", None)  # before the app runs and before any body is read
            return
        queued = len(self.pipeline)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None:
            cycle.transport = self._answers  # type: ignore[assignment]  # its header block and body in one write
            scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
            extensions = scope.setdefault("extensions", {})
            extensions[WATCH_DISCONNECT] = functools.partial(self._watch, cycle)
            extensions[PEER] = scope.get("client")  # before the app (and the proxy-headers middleware) runs
        if len(self.pipeline) == queued:  # not queued behind another: its app started now
            self._running = cycle
        if len(self.pipeline) >= self.guard.limits.max_pipelined:
            self._held_flow.hold()  # the rest of the client's pipeline waits in its socket, not in our memory
        if self._close_after_request and self.cycle is not None:
            self.cycle.keep_alive = False
        if chunked or (declared or 0) > 0:
            self._body_timer = self.loop.call_later(self.guard.limits.body_timeout_s, self._body_deadline)

    def on_body(self, body: bytes) -> None:
        if self._aborted:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self.guard.limits.max_body_bytes:
            self._abort("body_too_large", self.cycle)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._aborted:
            return
        self._phase = "idle"
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def shutdown(self) -> None:
        """Graceful shutdown. uvicorn closes every connection without a running request; two of those are requests
        in transit, so they are served (with Connection: close) within their header deadline instead: a request whose
        header block has begun, and a fresh connection whose first request has not arrived yet. Idle keep-alive
        connections still close at once."""
        fresh = self._phase == "idle" and self._serial == 0
        if (self._phase == "headers" or fresh) and not self._aborted:
            self._close_after_request = True
            return
        super().shutdown()

    # --- disconnects ------------------------------------------------------------------------------------------------
    def _watch(self, cycle: RequestResponseCycle, callback: Callable[[], None]) -> Callable[[], object] | None:
        """WATCH_DISCONNECT for `cycle`'s request. None when the client has already left: the caller is told instead
        of called back (a callback that cancels the caller before it suspends would leave the cancellation pending
        for whatever it awaits next)."""
        if cycle.disconnected:
            return None
        self._watchers[cycle] = callback
        self.flow.resume_reading()  # as a receive() waiting for the disconnect would: a close is seen only by reading
        return functools.partial(self._watchers.pop, cycle, None)

    def _disconnect(self, cycle: RequestResponseCycle) -> None:
        cycle.disconnected = True
        cycle.message_event.set()
        callback = self._watchers.pop(cycle, None)
        if callback is not None:
            try:
                callback()
            except Exception:  # one app's callback must not stop the others from learning it
                log.exception("disconnect callback failed")

    # --- enforcement -------------------------------------------------------------------------------------------------
    def _count_header_bytes(self, n: int) -> None:
        self._parsed_header_bytes += n
        if not self._aborted and self._parsed_header_bytes > self.guard.limits.max_header_bytes:
            self._abort("header_too_large", None)

    def _declared_body(self) -> tuple[int | None, bool]:
        declared: int | None = None
        chunked = False
        for name, value in self.headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None  # httptools rejects malformed lengths itself
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        return declared, chunked

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.flow.read_paused:  # we stopped reading (pipelined request queued), not the client: wait again
            self._header_timer = self.loop.call_later(self.guard.limits.header_timeout_s, self._header_deadline)
            return
        self._abort("header_timeout", None)

    def _body_deadline(self) -> None:
        self._body_timer = None
        if self.flow.read_paused:  # the app has not consumed what it has, so the client is not the slow side
            self._body_timer = self.loop.call_later(self.guard.limits.body_timeout_s, self._body_deadline)
            return
        self._abort("body_timeout", self.cycle)

    def _send_deadline(self) -> None:
        self._send_timer = None
        self._abort("send_timeout", self.cycle)

    def _abort(self, reason: AbortReason, cycle: RequestResponseCycle | None) -> None:
        """Report, answer if no response is on the wire yet (else just close), and stop reading this connection.

        `cycle` is the aborted request's own cycle, or None when the app never saw it."""
        if reason != "send_timeout" and (self._aborted or self.transport.is_closing()):
            return  # a client that stops reading is dropped even after a close, which waits for its answers to drain
        self._aborted = True
        self._cancel_header_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        try:
            self.guard.on_abort(reason)
        except Exception:  # an observer bug must not keep a bad connection open
            log.exception("on_abort callback failed")
        if reason == "send_timeout":
            self._answers.discard()
            self.transport.abort()  # close() would wait for the undrained answers forever
            return
        # The bad request is answered after the requests ahead of it (a valid request pipelined before a bad one still
        # gets its answer), at once when none is owed, or not at all when its own answer already started.
        status, code, message = reply_for(reason, self.guard.limits)
        if cycle is not None:
            later = self._unqueue(cycle)  # still waiting behind another: it never runs
            may_reply = later or not cycle.response_started
            if may_reply:  # what the app records for it: this answer, not a client that left
                scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
                scope.setdefault("extensions", {})[ABORTED] = (status, code)
            self._disconnect(cycle)  # the app's receive() now says http.disconnect and its sends are dropped
        else:
            later = self.cycle is not None and not self.cycle.response_complete  # refused before it became a request
            may_reply = True
        if not may_reply:
            self._answers.close()
            return
        reply = error_reply(status, code, message, self.server_state.default_headers, self._kserve)
        if later:
            self._last_reply = reply
        else:
            self._reply_and_close(reply)


def guarded_protocol(limits: GuardLimits, on_abort: Callable[[str], None]) -> type[asyncio.Protocol]:
    """A protocol class for `uvicorn.Config(http=...)`, bound to these limits and this abort callback."""
    return type("BoundGuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": _Binding(limits, on_abort)})
