"""Bulk benchmark: `glassbox classify` against the offline engine and the server at saturation, in one run.

    .venv/bin/python -m benchmarks.bulk [--rounds 3] [--copies 4] [--duration 10] [--connections 32] [--json OUT]

Each round, one after the other on this machine (never two at once), on the default model's held-out mix:
  1. `glassbox bench engine --repeat 1 --json` (fp32, length-sorted batches of 32, texts tokenized before timing:
     the engine alone, the figure every other number here is divided by);
  2. `glassbox classify` over the mix written `--copies` times as JSON lines, with its defaults (--engine-threads
     auto) and with `--engine-threads 1`: seq/s from its summary, counted from the first read to the last write
     (reading, tokenizing, sorting, writing included; model loading not);
  3. `glassbox serve` (default settings, started once) under `wrk -t1 -c<connections>`, one text per request.
Ratios are taken within each round; the medians of rounds are the results.
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

from benchmarks.serving import free_port, wait_ready, wrk
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model

ROOT = Path(__file__).resolve().parents[1]


def glassbox(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "glassbox.service", *args], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout


def engine_rate(model: Path) -> float:
    report = json.loads(glassbox("bench", "engine", "--model", str(model), "--repeat", "1", "--json"))
    return float(report["throughput_seq_per_s"])


def classify_rate(model: Path, source: Path, folder: Path, *extra: str) -> dict[str, Any]:
    summary = folder / "summary.json"
    glassbox("classify", str(source), "--model", str(model), "--device", "cpu", "--out", str(folder / "out.jsonl"),
             "--summary", str(summary), "--no-progress", *extra)
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=4, help="times the held-out mix is repeated in the input")
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk per round")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    model = args.model or default_model_dir()
    texts = list(read_mix(model / "heldout.jsonl", load_model(model).labels).texts)
    folder = Path(tempfile.mkdtemp(prefix="glassbox-bulk-"))
    source = folder / "mix.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * args.copies), encoding="utf-8")
    bodies = folder / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "glassbox.service", "serve", "--model", str(model),
                               "--device", "cpu", "--port", str(port), "--log-level", "warning"],
                              env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)
    rounds: list[dict[str, Any]] = []
    try:
        wait_ready(url)
        wrk(url, bodies, 8, 3)  # warm the server's code paths
        for _ in range(args.rounds):
            engine = engine_rate(model)
            auto = classify_rate(model, source, folder)
            single = classify_rate(model, source, folder, "--engine-threads", "1")
            served = wrk(url, bodies, args.connections, args.duration)
            one = {
                "engine_seq_per_s": engine,
                "classify_seq_per_s": auto["seq_per_s"], "classify_engine_threads": auto["engine_threads"],
                "classify_padding_ratio": auto["padding_ratio"],
                "classify_1_thread_seq_per_s": single["seq_per_s"],
                "server_req_per_s": served["requests_per_s"], "server_mean_batch": served["mean_batch"],
                "classify_ratio": auto["seq_per_s"] / engine, "classify_1_thread_ratio": single["seq_per_s"] / engine,
                "server_ratio": served["requests_per_s"] / engine,
            }
            rounds.append(one)
            print(json.dumps(one), file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
    medians = {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "command": " ".join(["python -m benchmarks.bulk", *(argv or sys.argv[1:])]),
          "texts": len(texts) * args.copies, "rounds": rounds, "median": medians}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
