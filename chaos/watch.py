"""The watch on a target during a run (its /metrics and /readyz every half second), in a process of its own.

    python -m glassbox.chaos.watch URL INTERVAL_S

Each look is printed as one JSON line on stdout (an Observation; `t_s` is time.monotonic(), the same clock in every
process of the host); the process ends when its stdin closes, so it never outlives the runner that started it.

Why a process: one look (two HTTP requests through httpx and the parse of the samples) took 2.35 ms of CPU on the
load generator's event loop, every half second, and during that time the generator released and read nothing: the
slowest refusals of the overload experiment clustered around the looks (docs/benchmarks/2026-12-04-lighter-watch.md).
In a process of its own the look costs the same CPU, but the scheduler shares it out instead of the generator waiting
for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence

import httpx
import msgspec

from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice
from glassbox.chaos.metrics_scrape import LOOK_TIMEOUT_S, Observation, look_every

STOP_TIMEOUT_S = 5.0
_decoder = msgspec.json.Decoder(Observation)


class WatchProcess:
    """The runner's handle on one watch process: `start`, then iterate `observations()` until `stop`."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.process: asyncio.subprocess.Process | None = None
        self.stopped = False  # stop() was called: an exit from then on is the asked-for one
        self._stderr: asyncio.Task[list[str]] | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "glassbox.chaos.watch", self.url, repr(self.interval_s),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)  # stopped by the runner (its stdin closes), not by the terminal's Ctrl-C
        self._stderr = asyncio.create_task(self._last_lines())  # read as it comes: a full pipe would stall the watch

    async def _last_lines(self) -> list[str]:
        assert self.process is not None and self.process.stderr is not None
        tail: deque[bytes] = deque(maxlen=3)
        while line := await self.process.stderr.readline():
            tail.append(line)
        return [line.decode(errors="replace").strip() for line in tail]

    async def observations(self) -> AsyncIterator[Observation]:
        """The looks as they come, until the process ends. A process that dies early (not stopped) yields one last
        observation that says so, so that a run never judges a silent watch as a target that was fine."""
        process = self.process
        assert process is not None and process.stdout is not None
        while line := await process.stdout.readline():
            try:
                yield _decoder.decode(line)
            except msgspec.DecodeError:
                continue  # not a look (a stray print); the watch goes on
        code = await process.wait()
        if code != 0 and not self.stopped:
            last = " | ".join(await self._stderr) if self._stderr is not None else ""
            yield Observation(time.monotonic(), None, None, f"the watch process exited with {code}: {last}")

    async def stop(self) -> None:
        """Close its stdin (it ends after the look in progress); kill it if it has not ended in STOP_TIMEOUT_S."""
        self.stopped = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._stderr is not None:
            await self._stderr


async def _watch(url: str, interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def wait_for_eof() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, name="glassbox-watch-stdin", daemon=True).start()
    out = sys.stdout.buffer

    def write(obs: Observation) -> None:
        out.write(msgspec.json.encode(obs) + b"\n")
        out.flush()

    async with httpx.AsyncClient(timeout=LOOK_TIMEOUT_S, trust_env=False) as http:
        await look_every(http, url, interval_s, stop, write)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m glassbox.chaos.watch URL INTERVAL_S", file=sys.stderr)
        return 2
    # Started by the runner's thread, it may inherit the load generator's short scheduler slice: the watch has no
    # latency to protect (a look a millisecond late changes nothing), so it takes the kernel's own back.
    set_thread_slice(DEFAULT_SLICE)
    with contextlib.suppress(BrokenPipeError):
        asyncio.run(_watch(argv[0], float(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
