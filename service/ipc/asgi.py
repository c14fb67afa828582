"""One HTTP request run against an ASGI app in this process, without a socket: how the engine process answers the
control-API requests a worker relays to it (the routes live where the state they change lives)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

Scope = dict[str, Any]
Message = dict[str, Any]
AsgiApp = Callable[[Scope, Any, Any], Awaitable[None]]  # receive and send: Starlette types them its own way
_PATH_SAFE = "/!$&'()*+,;=:@-._~"  # RFC 3986 pchar and '/', left as they are


async def call_asgi(app: AsgiApp, method: str, path: str, query: str, headers: list[tuple[str, str]],
                    body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers, body) of the app's answer. The request body arrives in one message; the client never
    disconnects."""
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        # The worker relays the decoded path: raw_path is its percent-encoded UTF-8, as a client would have sent it.
        "path": path, "raw_path": quote(path, safe=_PATH_SAFE).encode("ascii"),
        "query_string": query.encode("latin-1"), "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": None, "server": None,
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status = 500
    answer_headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, answer_headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            answer_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return status, answer_headers, b"".join(chunks)
