"""Raw-socket HTTP/1.1 clients for the guard tests: exact bytes, exact pacing, nothing a library would smooth over."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

READ_LIMIT_S = 5.0  # the most any test waits for the server to answer or close


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    rest: bytes  # whatever came after the first response, up to EOF

    def json(self) -> Any:
        return json.loads(self.body)


def parse_reply(raw: bytes) -> Reply:
    head, sep, tail = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {raw[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    return Reply(status, headers, tail[:length], tail[length:])


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes; fails the test if it neither answers nor closes in time."""
    return await asyncio.wait_for(reader.read(), READ_LIMIT_S)


async def read_one(reader: asyncio.StreamReader) -> Reply:
    """One response on a keep-alive connection (Content-Length framed)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_LIMIT_S)
    reply = parse_reply(head)
    body = await asyncio.wait_for(reader.readexactly(int(reply.headers.get("content-length", "0"))), READ_LIMIT_S)
    return Reply(reply.status, reply.headers, body, b"")


async def trickle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, every_s: float, step: int = 1
) -> tuple[bytes, int]:
    """Send `data` `step` bytes at a time, pausing `every_s` between pieces, until the server speaks or closes.

    The pause is spent waiting on the socket, so the trickle stops as soon as the server reacts. Returns all the
    server sent up to EOF, and how many bytes of `data` went out before it reacted."""
    sent = 0
    while sent < len(data):
        try:
            writer.write(data[sent:sent + step])
            await writer.drain()
        except ConnectionError:
            break
        sent = min(sent + step, len(data))
        try:
            first = await asyncio.wait_for(reader.read(65536), every_s)
        except TimeoutError:
            continue
        return first + (await read_to_eof(reader) if first else b""), sent
    return await read_to_eof(reader), sent


async def request(port: int, raw: bytes) -> Reply:
    """One request on a fresh connection, answered and closed."""
    reader, writer = await connect(port)
    try:
        writer.write(raw)
        await writer.drain()
        return parse_reply(await read_to_eof(reader))
    finally:
        writer.close()


def get(path: str = "/", *, close: bool = True, extra: bytes = b"") -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + connection + extra + b"\r\n"


def post(path: str, body: bytes, *, close: bool = True, length: int | None = None) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    declared = len(body) if length is None else length
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {declared}\r\n".encode() + connection + b"\r\n"
    return head + body
