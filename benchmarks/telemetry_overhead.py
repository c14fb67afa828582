"""Telemetry overhead (issue 4, item 8): the same server with telemetry fully on and fully off, interleaved.

    .venv/bin/python -m benchmarks.telemetry_overhead [--model DIR] [--rounds 4] [--duration 10] [--json OUT]

"On" is what `glassbox serve` does by default plus trace export: Prometheus metrics with exemplars, one span
per request and stage plus batch spans exported over OTLP/HTTP to a local sink, and one JSON log line per
request (written to a file). "Off" is `--no-telemetry` (the do-nothing observer, no /metrics). Both servers
run side by side on one machine; load goes to one at a time, alternating on/off every round, so the drift
of a shared machine falls on both. Reports median throughput at saturation and median one-client P50 for each,
and the ratios.

The OTLP sink accepts and discards export requests (counting them), so its own decoding cost is not
charged to glassbox.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.serving import ROOT, free_port, wait_ready, wrk
from service.bench.measure import machine
from service.bench.mix import read_mix
from service.model.default import default_model_dir
from service.model.loader import load_model


class Sink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), SinkHandler)


class SinkHandler(BaseHTTPRequestHandler):
    server: Sink

    def do_POST(self) -> None:  # the name BaseHTTPRequestHandler calls
        size = int(self.headers.get("content-length", "0"))
        self.rfile.read(size)
        with self.server.lock:
            self.server.exports += 1
            self.server.bytes += size
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def start_server(model_dir: Path, port: int, extra: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "service", "serve", "--model", str(model_dir), "--device", "cpu",
           "--port", str(port), *extra]
    handle = log.open("wb")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    model_dir = args.model or default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="glassbox-overhead-"))
    bodies = work / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ports = {"on": free_port(), "off": free_port()}
    servers = {
        "on": start_server(model_dir, ports["on"], [
            "--telemetry", "--otlp-endpoint", f"http://127.0.0.1:{sink.server_address[1]}",
            "--otlp-protocol", "http/protobuf", "--log-format", "json", "--log-level", "info"], work / "on.log"),
        "off": start_server(model_dir, ports["off"], ["--no-telemetry", "--log-level", "warning"], work / "off.log"),
    }
    runs: dict[str, dict[str, list[float]]] = {k: {"rps": [], "p50_ms": []} for k in servers}
    try:
        for port in ports.values():
            wait_ready(f"http://127.0.0.1:{port}")
            wrk(f"http://127.0.0.1:{port}", bodies, 8, 3)  # warm-up
        for round_index in range(args.rounds):
            order = ["on", "off"] if round_index % 2 == 0 else ["off", "on"]
            for name in order:
                url = f"http://127.0.0.1:{ports[name]}"
                runs[name]["rps"].append(wrk(url, bodies, args.connections, args.duration)["requests_per_s"])
                runs[name]["p50_ms"].append(wrk(url, bodies, 1, args.duration)["p50_ms"])
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            proc.wait(timeout=60)
        sink.shutdown()
    log_lines = sum(1 for line in (work / "on.log").read_text().splitlines() if '"route"' in line)
    result: dict[str, Any] = {
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "texts": len(texts),
        "rounds": args.rounds, "duration_s": args.duration, "connections": args.connections,
        "runs": runs,
        "median": {k: {m: statistics.median(v) for m, v in r.items()} for k, r in runs.items()},
        "otlp_exports": sink.exports, "otlp_bytes": sink.bytes, "request_log_lines": log_lines,
    }
    on, off = result["median"]["on"], result["median"]["off"]
    result["throughput_loss"] = 1 - on["rps"] / off["rps"]
    result["p50_delta_ms"] = on["p50_ms"] - off["p50_ms"]
    # Paired per round, so one slow round does not decide it.
    pairs = [1 - a / b for a, b in zip(runs["on"]["rps"], runs["off"]["rps"], strict=True)]
    result["throughput_loss_median_of_rounds"] = statistics.median(pairs)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
