"""What a slow-client attack is asked to do, checked before a single socket opens, and where it may aim.

The attacker refuses anything but loopback unless the caller says `allow_remote=True`: it is meant for the operator's
own server or the operator's own staging, and a typo in a URL must not turn it on somebody else's host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import socket
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Mode = Literal["headers", "body", "reader"]
MODES: tuple[Mode, ...] = ("headers", "body", "reader")

MAX_CONNECTIONS = 1000
MAX_DURATION_S = 600.0
MAX_BYTES_PER_S = 1024.0 * 1024.0  # per connection; beyond this nothing about the client is slow
MAX_BODY_BYTES = 1024 * 1024  # default body-mode cap: stay under the server's own body limit (4 MiB by default)
MIN_BODY_BYTES = 16  # room for the JSON wrapper around the padding text
CLASSIFY_PATH = "/v1/classify"
# Reader mode. The depth is also what the server ends up holding per connection: uvicorn parses pipelined requests
# ahead of the one it is answering (measured: about 3.5 kB of server memory per queued request), so it is kept modest.
DEFAULT_PIPELINE_DEPTH = 256
DEFAULT_TEXTS_PER_REQUEST = 8

SockAddr = tuple[str, int] | tuple[str, int, int, int]


class RemoteTargetError(ValueError):
    """The target resolves to an address outside loopback and `allow_remote` was not given."""


@dataclass(frozen=True, slots=True)
class SlowClientConfig:
    """One attack: `connections` sockets held open for `duration_s`, each paced at `bytes_per_s` (per connection).

    - headers: a request line and an endless header block, `bytes_per_s` at a time; the blank line never comes.
    - body: the whole header block with `Content-Length: body_bytes`, then the JSON body at `bytes_per_s`.
    - reader: complete pipelined requests (up to `pipeline_depth` unanswered), answers read at `bytes_per_s`
      through a receive buffer of `recv_buffer_bytes`.
    Connections open spread over `ramp_s`; one the server cuts is opened again after `reconnect_delay_s` while the
    duration lasts (unless `reconnect` is False)."""

    target: str  # base URL, http only: http://127.0.0.1:8000
    connections: int
    mode: Mode
    bytes_per_s: float
    duration_s: float
    path: str = CLASSIFY_PATH
    ramp_s: float = 1.0
    reconnect: bool = True
    reconnect_delay_s: float = 0.05
    allow_remote: bool = False
    body_bytes: int | None = None  # body mode; None: what `bytes_per_s` covers in `duration_s`, within the caps
    pipeline_depth: int = DEFAULT_PIPELINE_DEPTH  # reader mode
    texts_per_request: int = DEFAULT_TEXTS_PER_REQUEST  # reader mode; over the server's per-request cap: 413s
    recv_buffer_bytes: int = 4096  # reader mode SO_RCVBUF, so the kernel does not read on the attacker's behalf
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _check_target(self.target)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 1 <= self.connections <= MAX_CONNECTIONS:
            raise ValueError(f"connections must be between 1 and {MAX_CONNECTIONS}, got {self.connections}")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= MAX_DURATION_S):
            raise ValueError(f"duration_s must be in (0, {MAX_DURATION_S:g}], got {self.duration_s}")
        if not (math.isfinite(self.bytes_per_s) and 0 < self.bytes_per_s <= MAX_BYTES_PER_S):
            raise ValueError(f"bytes_per_s must be in (0, {MAX_BYTES_PER_S:g}], got {self.bytes_per_s}")
        if not self.path.startswith("/") or any(c in self.path for c in " \r\n"):
            raise ValueError(f"path must start with / and hold no spaces or line breaks, got {self.path!r}")
        for name in ("ramp_s", "reconnect_delay_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= MAX_DURATION_S):
                raise ValueError(f"{name} must be in [0, {MAX_DURATION_S:g}], got {value}")
        if not (math.isfinite(self.connect_timeout_s) and 0 < self.connect_timeout_s <= 60):
            raise ValueError(f"connect_timeout_s must be in (0, 60], got {self.connect_timeout_s}")
        if self.body_bytes is not None and not MIN_BODY_BYTES <= self.body_bytes <= 64 * MAX_BODY_BYTES:
            raise ValueError(f"body_bytes must be between {MIN_BODY_BYTES} and {64 * MAX_BODY_BYTES}")
        if not 1 <= self.pipeline_depth <= 10_000:
            raise ValueError(f"pipeline_depth must be between 1 and 10000, got {self.pipeline_depth}")
        if not 1 <= self.texts_per_request <= 1024:
            raise ValueError(f"texts_per_request must be between 1 and 1024, got {self.texts_per_request}")
        if not 1024 <= self.recv_buffer_bytes <= 1024 * 1024:
            raise ValueError(f"recv_buffer_bytes must be between 1024 and 1048576, got {self.recv_buffer_bytes}")

    @property
    def host(self) -> str:
        return urlsplit(self.target).hostname or ""

    @property
    def port(self) -> int:
        return urlsplit(self.target).port or 80

    @property
    def host_header(self) -> str:
        host = self.host
        if ":" in host:  # an IPv6 literal goes back into brackets
            host = f"[{host}]"
        return host if self.port == 80 else f"{host}:{self.port}"

    @property
    def request_path(self) -> str:
        """The route, under the target's own path prefix when it has one (a staging URL behind a path router)."""
        return urlsplit(self.target).path.rstrip("/") + self.path

    @property
    def declared_body_bytes(self) -> int:
        """Body mode: a body the trickle cannot finish before the duration ends, unless that would exceed the cap."""
        if self.body_bytes is not None:
            return self.body_bytes
        return max(MIN_BODY_BYTES, min(MAX_BODY_BYTES, math.ceil(self.bytes_per_s * self.duration_s) + 1))


def _check_target(target: str) -> None:
    parts = urlsplit(target)
    if parts.scheme != "http":
        raise ValueError(f"target must be an http:// URL (the attacker speaks plain HTTP/1.1), got {target!r}")
    if not parts.hostname:
        raise ValueError(f"target has no host: {target!r}")
    if parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"target must be a base URL without credentials, query or fragment: {target!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked for it
    except ValueError as exc:
        raise ValueError(f"target has a bad port: {target!r}") from exc


async def resolve_target(config: SlowClientConfig) -> tuple[socket.AddressFamily, SockAddr]:
    """The address every connection goes to. Without `allow_remote` every address the name resolves to must be a
    loopback one, so a name that also points elsewhere is refused rather than picked from."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {config.host!r}: {exc}") from exc
    if not infos:
        raise ValueError(f"{config.host!r} resolves to no address")
    if not config.allow_remote:
        outside = sorted({str(info[4][0]) for info in infos if not ipaddress.ip_address(info[4][0]).is_loopback})
        if outside:
            raise RemoteTargetError(
                f"{config.host!r} resolves to {', '.join(outside)}, not loopback; slow-client attacks aim at "
                "127.0.0.1 unless --allow-remote is given (for your own staging server only)")
    family, _, _, _, address = infos[0]
    if not isinstance(address[0], str):  # only the IPv4/IPv6 forms are asked for, but typeshed allows raw ones
        raise ValueError(f"{config.host!r} resolves to an address that is not IPv4 or IPv6")
    return family, address
