"""A small load client for the fidelity test, run as its own process so that its work never shares a GIL with the
server it measures: C keep-alive connections to 127.0.0.1, N classify requests in all, and for each the latency
from the first byte written to the last byte read. Prints a JSON list of [seconds, status].

    python tests/telemetry/loadclient.py PORT N C
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

TEXTS = ["a good movie", "the worst film and a boring plot that goes on and on", "great",
         "slow and sad but the music was fun", "best cast of the year, with a script that works"]


async def connection(port: int, bodies: list[bytes], out: list[tuple[float, int]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            head = (f"POST /v1/classify HTTP/1.1\r\nHost: glassbox\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            start = time.perf_counter()
            writer.write(head + body)
            header_block = await reader.readuntil(b"\r\n\r\n")
            lines = header_block.split(b"\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            out.append((time.perf_counter() - start, int(lines[0].split()[1])))
    finally:
        writer.close()


async def main(port: int, requests: int, connections: int) -> None:
    bodies = [json.dumps({"texts": TEXTS[: 1 + i % len(TEXTS)]}).encode() for i in range(requests)]
    out: list[tuple[float, int]] = []
    await asyncio.gather(*(connection(port, bodies[i::connections], out) for i in range(connections)))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
