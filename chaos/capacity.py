"""What a target can serve: a short closed-loop run (every client sends its next request when its answer arrives),
counting answers per second. Experiments whose rates are relative to capacity ("3x") are resolved against it, so the
same file means the same load on a laptop, a 2-core CI machine and a GPU host.

Closed loop, because an open-loop probe must guess a rate first: below capacity it measures the guess, far above it
the server sheds (429) and only the served ones count. With enough clients a closed loop keeps the server saturated
without overrunning it, and the rate it settles at is the capacity. A client whose request is refused (429) waits
before its next one, what Retry-After asks (up to a second), as a well-behaved client would: answering a storm of
instant retries would take the CPU that serving needs, and measure the storm instead of the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from glassbox.chaos.loadgen.bodies import Protocol, build_bodies
from glassbox.chaos.loadgen.http1 import ConnectFailed, Endpoint, Http1Connection, TransportFailed

# A refused client waits what the answer's Retry-After asks, at most REFUSED_PAUSE_MAX_S (the probe lasts seconds),
# or REFUSED_PAUSE_S when the answer names no delay. A pause of 20 ms whatever the server said measured 85 requests/s
# where the same server served 133 (2-core host, 32 clients): the storm of ~700 refusals a second took the CPU.
REFUSED_PAUSE_S = 0.02
REFUSED_PAUSE_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class Capacity:
    ok_per_s: float  # 2xx answers per second over the measured window
    answered: int
    failed: int  # non-2xx answers and transport failures
    connections: int
    duration_s: float

    def to_json(self) -> dict[str, float | int]:
        return {"ok_per_s": round(self.ok_per_s, 2), "answered": self.answered, "failed": self.failed,
                "connections": self.connections, "duration_s": self.duration_s}


async def measure_capacity(url: str, texts: Sequence[str], protocol: Protocol = "json", *, connections: int = 32,
                           duration_s: float = 5.0, warmup_s: float = 1.0) -> Capacity:
    """Saturate `url` from `connections` clients for `warmup_s` (not counted) then `duration_s` (counted)."""
    if connections < 1 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("connections must be >= 1, duration_s > 0 and warmup_s >= 0")
    endpoint = Endpoint.parse(url)
    bodies = build_bodies(texts, protocol)
    requests = [endpoint.render_post(bodies.path, bodies.content_type, body) for body in bodies.bodies]
    start = time.monotonic() + warmup_s
    end = start + duration_s
    ok = failed = answered = 0

    async def client(offset: int) -> None:
        nonlocal ok, failed, answered
        connection = Http1Connection(endpoint)
        index = offset
        try:
            while time.monotonic() < end:
                try:
                    status = await connection.request(requests[index % len(requests)])
                except (ConnectFailed, TransportFailed):
                    status = 0
                index += connections
                if start <= time.monotonic() < end:  # not while warming up, nor after the window closed
                    answered += 1
                    if 200 <= status < 300:
                        ok += 1
                    else:
                        failed += 1
                if status == 429:
                    asked = connection.retry_after_s
                    await asyncio.sleep(REFUSED_PAUSE_S if asked is None else min(asked, REFUSED_PAUSE_MAX_S))
        finally:
            connection.close()

    await asyncio.gather(*(client(i) for i in range(connections)))
    return Capacity(ok / duration_s, answered, failed, connections, duration_s)
