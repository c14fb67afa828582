"""Front-end capacity: how many one-text JSON requests per second the HTTP side carries, with the model out of the way.

    .venv/bin/python -m benchmarks.frontend [--workers 0,1,2] [--floor] [--baseline-tree DIR] [--connections 64]
        [--duration 10] [--rounds 3] [--engine null|model] [--wrk-threads 1] [--json OUT]

`glassbox serve --engine null --benchmark` answers every request with fixed logits at once, so what is measured is
everything but the model: HTTP (uvicorn, httptools, the protocol guard), JSON, the tokenizer, the batcher, the engine
link between processes when there is one, and telemetry (metrics and request logs, as by default; the log goes to a
file). For each worker count (0: one process) it starts the server once and runs `wrk -t1` with `--connections`
connections for `--duration` seconds per round, the worker counts interleaved round by round. Reported per worker
count: requests per second (median of rounds), and the CPU seconds each process of the server used per 1000
requests (psutil), so the cost per request can be compared where the machine has fewer cores than the server has
processes.

`--engine model` serves the model itself with the server's defaults instead (on a GPU host, the CUDA graph engine),
to see how many worker processes it takes to keep the device busy; the mean engine batch size is reported too.
`--wrk-threads N` gives wrk more than one thread, for hosts where one wrk thread cannot saturate several workers.

`--floor` adds two servers to the rounds, keyed `floor` and `floor+tokenizer`: the same HTTP stack with none of
glassbox's own work (benchmarks/frontend_floor.py), without and with the model's tokenizer. What glassbox costs per
request beyond `floor+tokenizer` is its own code: the guard, the batcher, the engine link, telemetry, the answer.

`--baseline-tree DIR` adds, for each worker count W, a server keyed `W@baseline` started from the checkout in DIR (a
git worktree of another commit: `git worktree add /tmp/base HEAD~1`), interleaved round by round with this tree's,
so that a change to the front end is measured side by side with the code before it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.checkout import environment, glassbox_command
from benchmarks.serving import stop_on_sigterm, wait_ready, wrk
from glassbox.chaos.local import free_port
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model

ROOT = Path(__file__).resolve().parent.parent


class Server:
    def __init__(self, model_dir: Path, workers: int, extra: list[str], log_path: Path, *, floor: str = "",
                 root: Path = ROOT, engine: str = "null") -> None:
        """`glassbox serve` on the null engine (or with engine "model" the model itself) with `workers` from the
        checkout in `root` (benchmarks.checkout: its code first on PYTHONPATH), or with `floor` ("floor",
        "floor+tokenizer") the library stack alone (benchmarks/frontend_floor.py)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if floor:
            tokenizer = ["--tokenizer", str(model_dir / "tokenizer.json")] if floor == "floor+tokenizer" else []
            cmd = [sys.executable, "-m", "benchmarks.frontend_floor", "--port", str(self.port), *tokenizer]
        else:
            cmd = serve_command(model_dir, workers, self.port, extra, engine, root)
        # The request log stays at its default level (a JSON line per notable request) and goes to a file, as under a
        # container runtime that collects the output: a quieter level would measure a front end nobody runs.
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(cmd, cwd=root, env=environment(root, dict(os.environ, PYTHONUNBUFFERED="1")),
                                        stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of the server and each of its processes, by role."""
        seconds: dict[str, float] = {}
        for proc, role in server_processes(self.process.pid):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seconds[role] = seconds.get(role, 0.0) + times.user + times.system
        return seconds

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def serve_command(model_dir: Path, workers: int, port: int, extra: list[str], engine: str, root: Path = ROOT
                  ) -> list[str]:
    """`glassbox serve` on the null engine (engine "null"), or on the model with the server's defaults ("model"), from
    the checkout in `root`."""
    null = ["--engine", "null", "--benchmark"] if engine == "null" else []
    return [*glassbox_command(root), "serve", "--model", str(model_dir), *null, "--workers", str(workers),
            "--port", str(port), *extra]


def server_processes(root: int) -> list[tuple[psutil.Process, str]]:
    """The server started as `root` and the processes it spawned (not multiprocessing's resource tracker), each with
    its role: main (the one-process server, or the supervisor), worker (holds the TCP listener) or engine (does not).
    Processes that end meanwhile are left out."""
    out: list[tuple[psutil.Process, str]] = []
    try:
        main = psutil.Process(root)
        children = [child for child in main.children() if "spawn_main" in " ".join(child.cmdline())]
    except psutil.NoSuchProcess:
        return out
    out.append((main, "main"))
    for child in children:
        try:
            out.append((child, "worker" if child.net_connections(kind="inet") else "engine"))
        except psutil.NoSuchProcess:
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts (0: one process)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `glassbox serve` flag (repeatable)")
    parser.add_argument("--floor", action="store_true",
                        help="also measure the HTTP stack alone, without and with the tokenizer "
                             "(benchmarks/frontend_floor.py)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also run each worker count from the checkout in this directory (key W@baseline)")
    parser.add_argument("--engine", choices=("null", "model"), default="null",
                        help="null: fixed logits (the front end alone); model: the model on the server's device")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("front-end benchmark: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    stop_on_sigterm()
    model_dir = args.model or default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)
    folder = Path(tempfile.mkdtemp(prefix="glassbox-frontend-"))
    bodies = folder / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    servers = {w: Server(model_dir, int(w), args.serve_arg, folder / f"server-{w}.log", engine=args.engine)
               for w in args.workers.split(",")}
    if args.baseline_tree is not None:
        base = args.baseline_tree.resolve()
        servers |= {f"{w}@baseline": Server(model_dir, int(w), args.serve_arg, folder / f"server-{w}@baseline.log",
                                            root=base, engine=args.engine) for w in args.workers.split(",")}
    if args.floor:
        servers |= {name: Server(model_dir, 0, [], folder / f"{name}.log", floor=name)
                    for name in ("floor", "floor+tokenizer")}
    counts = list(servers)
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in counts}
    try:
        for server in servers.values():
            wait_ready(server.url)
            wrk(server.url, bodies, 8, 2)  # warm the code paths
        for round_ in range(args.rounds):
            order = counts[round_ % len(counts):] + counts[:round_ % len(counts)]
            for workers in order:
                server = servers[workers]
                before = server.cpu_seconds()
                result = wrk(server.url, bodies, args.connections, args.duration, args.wrk_threads)
                after = server.cpu_seconds()
                requests = result["requests_per_s"] * args.duration
                cpu = {role: (after.get(role, 0.0) - before.get(role, 0.0)) / requests * 1000 for role in after}
                runs[workers].append({**result, "cpu_s_per_1000_requests": cpu})
                print(json.dumps({"server": workers, **runs[workers][-1]}), file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    medians: dict[str, Any] = {}
    for workers, values in runs.items():
        roles = values[0]["cpu_s_per_1000_requests"]
        medians[workers] = {
            "requests_per_s": round(statistics.median(v["requests_per_s"] for v in values), 1),
            "p50_ms": round(statistics.median(v["p50_ms"] for v in values), 3),
            "p99_ms": round(statistics.median(v["p99_ms"] for v in values), 3),
            "mean_batch": round(statistics.median(v["mean_batch"] for v in values), 2),
            "cpu_s_per_1000_requests": {r: round(statistics.median(v["cpu_s_per_1000_requests"].get(r, 0.0)
                                                                   for v in values), 3) for r in roles},
        }
    results = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": " ".join(["python -m benchmarks.frontend", *(argv or sys.argv[1:])]),
               "engine": args.engine, "connections": args.connections, "wrk_threads": args.wrk_threads,
               "duration_s": args.duration, "rounds": args.rounds,
               "runs": runs, "median": medians}
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
