"""Telemetry overhead: the same server with telemetry fully on and fully off, interleaved.

    .venv/bin/python -m benchmarks.telemetry_overhead [--model DIR] [--rounds 8] [--duration 8] [--together]
                                                      [--servers per-round|once] [--same]
                                                      [--baseline-tree DIR] [--json OUT] [--on-args FLAG ...]
    .venv/bin/python -m benchmarks.telemetry_overhead --micro [--requests 4000] [--repeat 7]

"On" is what `glassbox serve` does by default plus trace export: Prometheus metrics with exemplars, one span
per request and stage plus batch spans exported over OTLP/HTTP to a local sink, and one JSON log line per
request (written to a file). "Off" is `--no-telemetry` (the do-nothing observer, no /metrics). Both servers
run side by side on one machine; load goes to one at a time, alternating on/off every round, so the drift
of a shared machine falls on both; with `--together` both are loaded at once, each getting about half the
machine, so a neighbour's burst slows both alike. Reports median throughput at saturation and median one-client
P50 for each, the ratios (per round, paired; the median loss with a bootstrap 95% interval over the rounds, which
says whether this many rounds can tell the loss from a target at all), and the CPU each server spent per request
(from /proc: the event-loop thread, the others, the total), which says where a difference comes from even when the
machine is too busy for the throughput figures to agree.

Each round starts a new pair of servers (`--servers per-round`, the default): two processes of the very same server,
side by side for a whole run, differed by ~5% in throughput and ~200 µs of CPU a request on a 2-core host, every round
the same way (2026-12-07, `--same --servers once`), a bias no number of rounds averages out; new processes every
round turn it into spread, which the interval shows. `--same` gives both servers off's flags, to measure that bias
and spread. Throughput counts answers of 200 only; the refusals each
server gave its closed-loop clients are reported too (`saturation_non_2xx`): on half a machine a server may shed them
into a storm of 429s, and a run where one side did measures that, not telemetry.

`--baseline-tree DIR` compares two versions of the code instead: "off" becomes the checkout in DIR (another git
worktree of this repository, run with the same interpreter) with the same telemetry as "on", so the throughput
loss reads as the cost of this tree's changes against DIR's (negative: this tree is cheaper).

The OTLP sink accepts and discards export requests (counting them), so its own decoding cost is not
charged to glassbox.

`--micro` times the observers alone on synthetic records (batches of 8 one-text requests, as the server sees
them), part by part, in CPU microseconds per request: metrics, spans on the calling thread, spans in the export
thread (building and encoding the OTLP request, without the socket), the JSON log line, and all of it composed as
`build_telemetry` does. CPU time, not wall time, so it holds on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.checkout import environment, glassbox_command
from benchmarks.serving import ROOT, free_port, wait_ready, wrk
from glassbox.chaos.stats import bootstrap_percentile
from glassbox.service.bench.measure import emit

PER_BATCH = 8


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


def start_server(model_dir: Path, port: int, extra: list[str], log: Path, root: Path = ROOT
                 ) -> subprocess.Popen[bytes]:
    """`glassbox serve` from the checkout in `root` (benchmarks.checkout: its code first on PYTHONPATH)."""
    cmd = [*glassbox_command(root), "serve", "--model", str(model_dir), "--device", "cpu", "--port", str(port), *extra]
    handle = log.open("wb")
    return subprocess.Popen(cmd, cwd=root, stdout=handle, stderr=subprocess.STDOUT,
                            env=environment(root, dict(os.environ, PYTHONUNBUFFERED="1")))


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def cpu_per_request_us(pid: int, before: dict[int, float], after: dict[int, float],
                       requests: float) -> dict[str, float]:
    spent = {tid: t - before.get(tid, 0.0) for tid, t in after.items()}
    loop = spent.get(pid, 0.0)  # the main thread runs the event loop
    total = sum(spent.values())
    scale = 1e6 / max(requests, 1.0)
    return {"loop": loop * scale, "other_threads": (total - loop) * scale, "total": total * scale}


def serve(args: argparse.Namespace) -> dict[str, Any]:
    from glassbox.service.bench.measure import machine
    from glassbox.service.bench.mix import read_mix
    from glassbox.service.model.default import default_model_dir
    from glassbox.service.model.loader import load_model

    model_dir = args.model or default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="glassbox-overhead-"))
    bodies = work / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ports = {"on": free_port(), "off": free_port()}
    on_args = ["--telemetry", "--otlp-endpoint", f"http://127.0.0.1:{sink.server_address[1]}",
               "--otlp-protocol", "http/protobuf", "--log-format", "json", "--log-level", "info", *args.on_args]
    off_args = ["--no-telemetry", "--log-level", "warning"]
    logs: list[Path] = []

    def start_pair() -> dict[str, subprocess.Popen[bytes]]:
        index = len(logs) // 2
        logs.extend((work / f"on-{index}.log", work / f"off-{index}.log"))
        pair = {
            "on": start_server(model_dir, ports["on"], off_args if args.same else on_args, logs[-2]),
            # Off: telemetry off, or (--baseline-tree) the other checkout with the same telemetry on.
            "off": start_server(model_dir, ports["off"], on_args, logs[-1], args.baseline_tree.resolve())
            if args.baseline_tree else start_server(model_dir, ports["off"], off_args, logs[-1]),
        }
        try:
            for port in ports.values():
                wait_ready(f"http://127.0.0.1:{port}")
                wrk(f"http://127.0.0.1:{port}", bodies, 8, 3)  # warm-up
        except BaseException:
            stop_pair(pair)
            raise
        return pair

    def stop_pair(pair: dict[str, subprocess.Popen[bytes]]) -> None:
        for proc in pair.values():
            proc.terminate()
        for proc in pair.values():
            proc.wait(timeout=60)

    servers: dict[str, subprocess.Popen[bytes]] = {}
    runs: dict[str, dict[str, list[Any]]] = {k: {"rps": [], "p50_ms": [], "cpu_us": [], "non_2xx": []} for k in ports}

    def saturate(name: str) -> None:
        url, pid = f"http://127.0.0.1:{ports[name]}", servers[name].pid
        before = thread_cpu_s(pid)
        result = wrk(url, bodies, args.connections, args.duration)
        rps = result["requests_per_s"]  # answered 200 only
        runs[name]["cpu_us"].append(cpu_per_request_us(pid, before, thread_cpu_s(pid), rps * args.duration))
        runs[name]["rps"].append(rps)
        # A server that sheds its closed-loop clients (429, each answered at once and sent again) spends CPU on
        # refusals: a round where one side did is no measure of telemetry.
        runs[name]["non_2xx"].append(int(result["non_2xx"]))

    def one_client(name: str) -> None:
        runs[name]["p50_ms"].append(wrk(f"http://127.0.0.1:{ports[name]}", bodies, 1, args.duration)["p50_ms"])

    try:
        for round_index in range(args.rounds):
            if not servers or args.servers == "per-round":
                stop_pair(servers)
                servers = start_pair()
            order = ["on", "off"] if round_index % 2 == 0 else ["off", "on"]
            if args.together:  # both at once: whatever else loads the machine loads both alike
                with ThreadPoolExecutor(2) as pool:
                    list(pool.map(saturate, order))
                    list(pool.map(one_client, order))
                continue
            # The two saturation runs back to back, then the two one-client runs: each pair that is compared ran
            # seconds apart, so what else loads the machine changes less between them.
            for name in order:
                saturate(name)
            for name in reversed(order):
                one_client(name)
    finally:
        stop_pair(servers)
        sink.shutdown()
    log_lines = sum(1 for log in logs[::2] for line in log.read_text().splitlines() if '"route"' in line)
    median: dict[str, dict[str, Any]] = {}
    for name, r in runs.items():
        median[name] = {"rps": statistics.median(r["rps"]), "p50_ms": statistics.median(r["p50_ms"]),
                        "cpu_us": {part: statistics.median(c[part] for c in r["cpu_us"]) for part in r["cpu_us"][0]}}
    on, off = median["on"], median["off"]
    loss = paired_loss(runs["on"]["rps"], runs["off"]["rps"])
    return {
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "texts": len(texts),
        "rounds": args.rounds, "duration_s": args.duration, "connections": args.connections, "on_args": args.on_args,
        "together": args.together, "servers": args.servers, "same": args.same,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "runs": runs, "median": median,
        "otlp_exports": sink.exports, "otlp_bytes": sink.bytes, "request_log_lines": log_lines,
        "saturation_non_2xx": {name: sum(r["non_2xx"]) for name, r in runs.items()},
        "throughput_loss": 1 - on["rps"] / off["rps"],
        **loss,
        "p50_delta_ms": on["p50_ms"] - off["p50_ms"],
        "extra_cpu_us_per_request": {part: on["cpu_us"][part] - off["cpu_us"][part] for part in on["cpu_us"]},
    }


def paired_loss(on_rps: Sequence[float], off_rps: Sequence[float]) -> dict[str, Any]:
    """Throughput loss of "on" against "off", paired per round so that one slow round does not decide it: the median
    of the rounds' losses with its bootstrap 95% interval, and the losses, sorted."""
    pairs = [1 - a / b for a, b in zip(on_rps, off_rps, strict=True)]
    median = bootstrap_percentile(np.array(pairs, dtype=np.float64), 50.0)
    if median is None:
        raise ValueError("no rounds to compare")
    return {"throughput_loss_median_of_rounds": median.point, "throughput_loss_median_ci95": [median.low, median.high],
            "throughput_loss_rounds": sorted(pairs)}


# --- micro: the observers alone ----------------------------------------------------------------------------------
def synthetic(requests: int) -> list[tuple[str, Any]]:
    """("batch", BatchRecord) then ("request", RequestRecord) x PER_BATCH, as the engine thread and loop report."""
    from glassbox.service.observer import STAGES, BatchRecord, HttpInfo, RequestRecord, StageSpan
    from glassbox.service.types import Bucket, EngineTiming

    events: list[tuple[str, Any]] = []
    perf, wall = time.perf_counter_ns(), time.time_ns()
    for batch_id in range(max(1, requests // PER_BATCH)):
        ids = tuple(f"{batch_id:08x}-{i:04x}-4a1b-9c2d-00000000{i:04x}" for i in range(PER_BATCH))
        timing = EngineTiming(perf + 2_000_000, perf + 22_000_000, "cpu", "eager", rows=PER_BATCH,
                              real_tokens=28 * PER_BATCH, padded_tokens=32 * PER_BATCH, bucket=Bucket(PER_BATCH, 32))
        events.append(("batch", BatchRecord(batch_id, timing, ids, 3)))
        for i, request_id in enumerate(ids):
            # What the ASGI scope gives a live request (wrk's connections: one port each), for the server span's
            # HTTP attributes.
            http = HttpInfo("/v1/classify", "", "http", "1.1", ("127.0.0.1", 40000 + (batch_id * PER_BATCH + i) % 64),
                            ("127.0.0.1", 8000), "127.0.0.1:8000", "wrk/4.2.0")
            edges = [perf, perf + 40_000, perf + 140_000, perf + 2_000_000, perf + 22_000_000, perf + 22_100_000]
            stages = tuple(StageSpan(name, edges[k], edges[k + 1]) for k, name in enumerate(STAGES))
            events.append(("request", RequestRecord(
                request_id, "/v1/classify", "POST", 200, None, perf, edges[-1], stages, texts=1, tokens=28,
                max_tokens=28, device="cpu", engine_mode="eager", batch_ids=(batch_id,), wall_start_ns=wall,
                http=http)))
        perf += 25_000_000
        wall += 25_000_000
    return events


class EncodingExporter:
    """Turns what the span processor hands over into an OTLP request, as the OTLP/HTTP exporter does before its
    socket, and keeps the CPU time that took (works for span items and for ReadableSpans alike)."""

    takes_items = True

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.bytes = 0
        self._wire: Any = None

    def export(self, batch: Sequence[Any]) -> Any:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import SpanExportResult

        start = time.thread_time()
        if batch and not isinstance(batch[0], ReadableSpan):
            from glassbox.telemetry.otlpwire import WireEncoder, encode_items

            self._wire = self._wire or WireEncoder({"service.name": "glassbox", "service.version": "0.1.0"})
            data = encode_items(self._wire, batch)
        else:
            data = encode_spans(batch).SerializePartialToString()
        self.bytes += len(data)
        self.cpu_s += time.thread_time() - start
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


Part = Callable[[Path], tuple[Any, Callable[[], None], EncodingExporter | None]]


def _settings(**values: Any) -> Any:
    from glassbox.service.settings import load_settings

    return load_settings(values, environ={})


def _metrics_part(_: Path) -> tuple[Any, Callable[[], None], None]:
    from prometheus_client import CollectorRegistry

    from glassbox.telemetry.metrics import build_metrics
    from glassbox.telemetry.observer import MetricsObserver

    trace_id = "0af7651916cd43dd8448eb211c80319c"
    return MetricsObserver(build_metrics(CollectorRegistry()), ["/v1/classify"], trace_ids=lambda r: trace_id), \
        lambda: None, None


def _spans_part(_: Path) -> tuple[Any, Callable[[], None], EncodingExporter]:
    from glassbox.telemetry.otlp import build_tracing

    exporter = EncodingExporter()
    tracing = build_tracing(_settings(), exporter=exporter)  # type: ignore[arg-type]
    assert tracing is not None
    return tracing.observer, tracing.shutdown, exporter


def _logs_part(work: Path) -> tuple[Any, Callable[[], None], None]:
    from glassbox.telemetry.logs import LogObserver, configure_logging

    stream = (work / "micro-logs.jsonl").open("w")
    logger = logging.getLogger("glassbox.bench.request")
    logger.propagate = False
    setup = configure_logging(_settings(), stream=stream, logger=logger)

    def close() -> None:
        setup.close()
        stream.close()

    return LogObserver(logger), close, None


def _all_part(work: Path) -> tuple[Any, Callable[[], None], EncodingExporter]:
    from glassbox.telemetry.logs import configure_logging
    from glassbox.telemetry.setup import build_telemetry

    stream = (work / "micro-all.jsonl").open("w")
    setup = configure_logging(_settings(), stream=stream)
    exporter = EncodingExporter()
    telemetry = build_telemetry(_settings(otlp_endpoint="http://127.0.0.1:9"), span_exporter=exporter)
    telemetry.metrics_observer.allow_routes(["/v1/classify"])
    observer = telemetry.compose()

    def close() -> None:
        asyncio.run(telemetry.stop())  # flushes and stops the span export, as at server shutdown
        setup.close()
        stream.close()

    return observer, close, exporter


PARTS: dict[str, Part] = {"metrics": _metrics_part, "spans": _spans_part, "logs": _logs_part, "all": _all_part}


def micro(requests: int, repeat: int) -> dict[str, Any]:
    # The span queue must hold everything one run makes (the loop here outruns any export thread): a dropped span
    # would flatter the figures. The BatchSpanProcessor reads its default size from this variable.
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(64 * requests)
    work = Path(tempfile.mkdtemp(prefix="glassbox-micro-"))
    results: dict[str, Any] = {}
    for name, make in PARTS.items():
        caller, export, total = [], [], []
        for _ in range(repeat):
            events = synthetic(requests)
            count = sum(1 for kind, _ in events if kind == "request")
            observer, finish, exporter = make(work)
            # As the server observes them: a batch's requests answered in one turn of the loop, inside one block of
            # an observer that holds its writes for the turn (the request log).
            block = getattr(observer, "buffered", contextlib.nullcontext)
            cpu0, own0 = time.process_time(), time.thread_time()
            for start in range(0, len(events), PER_BATCH + 1):
                observer.on_batch(events[start][1])
                with block():
                    for _, record in events[start + 1:start + 1 + PER_BATCH]:
                        observer.on_request(record)
            own = time.thread_time() - own0
            finish()  # exports what is queued: its CPU is in the process total
            total.append((time.process_time() - cpu0) / count * 1e6)
            caller.append(own / count * 1e6)
            export.append((exporter.cpu_s if exporter else 0.0) / count * 1e6)
        results[name] = {key: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                         for key, v in (("calling_thread_us", caller), ("export_encode_us", export),
                                        ("process_total_us", total))}
    return {"requests": requests, "repeat": repeat, "per_request": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=64,
                        help="wrk connections per server at saturation; keep it under what a server admits (with "
                             "--together on 2 cores, 16: at 32 they shed into 429 storms, see saturation_non_2xx)")
    parser.add_argument("--together", action="store_true",
                        help="load both servers at the same time (each gets about half the machine) instead of in turn")
    parser.add_argument("--on-args", nargs=argparse.REMAINDER, default=[],
                        help="extra `glassbox serve` flags for the telemetry-on server (last on the line)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="off = this checkout (a git worktree) with the same telemetry on, not --no-telemetry")
    parser.add_argument("--servers", choices=("per-round", "once"), default="per-round",
                        help="start a new pair of servers for every round (default), or one pair for the whole run: "
                             "two processes of the same server can differ by ~5% for the life of the pair")
    parser.add_argument("--same", action="store_true",
                        help="both servers with off's flags: the benchmark's own bias and spread, which a loss must "
                             "exceed to mean anything")
    parser.add_argument("--micro", action="store_true", help="time the observers alone, part by part")
    parser.add_argument("--requests", type=int, default=4000, help="--micro: synthetic requests per run")
    parser.add_argument("--repeat", type=int, default=7, help="--micro: runs per part")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = micro(args.requests, args.repeat) if args.micro else serve(args)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
