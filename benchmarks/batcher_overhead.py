"""The batcher's own CPU per request: the path between a submit and its answer, with the model and HTTP out of the way.

    .venv/bin/python -m benchmarks.batcher_overhead [--clients 64] [--requests 20000] [--rounds 5] [--runners 2]
        [--over-link] [--telemetry] [--json OUT]

A `Batcher` on the null engine (fixed logits at once), built with the server's default limits and batch formation,
`--runners` engine threads as on a CPU host, fed by `--clients` closed-loop clients on one uvloop event loop, each
submitting one text of 12 to 60 tokens and awaiting its answer before the next. Reported per round, and as medians:
CPU µs per request of the event-loop thread and of the engine threads together (from /proc/self/task, Linux), the
requests per second and the mean batch. It measures what the batcher costs per request and per batch (admission,
the queue, batch formation, the cost model, handing answers back across threads), the part of the engine process's
own per-request cost that does not depend on the device.

`--over-link` puts the clients in a process of their own, on an `EngineLink` as an HTTP worker's requests reach the
engine process, and this process serves them as the engine process does (`EngineHub` over the batcher, a Unix
socket between the two): the loop's figure is then the engine process's event loop, framing and messages included.
`--telemetry` gives the batcher the observer the server's default telemetry builds (metrics, tracing, logs).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from glassbox.service.batching import Batcher, BatcherLimits
from glassbox.service.bench.measure import emit, machine
from glassbox.service.engines.null import NullEngine
from glassbox.service.ipc.hub import EngineHub
from glassbox.service.ipc.link import EngineLink
from glassbox.service.ipc.messages import State
from glassbox.service.settings import load_settings
from glassbox.service.types import TokenBatch

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    seconds = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return seconds


async def one_round(batcher: Batcher, clients: int, requests: int, rng: np.random.Generator) -> dict[str, float]:
    texts = _texts(rng)
    left = requests
    loop_tid = threading.get_native_id()

    async def client(index: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            deadline = time.perf_counter_ns() + 10_000_000_000
            await batcher.submit(texts[(index + left) % len(texts)], deadline)

    before, stats_before, start = thread_cpu_s(), batcher.stats(), time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed, after, stats_after = time.perf_counter() - start, thread_cpu_s(), batcher.stats()
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop_s = used.pop(loop_tid, 0.0)
    batches = stats_after.batches_run - stats_before.batches_run
    return {"requests_per_s": requests / elapsed, "loop_us_per_request": loop_s / requests * 1e6,
            "engine_threads_us_per_request": sum(used.values()) / requests * 1e6,
            "mean_batch": (stats_after.items_run - stats_before.items_run) / batches if batches else 0.0}


def _texts(rng: np.random.Generator) -> list[TokenBatch]:
    return [TokenBatch(ids=rng.integers(1000, 2000, size=(1, n), dtype=np.int64), lengths=np.array([n]),
                       truncated=np.zeros(1, dtype=np.bool_)) for n in rng.integers(12, 61, size=256)]


def _link_worker(path: str, clients: int, rounds: list[int], conn: Connection) -> None:
    """The child process: an HTTP worker's side of the link, `clients` closed-loop clients on one EngineLink."""
    async def body() -> None:
        link = EngineLink(path)
        await link.start()
        if not await link.wait_connected(30.0):
            raise RuntimeError("the engine side never listened")
        texts = _texts(np.random.default_rng(1))
        for requests in rounds:
            left = requests

            async def client(index: int) -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    deadline = time.perf_counter_ns() + 10_000_000_000
                    await link.submit(texts[(index + left) % len(texts)], deadline)

            conn.send("ready")
            await asyncio.to_thread(conn.recv)  # "go", once the engine side has read its clocks
            await asyncio.gather(*(client(i) for i in range(clients)))
            conn.send("done")
        await link.close()

    uvloop.run(body())


async def run_over_link(args: argparse.Namespace, batcher: Batcher) -> list[dict[str, float]]:
    """This process plays the engine process (EngineHub over the batcher); the clients run in a worker process."""
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "engine.sock")
        hub = EngineHub(batcher, state=lambda: State("ready", "cpu", "", True, "", 1))
        await hub.listen(path)
        ours, theirs = mp.get_context("spawn").Pipe()
        sizes = [min(args.requests, 2000)] + [args.requests] * args.rounds
        worker = mp.get_context("spawn").Process(target=_link_worker, args=(path, args.clients, sizes, theirs))
        worker.start()
        loop_tid = threading.get_native_id()
        rounds = []
        try:
            for index, requests in enumerate(sizes):
                if await asyncio.to_thread(ours.recv) != "ready":
                    raise RuntimeError("the worker process failed")
                before, stats_before, start = thread_cpu_s(), batcher.stats(), time.perf_counter()
                ours.send("go")
                await asyncio.to_thread(ours.recv)
                elapsed, after, stats_after = time.perf_counter() - start, thread_cpu_s(), batcher.stats()
                used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
                loop_s = used.pop(loop_tid, 0.0)  # the rest: the engine threads (the pipe's reader only waits)
                batches = stats_after.batches_run - stats_before.batches_run
                if index:  # the first is the warm-up
                    rounds.append({"requests_per_s": requests / elapsed,
                                   "loop_us_per_request": loop_s / requests * 1e6,
                                   "engine_threads_us_per_request": sum(used.values()) / requests * 1e6,
                                   "mean_batch": (stats_after.items_run - stats_before.items_run) / batches
                                   if batches else 0.0})
                    print(rounds[-1], file=sys.stderr)
        finally:
            worker.join(30)
            await hub.close()
        return rounds


async def run(args: argparse.Namespace) -> list[dict[str, float]]:
    settings = load_settings({})
    observer = None
    if args.telemetry:  # the metrics and tracing observers the server's defaults build, as the engine process has
        from glassbox.telemetry import build_telemetry

        observer = build_telemetry(settings).compose(None)
    batcher = Batcher(NullEngine(2), BatcherLimits.from_settings(settings, 256), observer, runners=args.runners)
    batcher.start()
    rng = np.random.default_rng(0)
    if args.over_link:
        try:
            return await run_over_link(args, batcher)
        finally:
            batcher.stop(5.0)
    try:
        await one_round(batcher, args.clients, min(args.requests, 2000), rng)  # warm-up
        rounds = []
        for _ in range(args.rounds):
            rounds.append(await one_round(batcher, args.clients, args.requests, rng))
            print(rounds[-1], file=sys.stderr)
        return rounds
    finally:
        batcher.stop(5.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runners", type=int, default=2, help="engine threads")
    parser.add_argument("--telemetry", action="store_true",
                        help="the batcher reports to the server's default telemetry (metrics, tracing, logs)")
    parser.add_argument("--over-link", action="store_true",
                        help="the clients in a worker process, over the engine link: this process is the engine's")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds = uvloop.run(run(args))
    median: dict[str, Any] = {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]}
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "command": " ".join(["python -m benchmarks.batcher_overhead", *(argv or sys.argv[1:])]),
          "clients": args.clients, "requests": args.requests, "runners": args.runners, "over_link": args.over_link,
          "telemetry": args.telemetry,
          "rounds": rounds,
          "median": median}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
