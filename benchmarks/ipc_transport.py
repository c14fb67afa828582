"""How much one request costs to carry between an HTTP worker and the engine process, per transport tried.

    .venv/bin/python -m benchmarks.ipc_transport [--requests 20000] [--concurrency 1,8,32] [--json OUT]

A child process plays the engine: it decodes each Submit (here one request of one text of 27 tokens each) and
answers with an Answers holding one Done (two logits, timings, batch ids) at once, with no model. The parent plays a
worker: `concurrency` coroutines each send a Submit and await its answer, `requests` in all. Reported per round
trip: wall time and CPU time of both processes together (getrusage of each). Transports:

- `asyncio-unix`: glassbox's own framing (service/ipc/framing.py: u32 length + msgpack) over a Unix stream socket,
  on uvloop, in both processes;
- `zmq-ipc`: pyzmq DEALER (worker) / ROUTER (engine) over ipc://, with zmq.asyncio, the same msgpack messages.
  Runs only where pyzmq is installed (it is not a glassbox dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

from glassbox.service.bench.measure import machine
from glassbox.service.ipc.framing import FrameProtocol
from glassbox.service.ipc.messages import Answers, Done, Request, Submit, encode, engine_decoder, worker_decoder


def _submit(i: int) -> bytes:
    ids = np.arange(27, dtype=np.int32)
    request = Request(i, 1, 27, time.perf_counter_ns(), f"{i:032x}")
    return encode(Submit((request,), ids.tobytes(), np.array([27], dtype=np.int32).tobytes()))


def _done(message: Submit) -> bytes:
    now = time.perf_counter_ns()
    [request] = message.requests
    logits = np.zeros((request.rows, 2), dtype=np.float32).tobytes()
    return encode(Answers((Done(request.id, 2, logits, now, now, now, "cpu", "eager", (request.id,)),)))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- engine side ------------------------------------------------------------------------------------------------------
def _serve_asyncio(path: str, ready: Any, cpu: Any) -> None:
    async def main() -> None:
        decode = engine_decoder().decode
        done = asyncio.Event()

        class Echo:
            """Answers each Submit on the connection it came from."""

            def __init__(self) -> None:
                self.proto = FrameProtocol(self.on_frame, lambda _exc: done.set())

            def on_frame(self, payload: bytes) -> None:
                message = decode(payload)
                assert isinstance(message, Submit)
                self.proto.send(_done(message))

        server = await asyncio.get_running_loop().create_unix_server(lambda: Echo().proto, path)
        cpu.value = _cpu_s()
        ready.set()
        await done.wait()
        server.close()

    uvloop.run(main())
    cpu.value = _cpu_s() - cpu.value  # the serving time only: start-up was spent before `ready`


def _serve_zmq(path: str, ready: Any, cpu: Any) -> None:
    import zmq
    import zmq.asyncio

    async def main() -> None:
        context = zmq.asyncio.Context()
        router = context.socket(zmq.ROUTER)
        router.bind(f"ipc://{path}")
        cpu.value = _cpu_s()
        ready.set()
        decode = engine_decoder().decode
        while True:
            peer, payload = await router.recv_multipart()
            if payload == b"stop":
                break
            message = decode(payload)
            assert isinstance(message, Submit)
            await router.send_multipart([peer, _done(message)])
        router.close(0)
        context.term()

    uvloop.run(main())
    cpu.value = _cpu_s() - cpu.value  # the serving time only: start-up was spent before `ready`


# --- worker side -----------------------------------------------------------------------------------------------------
async def _client_asyncio(path: str, requests: int, concurrency: int) -> None:
    decode = worker_decoder().decode
    waiting: dict[int, asyncio.Future[Done]] = {}

    def on_frame(payload: bytes) -> None:
        message = decode(payload)
        assert isinstance(message, Answers)
        for done in message.done:
            waiting.pop(done.id).set_result(done)

    loop = asyncio.get_running_loop()
    _, proto = await loop.create_unix_connection(lambda: FrameProtocol(on_frame, lambda _e: None), path)
    counter = iter(range(requests))

    async def one() -> None:
        for i in counter:
            future = loop.create_future()
            waiting[i] = future
            proto.send(_submit(i))
            await future

    await asyncio.gather(*(one() for _ in range(concurrency)))
    proto.close()


async def _client_zmq(path: str, requests: int, concurrency: int) -> None:
    import zmq
    import zmq.asyncio

    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"ipc://{path}")
    decode = worker_decoder().decode
    waiting: dict[int, asyncio.Future[Done]] = {}
    loop = asyncio.get_running_loop()

    async def reader() -> None:
        while waiting or not finished.is_set():
            message = decode(await dealer.recv())
            assert isinstance(message, Answers)
            for done in message.done:
                waiting.pop(done.id).set_result(done)

    finished = asyncio.Event()
    counter = iter(range(requests))

    async def one() -> None:
        for i in counter:
            future = loop.create_future()
            waiting[i] = future
            await dealer.send(_submit(i))
            await future

    read = asyncio.ensure_future(reader())
    await asyncio.gather(*(one() for _ in range(concurrency)))
    finished.set()
    read.cancel()
    await dealer.send(b"stop")
    dealer.close(1000)
    context.term()


TRANSPORTS = {"asyncio-unix": (_serve_asyncio, _client_asyncio), "zmq-ipc": (_serve_zmq, _client_zmq)}


def run_one(transport: str, requests: int, concurrency: int) -> dict[str, float]:
    serve, client = TRANSPORTS[transport]
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "engine.sock")
        ready, cpu = context.Event(), context.Value("d", 0.0)
        child = context.Process(target=serve, args=(path, ready, cpu))
        child.start()
        ready.wait(30)
        cpu_before, start = _cpu_s(), time.perf_counter()
        uvloop.run(client(path, requests, concurrency))
        wall, cpu_client = time.perf_counter() - start, _cpu_s() - cpu_before
        child.join(30)
    return {"wall_us": wall / requests * 1e6, "cpu_us": (cpu_client + cpu.value) / requests * 1e6,
            "client_cpu_us": cpu_client / requests * 1e6, "engine_cpu_us": cpu.value / requests * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every transport once, in turn")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    transports = ["asyncio-unix"]
    try:
        import zmq  # noqa: F401
        transports.append("zmq-ipc")
    except ImportError:
        print("pyzmq is not installed: measuring asyncio-unix only", file=sys.stderr)
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: dict[str, list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for transport in transports[round_ % len(transports):] + transports[:round_ % len(transports)]:
            for level in levels:
                runs.setdefault(f"{transport} c={level}", []).append(run_one(transport, args.requests, level))
    results: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "pid": os.getpid(),
                               "requests": args.requests, "rounds": args.rounds, "median": {}}
    for key, values in runs.items():
        results["median"][key] = {name: round(statistics.median(v[name] for v in values), 2) for name in values[0]}
        print(f"{key:22s} " + "  ".join(f"{n}={v:7.2f}" for n, v in results["median"][key].items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
