"""Serving benchmark: the server against the offline engine on the same text mix, per connection count.

    .venv/bin/python -m benchmarks.serving [--quantize int8] [--connections 1,8,32] [--duration 15] [--rounds 3]
        [--open-loop] [--serve-arg=--workers=1 ...] [--device cpu|cuda] [--wrk-threads 1] [--texts-per-request 1]
        [--json OUT]

Each round measures, one after the other on this machine (never two at once):
  1. the offline engine (the server's own engine class and settings, in this process): for each connection count c,
     the whole mix in length-sorted batches with c texts in flight, at its best: the faster of one batch of
     min(c, max batch) at a time on all cores and (c >= 2) two batches of half as many side by side, the cores
     shared between them, as the server runs them (seq/s, median of 2 passes); and its batch-1 latency (median
     over single texts);
  2. `glassbox serve` with its default settings (plus any --serve-arg; its request log at the default level goes
     to a file), started once for the whole benchmark:
     for each c, `wrk -t1 -c<c>` with one text per request (POST /v1/classify, JSON), and the mean engine batch
     size over that run from the server's own /metrics (glassbox_batch_size sum and count);
  3. with --open-loop: `glassbox bench` offering 1.5x the offline rate at the largest batch from 256 connections,
     counting only 200s per second (the saturation a user sees when the server sheds the rest with 429).
`--texts-per-request N` sends N texts in each body (`{"texts": [...]}`); the offline engine then has c x N texts in
flight at c connections, and the ratio is served texts/s over offline seq/s.
Reported per connection count: served req/s (200s only: wrk's rate scaled by its share of 2xx answers; refusals,
counted in non_2xx, are left out), served texts/s, offline seq/s, their ratio, mean batch size, P50/P99, and the
mean latency minus the same requests' mean infer stage (the server's own /metrics over the run: the time outside the
engine); and one-client P50 minus the engine's batch-1 P50. Ratios are taken within each round; the medians of rounds
are the results.
wrk and glassbox bench run on the same cores as the server: on a small machine they take CPU the server does not get.

`--device cuda` measures a GPU host: the offline engine is then the server's own GPU engine (`build_engine`: CUDA
graphs on the server's buckets, one batch at a time, as the server runs them there) and the server is started with
`--device cuda`. `--wrk-threads N` gives wrk more threads where one cannot keep up with the server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client.parser import text_string_to_metric_families

from glassbox.chaos.local import free_port
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.engines.base import Engine
from glassbox.service.engines.factory import build_engine
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model
from glassbox.service.settings import Settings
from glassbox.service.tokenizer import TextTokenizer

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "benchmarks" / "wrk" / "classify.lua"
MAX_BATCH = Settings().max_batch_size


def batch_ways(connections: int, threads: int, device: str) -> dict[int, int]:
    """The ways the offline engine may run `connections` texts in flight, as {batches side by side: rows a batch}: one
    batch of up to the largest at a time; on the CPU with 2 threads or more, also two of half as many side by side.
    A GPU engine runs one batch at a time, as the server runs it there."""
    ways = {1: min(connections, MAX_BATCH)}
    if connections >= 2 and threads >= 2 and device == "cpu":
        ways[2] = min(connections // 2, MAX_BATCH)
    return ways


class Offline:
    """The server's engine, in this process, on the mix tokenized once."""

    def __init__(self, model_dir: Path, texts: list[str], quantize: str, device: str = "cpu",
                 cpu_dtype: str = "auto") -> None:
        loaded = load_model(model_dir)
        # The server's own choices: on the CPU its number format (auto runs the same gate on the same texts, so both
        # sides compute in the same format), on a GPU its graph engine.
        settings = Settings().replace(quantize=quantize, cpu_dtype=cpu_dtype)
        tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, settings.max_length,
                                            loaded.config.max_position_embeddings)
        self.device = device
        self.engine: Engine
        self.engine = build_engine(loaded, settings, "cuda:0" if device == "cuda" else "cpu", tokenizer.max_length)
        self.engine.warmup()
        self.encoded = tokenizer.encode(texts)
        self.order = np.argsort(self.encoded.lengths, kind="stable")

    def rate(self, connections: int, passes: int = 2) -> float:
        """Sequences per second with `connections` texts in flight, at the engine's best: one length-sorted batch
        of min(connections, max batch) at a time on all cores, or (for 2 connections or more) two batches of half
        as many side by side, the cores shared between them, as the server can run them. Median of `passes`
        passes per way; the faster way counts, and `last_modes` keeps both."""
        ways = batch_ways(connections, torch.get_num_threads(), self.device)
        rates = {side_by_side: self.pass_rate(batch_size, side_by_side, passes=passes)
                 for side_by_side, batch_size in ways.items()}
        self.last_modes = rates
        return max(rates.values())

    def pass_rate(self, batch_size: int, side_by_side: int, order: Any = None, passes: int = 2) -> float:
        """Sequences per second over the mix in `order` (indices; default: sorted by length) cut into batches of
        `batch_size`, `side_by_side` batches running at once on threads that share the cores; median of `passes`."""
        order = self.order if order is None else order
        cores = torch.get_num_threads()
        batches = [self.encoded.select(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]
        torch.set_num_threads(max(1, cores // side_by_side))
        try:
            for batch in batches[:4]:
                self.engine.run(batch)
            rates = []
            for _ in range(passes):
                start = time.perf_counter()
                if side_by_side == 1:
                    # On this (the main) thread: the only thread whose OpenMP team is not slowed by a second one (see
                    # docs/benchmarks/2026-12-04-openmp-teams.md), so the engine at its best.
                    self._run_all(batches)
                else:
                    threads = [threading.Thread(target=self._run_all, args=(batches[i::side_by_side],))
                               for i in range(side_by_side)]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                rates.append(len(order) / (time.perf_counter() - start))
        finally:
            torch.set_num_threads(cores)
        return statistics.median(rates)

    def _run_all(self, batches: list[Any]) -> None:
        for batch in batches:
            self.engine.run(batch)

    def batch1_ms(self, samples: int = 300) -> float:
        step = max(1, self.encoded.size // samples)
        times = []
        for i in range(0, self.encoded.size, step):
            batch = self.encoded.select([i])
            start = time.perf_counter_ns()
            self.engine.run(batch)
            times.append((time.perf_counter_ns() - start) / 1e6)
        return statistics.median(times)


def stop_on_sigterm() -> None:
    """Turn SIGTERM (a `timeout` around the benchmark) into SystemExit, so that the `finally` blocks stop the servers
    it started instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not become ready in {timeout_s} s")


def engine_totals(url: str) -> dict[str, float]:
    """The sums and counts behind the mean batch size and the mean infer stage, from the server's /metrics; zeros for
    a server without one (`--no-telemetry`)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            return parse_totals(response.read().decode())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return parse_totals("")
        raise


def parse_totals(text: str) -> dict[str, float]:
    """glassbox_batch_size's sum and count, and glassbox_stage_duration_seconds' for stage="infer" (every device)."""
    totals = {"batch_sum": 0.0, "batch_count": 0.0, "infer_sum": 0.0, "infer_count": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name not in ("glassbox_batch_size", "glassbox_stage_duration_seconds"):
            continue
        prefix = "batch" if family.name == "glassbox_batch_size" else "infer"
        for sample in family.samples:
            kind = sample.name.removeprefix(family.name + "_")
            if kind in ("sum", "count") and (prefix == "batch" or sample.labels.get("stage") == "infer"):
                totals[f"{prefix}_{kind}"] += sample.value
    return totals


def wrk(url: str, bodies: Path, connections: int, duration_s: int, threads: int = 1) -> dict[str, float]:
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(LUA), url, "--",
           str(bodies)]
    before = engine_totals(url)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = engine_totals(url)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _wrk_ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _wrk_ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    mean = _wrk_ms(re.search(r"Latency\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    non_2xx = int(errors.group(1)) if errors else 0
    # Served means answered 200: a refusal (429) is fast and would inflate the rate. wrk's latency percentiles
    # cover every response, refusals included.
    result = {"requests_per_s": rps * (total - non_2xx) / total if total else 0.0, "all_per_s": rps, "p50_ms": p50,
              "p99_ms": p99, "mean_ms": mean, "non_2xx": non_2xx, **batch_means(before, after)}
    if result["infer_mean_ms"]:
        # The same requests' time outside the engine (HTTP, parse, tokenize, queue, hand-overs, postprocess): one
        # run's own figure, not a difference between two measurements minutes apart.
        result["outside_engine_ms"] = mean - result["infer_mean_ms"]
    return result


def batch_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean batch size and mean infer stage (ms) between two engine_totals readings; 0 where nothing ran."""
    batches = after["batch_count"] - before["batch_count"]
    inferred = after["infer_count"] - before["infer_count"]
    return {"mean_batch": (after["batch_sum"] - before["batch_sum"]) / batches if batches else 0.0,
            "infer_mean_ms": (after["infer_sum"] - before["infer_sum"]) * 1000 / inferred if inferred else 0.0}


def _wrk_ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def open_loop(url: str, rate: float, duration_s: int, texts: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "glassbox.service", "bench", "--target", url, "--rate", f"{rate:.0f}", "--duration",
           str(duration_s), "--connections", "256", "--texts", str(texts), "--json", "--no-progress"]
    before = engine_totals(url)
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    after = engine_totals(url)
    latency = result["latency_ms"]
    return {"offered_per_s": rate, "ok_per_s": result["ok_rate"], "errors": result["counts"]["errors"],
            "error_kinds": result["errors"], "p50_ms": latency.get("p50", 0.0), "p99_ms": latency.get("p99", 0.0),
            "mean_batch": batch_means(before, after)["mean_batch"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--quantize", choices=("none", "int8"), default="none")
    parser.add_argument("--cpu-dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="the server's and the offline engine's CPU number format (default: %(default)s)")
    parser.add_argument("--connections", default="1,8,32", help="comma-separated connection counts")
    parser.add_argument("--duration", type=int, default=15, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--open-loop", action="store_true", help="also measure open-loop saturation")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `glassbox serve` flag (repeatable)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the offline engine and the server run (default: %(default)s)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default: %(default)s)")
    parser.add_argument("--texts-per-request", type=int, default=1,
                        help="texts in each request's body ({\"texts\": [...]}; default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args(argv)
    per_request = args.texts_per_request
    if per_request < 1:
        parser.error("--texts-per-request must be at least 1")
    if shutil.which("wrk") is None:
        print("serving benchmark: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    stop_on_sigterm()
    levels = [int(c) for c in args.connections.split(",")]
    model_dir = args.model or default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)
    offline = Offline(model_dir, texts, args.quantize, args.device, args.cpu_dtype)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(model_dir), "--device", args.device,
           "--port", str(port), "--quantize", args.quantize, "--cpu-dtype", args.cpu_dtype, *args.serve_arg]
    folder = Path(tempfile.mkdtemp(prefix="glassbox-serving-"))
    bodies, plain = folder / "bodies.jsonl", folder / "texts.txt"
    if per_request == 1:
        bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    else:  # each body the next `per_request` texts of the mix, round the end
        cycle = texts * (1 + per_request // len(texts))
        bodies.write_text("".join(json.dumps({"texts": cycle[i:i + per_request]}) + "\n"
                                  for i in range(0, len(texts), per_request)))
    plain.write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
    rounds: list[dict[str, Any]] = []
    # The server logs as it does by default (a JSON line per notable request, at info) into a file, as under a container
    # runtime that collects its output: a quieter log level would measure a server nobody runs.
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        try:
            wait_ready(url)
        except Exception:
            log.flush()
            print((folder / "server.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        wrk(url, bodies, 8, 3, args.wrk_threads)  # warm the server's code paths
        for _ in range(args.rounds):
            one: dict[str, Any] = {"batch1_ms": offline.batch1_ms(), "levels": {}}
            for c in levels:
                rate = offline.rate(c * per_request)  # as many texts in flight as the clients keep in the server
                modes = {f"offline_{k}_at_a_time": v for k, v in offline.last_modes.items()}
                served = wrk(url, bodies, c, args.duration, min(args.wrk_threads, c))
                texts_per_s = served["requests_per_s"] * per_request
                one["levels"][str(c)] = {"offline_seq_per_s": rate, **modes, **served, "texts_per_s": texts_per_s,
                                         "ratio": texts_per_s / rate}
            if args.open_loop:
                rate = offline.rate(2 * MAX_BATCH)
                served = open_loop(url, 1.5 * rate, args.duration, plain)
                one["open_loop"] = {"offline_seq_per_s": rate, **served, "ratio": served["ok_per_s"] / rate}
            if 1 in levels:
                one["one_client_overhead_ms"] = one["levels"]["1"]["p50_ms"] - one["batch1_ms"]
                if "outside_engine_ms" in one["levels"]["1"]:
                    one["one_client_outside_engine_ms"] = one["levels"]["1"]["outside_engine_ms"]
            rounds.append(one)
            print(json.dumps(one), file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
    results: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "command": " ".join(["python -m benchmarks.serving", *(argv or sys.argv[1:])]),
                               "device": args.device, "quantize": args.quantize, "engine": offline.engine.kind,
                               "serve_args": args.serve_arg, "texts_per_request": per_request,
                               "texts": len(texts), "rounds": rounds, "median": _medians(rounds)}
    emit(results, args.json)
    return 0


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    medians: dict[str, Any] = {"batch1_ms": med([r["batch1_ms"] for r in rounds]), "levels": {}}
    for level in rounds[0]["levels"]:
        fields = ("requests_per_s", "texts_per_s", "offline_seq_per_s", "ratio", "mean_batch", "p50_ms", "p99_ms",
                  "non_2xx", "mean_ms", "infer_mean_ms", "outside_engine_ms")
        medians["levels"][level] = {f: med([r["levels"][level][f] for r in rounds]) for f in fields
                                    if all(f in r["levels"][level] for r in rounds)}
    if "open_loop" in rounds[0]:
        open_fields = ("ok_per_s", "offline_seq_per_s", "ratio", "mean_batch", "p50_ms", "p99_ms", "errors")
        medians["open_loop"] = {f: med([r["open_loop"][f] for r in rounds]) for f in open_fields}
    for key in ("one_client_overhead_ms", "one_client_outside_engine_ms"):
        if all(key in r for r in rounds):
            medians[key] = med([r[key] for r in rounds])
    return medians


if __name__ == "__main__":
    sys.exit(main())
