"""The attack itself: one task per connection slot, each holding a raw socket open as slowly as its mode asks.

A slot opens its connection at its place in the ramp, sends (and in reader mode reads) at the configured pace until
the server cuts it, records how and after how long, and opens a new one while the attack lasts. At the end (duration,
`stop`, or every slot finished) every slot is cancelled and every socket is closed before the report is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

from glassbox.chaos.slowclients.config import SlowClientConfig, SockAddr, resolve_target
from glassbox.chaos.slowclients.report import Cut, SlowClientReport, Tally
from glassbox.chaos.slowclients.wire import (
    ByteStream,
    ResponseScanner,
    body_request_head,
    endless_header_block,
    padded_body,
    pipelined_request,
)

MIN_STEP_S = 0.05  # pace in steps of at least this long: a syscall per byte helps no one at 10 kB/s
CONNECT_RETRY_S = 0.25  # after a failed connect, so a refused port is not hammered in a tight loop
FAST_READ_BYTES = 65536


class _Pacer:
    """Holds one direction of one connection to `bytes_per_s` on average, measured from its first move."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.chunk = max(1, round(bytes_per_s * max(MIN_STEP_S, 1.0 / bytes_per_s)))
        self._start: float | None = None
        self._moved = 0

    async def moved(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        self._moved += n
        delay = self._start + self._moved / self.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    opened_at: float
    cut: Cut | None = None
    sent_requests: int = 0  # reader mode
    scanner: ResponseScanner = field(default_factory=ResponseScanner)
    room: asyncio.Event = field(default_factory=asyncio.Event)  # reader mode: an answer finished, the pipeline moved


class _Attack:
    def __init__(self, config: SlowClientConfig, family: socket.AddressFamily, address: SockAddr,
                 tally: Tally) -> None:
        self.config = config
        self.family = family
        self.address = address
        self.tally = tally

    # --- one slot: connect, hold until cut, again --------------------------------------------------------------------
    async def slot(self, index: int) -> None:
        config = self.config
        await asyncio.sleep(config.ramp_s * index / config.connections)
        was_cut = False
        while True:
            try:
                reader, writer, opened_at = await self._open()
            except OSError as exc:  # TimeoutError included
                self.tally.errors[_connect_error(exc)] += 1
                if not config.reconnect:
                    return
                await asyncio.sleep(max(config.reconnect_delay_s, CONNECT_RETRY_S))
                continue
            self.tally.opened += 1
            self.tally.reconnects += int(was_cut)
            await self._hold(reader, writer, opened_at)
            was_cut = True
            if not config.reconnect:
                return
            await asyncio.sleep(config.reconnect_delay_s)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, float]:
        loop = asyncio.get_running_loop()
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        limit = FAST_READ_BYTES
        try:
            if self.config.mode == "reader":
                # Before connect, so the window the kernel advertises is small from the handshake on.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.recv_buffer_bytes)
                limit = max(1024, _Pacer(self.config.bytes_per_s).chunk)  # the stream stops reading at 2 * limit
            sock.setblocking(False)
            # Timed from before the connect: the server's clock for this connection cannot start earlier, so however
            # late this loop gets back to us, a hold is never reported shorter than the server kept the connection.
            connecting_at = loop.time()
            async with asyncio.timeout(self.config.connect_timeout_s):
                await loop.sock_connect(sock, self.address)
            reader, writer = await asyncio.open_connection(sock=sock, limit=limit)
            return reader, writer, connecting_at
        except BaseException:
            sock.close()
            raise

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opened_at: float) -> None:
        conn = _Connection(reader, writer, opened_at)
        if self.config.mode == "reader":
            sender, watcher = self._send_pipelined(conn), self._read_slowly(conn)
        else:
            sender = self._send_header_block(conn) if self.config.mode == "headers" else self._send_body(conn)
            watcher = self._await_answer(conn)
        send_task, watch_task = asyncio.create_task(sender), asyncio.create_task(watcher)
        try:
            done, _ = await asyncio.wait({send_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
            failed = send_task.exception() if send_task in done else None
            if failed is not None:
                raise failed  # a bug in the sender: a broken socket ends it quietly
            await watch_task
        except asyncio.CancelledError:
            if conn.cut is None:
                self.tally.still_open_at_end += 1
            raise
        finally:
            send_task.cancel()
            watch_task.cancel()
            await asyncio.gather(send_task, watch_task, return_exceptions=True)
            await _close(writer)

    def _cut(self, conn: _Connection, how: Cut) -> None:
        conn.cut = how
        self.tally.cut(how, asyncio.get_running_loop().time() - conn.opened_at)

    def _scan(self, conn: _Connection, data: bytes) -> None:
        self.tally.bytes_received += len(data)
        seen = len(conn.scanner.statuses)
        conn.scanner.feed(data)
        for status in conn.scanner.statuses[seen:]:
            self.tally.statuses[status] += 1

    # --- senders: they stop quietly when the socket breaks; the watcher tells how the server ended it ---------------
    async def _trickle(self, conn: _Connection, stream: ByteStream) -> None:
        pacer = _Pacer(self.config.bytes_per_s)
        while not stream.done:
            chunk = stream.take(pacer.chunk)
            if not chunk:
                return
            conn.writer.write(chunk)
            await conn.writer.drain()
            self.tally.bytes_sent += len(chunk)
            await pacer.moved(len(chunk))

    async def _send_header_block(self, conn: _Connection) -> None:
        with contextlib.suppress(OSError):
            await self._trickle(conn, endless_header_block(self.config))

    async def _send_body(self, conn: _Connection) -> None:
        head = body_request_head(self.config)
        with contextlib.suppress(OSError):
            conn.writer.write(head)
            await conn.writer.drain()
            self.tally.bytes_sent += len(head)
            await self._trickle(conn, padded_body(self.config.declared_body_bytes))

    async def _send_pipelined(self, conn: _Connection) -> None:
        request = pipelined_request(self.config)
        with contextlib.suppress(OSError):
            while True:
                scanner = conn.scanner
                while conn.sent_requests - scanner.completed >= self.config.pipeline_depth and not scanner.lost_framing:
                    conn.room.clear()
                    await conn.room.wait()
                conn.writer.write(request)
                await conn.writer.drain()  # blocks once the server stops reading: it has enough queued already
                self.tally.bytes_sent += len(request)
                conn.sent_requests += 1

    # --- watchers -----------------------------------------------------------------------------------------------------
    async def _await_answer(self, conn: _Connection) -> None:
        """Headers and body modes: read at full speed; the first status line, a close or a reset ends the attempt."""
        try:
            while not conn.scanner.statuses:
                data = await conn.reader.read(FAST_READ_BYTES)
                if not data:
                    break
                self._scan(conn, data)
        except OSError:
            self._cut(conn, "answered" if conn.scanner.statuses else "reset")
            return
        self._cut(conn, "answered" if conn.scanner.statuses else "eof")

    async def _read_slowly(self, conn: _Connection) -> None:
        """Reader mode: answers are expected; only a close or a reset ends the connection."""
        pacer = _Pacer(self.config.bytes_per_s)
        try:
            while True:
                data = await conn.reader.read(pacer.chunk)
                if not data:
                    self._cut(conn, "eof")
                    return
                self._scan(conn, data)
                conn.room.set()
                await pacer.moved(len(data))
        except OSError:
            self._cut(conn, "reset")


async def _close(writer: asyncio.StreamWriter) -> None:
    # A plain close waits to flush what is buffered, which a server that stopped reading never takes: abort instead.
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()
    else:
        writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _connect_error(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "connect_timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connect_refused"
    return "connect_other"


async def run_slow_clients(config: SlowClientConfig, stop: asyncio.Event | None = None) -> SlowClientReport:
    """Run the attack until `config.duration_s` has passed, `stop` is set, or every slot is done (no reconnects).

    Raises ValueError (RemoteTargetError) before connecting when the target is not allowed or does not resolve."""
    family, address = await resolve_target(config)
    loop = asyncio.get_running_loop()
    tally = Tally()
    attack = _Attack(config, family, address, tally)
    started = loop.time()
    slots = {asyncio.create_task(attack.slot(i), name=f"slow-client-{i}") for i in range(config.connections)}
    stopped = asyncio.create_task(stop.wait()) if stop is not None else None
    try:
        waiting: set[asyncio.Task[object]] = {*slots, *([stopped] if stopped else [])}
        while waiting and (remaining := started + config.duration_s - loop.time()) > 0:
            done, waiting = await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if stopped in done or any(task.exception() for task in done if task is not stopped):
                break
            if waiting <= ({stopped} if stopped else set()):
                break  # every slot finished by itself
    finally:
        for task in slots:
            task.cancel()
        if stopped is not None:
            stopped.cancel()
        outcomes = await asyncio.gather(*slots, return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)]
    if failures:
        raise failures[0]
    return tally.report(config, loop.time() - started)
