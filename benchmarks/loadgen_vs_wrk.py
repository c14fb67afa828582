"""`glassbox bench` against wrk and hey on the same server: its throughput should be within 10% of theirs.

    .venv/bin/python -m benchmarks.loadgen_vs_wrk [--model DIR] [--rounds 3] [--duration 10] [--json OUT]

Starts `glassbox serve` (default model, CPU, as benchmarks/serving.py does) and measures, interleaved in rounds
whose order rotates so a shared machine's drift falls on every tool alike:

  saturation, the model's held-out mix (one text per request, cycling):
    wrk -t1 -c64 (benchmarks/wrk/classify.lua)  vs  glassbox bench at twice wrk's rate on 64 connections with
    --max-outstanding 256: a line of up to 192 due requests waits for the 64 connections, so a connection that
    frees up is reused at once, as wrk does, and what is due beyond that is refused as backlog (never sent), so
    the drain after the window stays short;
  saturation, one fixed body (hey can send only one): wrk, hey -c64 and glassbox bench, as above;
  a fixed rate below saturation (half of it), one fixed body: hey -c8 -q (per-worker rate) vs glassbox bench
    --rate, comparing achieved rate and latency percentiles.

glassbox bench's figure is its ok/s within the schedule's window (2xx answers; backlog requests were never sent).
hey -q is a per-worker rate and hey's workers tick in step, so its "fixed rate" arrives in bursts of -c requests.
Each client's CPU (user + sys) is reported per 1000 requests, because on 2 cores the client's CPU is CPU the server
does not get: wrk's and hey's from getrusage of the child, glassbox bench's as it reports it for the run itself
(its start-up, mostly imports, is left out).
Ratios are per round (glassbox bench over the tool run next to it), and the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.serving import ROOT, free_port, wait_ready, wrk
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one client; add the CPU seconds it used."""
    before = child_cpu_s()
    result = run()
    result["client_cpu_s"] = child_cpu_s() - before
    return result


def hey(url: str, body: Path, connections: int, duration_s: int, qps_per_worker: float | None = None
        ) -> dict[str, Any]:
    cmd = ["hey", "-z", f"{duration_s}s", "-c", str(connections), "-m", "POST", "-T", "application/json",
           "-D", str(body)]
    if qps_per_worker is not None:
        cmd += ["-q", f"{qps_per_worker:g}"]
    out = subprocess.run([*cmd, url + "/v1/classify"], capture_output=True, text=True, check=True).stdout
    statuses = {int(code): int(n) for code, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    percentile = {p: float(v) * 1e3 for p, v in re.findall(r"(\d+)%+ in ([\d.]+) secs", out)}
    return {"requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
            "ok": statuses.get(200, 0), "non_2xx": sum(n for code, n in statuses.items() if code != 200),
            "errors": "Error distribution" in out,
            "p50_ms": percentile.get("50"), "p90_ms": percentile.get("90"), "p99_ms": percentile.get("99")}


def bench(url: str, texts: Path, rate: float, duration_s: int, connections: int,
          max_outstanding: int | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "glassbox.service", "bench", "--target", url, "--rate", f"{rate:g}", "--duration",
           str(duration_s), "--connections", str(connections), "--texts", str(texts), "--json", "--no-progress"]
    if max_outstanding is not None:
        cmd += ["--max-outstanding", str(max_outstanding)]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    latency = out["latency_ms"]
    return {"ok_per_s": out["ok_rate"], "answered_per_s": out["achieved_rate"], "offered_per_s": out["offered_rate"],
            "ok": out["counts"]["ok"], "errors": {k: v for k, v in out["errors"].items() if v},
            "p50_ms": latency.get("p50"), "p90_ms": latency.get("p90"), "p99_ms": latency.get("p99"),
            "scheduler_lag_ms": out["scheduler_lag_ms"], "generator_cpu_s": out["generator_cpu_s"]}


def per_thousand(cpu_s: float, requests: float) -> float | None:
    return cpu_s / requests * 1e3 if requests > 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds per run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("wrk", "hey") if shutil.which(tool) is None]
    if missing:
        print(f"loadgen_vs_wrk: {', '.join(missing)} not installed (apt-get install wrk hey)", file=sys.stderr)
        return 2
    model_dir = args.model or default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)
    one = sorted(texts, key=len)[len(texts) // 2]  # the median-length snippet: hey sends a single body
    work = Path(tempfile.mkdtemp(prefix="loadgen-vs-wrk-"))
    (work / "mix.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (work / "mix.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
    (work / "one.jsonl").write_text(json.dumps({"text": one}) + "\n")
    (work / "one.txt").write_text(one + "\n")
    (work / "one.json").write_text(json.dumps({"text": one}))
    results: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "model": str(model_dir), "texts": len(texts), "one_text": one,
                               "duration_s": args.duration, "connections": args.connections,
                               "load_average_start": os.getloadavg()}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(model_dir), "--device", "cpu", "--port",
           str(port), "--max-batch-size", "32", "--log-level", "warning"]
    server = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)
    c, d = args.connections, args.duration
    try:
        wait_ready(url)
        wrk(url, work / "mix.jsonl", 8, 3)  # warm the server's code paths
        estimate = wrk(url, work / "mix.jsonl", c, 5)["requests_per_s"]
        results["saturation_estimate"] = estimate
        fixed = round(estimate / 2)
        results["fixed_rate"] = fixed
        runs: dict[str, Callable[[], dict[str, Any]]] = {
            "wrk_mix": lambda: wrk(url, work / "mix.jsonl", c, d),
            "bench_mix": lambda: bench(url, work / "mix.txt", 2 * estimate, d, c, 4 * c),
            "wrk_one": lambda: wrk(url, work / "one.jsonl", c, d),
            "hey_one": lambda: hey(url, work / "one.json", c, d),
            "bench_one": lambda: bench(url, work / "one.txt", 2 * estimate, d, c, 4 * c),
            "hey_fixed": lambda: hey(url, work / "one.json", 8, d, fixed / 8),
            "bench_fixed": lambda: bench(url, work / "one.txt", fixed, d, 8, None),
        }
        rounds: list[dict[str, Any]] = []
        names = list(runs)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            this: dict[str, Any] = {"order": order}
            for name in order:
                this[name] = timed(runs[name])
                if name.startswith("bench"):
                    this[name]["client_cpu_s"] = this[name].pop("generator_cpu_s")
                print(f"round {r + 1} {name}: {json.dumps(this[name])}", file=sys.stderr)
            rounds.append(this)
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    results["rounds"] = rounds
    results["load_average_end"] = os.getloadavg()
    results["summary"] = summarize(rounds, d)
    emit(results, args.json)
    return 0


def summarize(rounds: list[dict[str, Any]], duration_s: int) -> dict[str, Any]:
    def rate(run: dict[str, Any]) -> float:
        return float(run["ok_per_s"] if "ok_per_s" in run else run["requests_per_s"])

    def median(key: str) -> float:
        return statistics.median(rate(r[key]) for r in rounds)

    def ratio(a: str, b: str) -> float:
        return statistics.median(rate(r[a]) / rate(r[b]) for r in rounds)

    def cpu(key: str) -> float | None:
        values = [per_thousand(r[key]["client_cpu_s"], rate(r[key]) * duration_s) for r in rounds]
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    keys = ("wrk_mix", "bench_mix", "wrk_one", "hey_one", "bench_one", "hey_fixed", "bench_fixed")
    return {
        "median_req_per_s": {k: median(k) for k in keys},
        "ratio_bench_over_wrk_mix": ratio("bench_mix", "wrk_mix"),
        "ratio_bench_over_wrk_one": ratio("bench_one", "wrk_one"),
        "ratio_bench_over_hey_one": ratio("bench_one", "hey_one"),
        "ratio_hey_over_wrk_one": ratio("hey_one", "wrk_one"),
        "fixed_rate_ratio_bench_over_hey": ratio("bench_fixed", "hey_fixed"),
        "fixed_rate_latency_ms": {
            k: {p: statistics.median(r[k][p] for r in rounds) for p in ("p50_ms", "p90_ms", "p99_ms")}
            for k in ("hey_fixed", "bench_fixed")},
        "client_cpu_s_per_1000_requests": {k: cpu(k) for k in keys},
        "within_10_percent": {
            "mix_vs_wrk": ratio("bench_mix", "wrk_mix") >= 0.9,
            "one_vs_wrk": ratio("bench_one", "wrk_one") >= 0.9,
            "one_vs_hey": ratio("bench_one", "hey_one") >= 0.9,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
