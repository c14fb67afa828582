"""Start-up cost of `glassbox serve`: seconds until ready, resident memory once ready, and `serve --help` time.

    .venv/bin/python -m benchmarks.startup [--tree before=/tmp/old-checkout] [--tree after=.] [--rounds 5]
        [--model DIR] [--json OUT]

Each `--tree` is a checkout of glassbox, run uninstalled (benchmarks.checkout: its code first on PYTHONPATH), so two
versions of the code can be compared on the same machine, interleaved round by round. Per round and
tree: `glassbox serve --help` (the CLI's own import and parser cost, no model), then `glassbox serve` in the
one-process layout on the CPU, timed from the spawn to the first 200 from /readyz, and its RSS (psutil) at that
moment; then SIGTERM. Reported per tree: the median and the spread of each.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from benchmarks.checkout import environment, glassbox_command
from glassbox.chaos.local import free_port
from glassbox.service.bench.measure import emit, machine
from glassbox.service.model.default import default_model_dir

ROOT = Path(__file__).resolve().parent.parent
READY_BOUND_S = 180.0


def serve_help_s(tree: Path) -> float:
    started = time.perf_counter()
    subprocess.run([*glassbox_command(tree), "serve", "--help"], cwd=tree, env=environment(tree), check=True,
                   capture_output=True)
    return time.perf_counter() - started


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def serve_until_ready(tree: Path, model: Path) -> tuple[float, float]:
    """(seconds from spawn to ready, RSS in MiB when ready)."""
    port = free_port()
    env = environment(tree, {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")})
    argv = [*glassbox_command(tree), "serve", "--model", str(model), "--device", "cpu", "--port", str(port),
            "--workers", "0", "--drain-timeout-s", "1", "--log-level", "warning"]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ready(port):
            if proc.poll() is not None:
                raise RuntimeError(f"serve from {tree} exited with {proc.returncode} before it was ready")
            if time.perf_counter() - started > READY_BOUND_S:
                raise RuntimeError(f"serve from {tree} was not ready in {READY_BOUND_S} s")
            time.sleep(0.02)  # polling; the resolution of the start-up time
        elapsed = time.perf_counter() - started
        rss_mib = psutil.Process(proc.pid).memory_info().rss / 2**20
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return elapsed, rss_mib


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                        help="a checkout to measure (repeatable); default: this one, as `current`")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree) or {"current": str(ROOT)}
    model = args.model or default_model_dir()
    samples: dict[str, dict[str, list[float]]] = {label: {"help_s": [], "ready_s": [], "rss_mib": []}
                                                  for label in trees}
    for round_index in range(args.rounds):
        for label, tree in trees.items():
            samples[label]["help_s"].append(serve_help_s(Path(tree)))
            ready_s, rss_mib = serve_until_ready(Path(tree), model)
            samples[label]["ready_s"].append(ready_s)
            samples[label]["rss_mib"].append(rss_mib)
            print(f"round {round_index + 1} {label}: ready {ready_s:.2f} s, rss {rss_mib:.0f} MiB", file=sys.stderr)
    results: dict[str, Any] = {"machine": machine(), "model": str(model), "rounds": args.rounds,
                               "trees": {label: {name: summary(values) for name, values in measured.items()}
                                         for label, measured in samples.items()}}
    emit(results, args.json)


if __name__ == "__main__":
    main()
