"""Serving benchmark (issue 3, item 8): the server against the offline engine on the same text mix.

    .venv/bin/python -m benchmarks.serving [--model DIR] [--duration 20] [--connections 32] [--json OUT]

Measures, in one run on this machine:
  1. offline engine throughput: length-sorted batches of `--batch-size` through the eager engine (texts/s), and the
     engine's batch-1 latency (median over single texts of the mix);
  2. server throughput at saturation: `wrk` with many connections, one text per request, the same mix;
  3. server latency at one client: `wrk -c1`, P50;
  4. parse cost per request for JSON and binary frames, in microseconds.
Reported as ratios: saturation / offline (target >= 0.85) and one-client P50 minus engine batch-1 latency (<= 2 ms).
wrk and the server share the same cores, so the saturation figure is a floor for a machine where they do not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chaos.local import free_port
from service.bench.measure import machine
from service.bench.mix import read_mix
from service.engines.eager import EagerEngine
from service.model.default import default_model_dir
from service.model.loader import load_model
from service.tokenizer import TextTokenizer
from service.wire import frames, json_api

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "benchmarks" / "wrk" / "classify.lua"


def offline(model_dir: Path, texts: list[str], batch_size: int, max_length: int) -> dict[str, float]:
    loaded = load_model(model_dir)
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, max_length, loaded.config.max_position_embeddings)
    engine = EagerEngine(loaded.model)
    engine.warmup()
    encoded = tokenizer.encode(texts)
    order = np.argsort(encoded.lengths, kind="stable")
    batches = [encoded.select(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    for batch in batches[:8]:
        engine.run(batch)
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        for batch in batches:
            engine.run(batch)
        rates.append(len(texts) / (time.perf_counter() - start))
    singles = [encoded.select([i]) for i in range(0, len(texts), max(1, len(texts) // 300))]
    one = []
    for batch in singles:
        t0 = time.perf_counter_ns()
        engine.run(batch)
        one.append((time.perf_counter_ns() - t0) / 1e6)
    return {"texts_per_s": statistics.median(rates), "batch1_p50_ms": statistics.median(one)}


def wait_ready(url: str, timeout_s: float = 120.0) -> None:
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


def wrk(url: str, bodies: Path, connections: int, duration_s: int) -> dict[str, float]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(LUA), url, "--", str(bodies)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _wrk_ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _wrk_ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"requests_per_s": rps, "p50_ms": p50, "p99_ms": p99, "non_2xx": int(errors.group(1)) if errors else 0}


def _wrk_ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def parse_costs(texts: list[str]) -> dict[str, float]:
    json_bodies = [json.dumps({"text": t}).encode() for t in texts[:200]]
    frame_bodies = [frames.encode_frames([t], [i]) for i, t in enumerate(texts[:200])]

    def per_request_us(decode: Any, bodies: list[bytes]) -> float:
        runs = timeit.repeat(lambda: [decode(b, max_texts=256) for b in bodies], number=20, repeat=5)
        return min(runs) / (20 * len(bodies)) * 1e6

    return {"json_us": per_request_us(json_api.decode, json_bodies),
            "frames_us": per_request_us(frames.decode, frame_bodies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--duration", type=int, default=20, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="offline batch size and the server's max batch")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("serving benchmark: wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    model_dir = args.model or default_model_dir()
    loaded = load_model(model_dir)
    texts = list(read_mix(model_dir / "heldout.jsonl", loaded.labels).texts)
    results: dict[str, Any] = {"machine": machine(), "torch": torch.__version__, "texts": len(texts),
                               "date": time.strftime("%Y-%m-%d"), "model": str(model_dir)}
    results["offline"] = offline(model_dir, texts, args.batch_size, args.max_length)
    results["parse"] = parse_costs(texts)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "service", "serve", "--model", str(model_dir), "--device", "cpu", "--port", str(port),
           "--max-batch-size", str(args.batch_size), "--log-level", "warning"]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
        handle.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        bodies = Path(handle.name)
    server = subprocess.Popen(cmd, env=env, cwd=ROOT)
    try:
        wait_ready(url)
        wrk(url, bodies, 8, 3)  # warm the server's code paths
        results["saturation"] = wrk(url, bodies, args.connections, args.duration)
        results["one_client"] = wrk(url, bodies, 1, args.duration)
    finally:
        server.terminate()
        server.wait(timeout=60)
        bodies.unlink()
    saturation, offline_rate = results["saturation"]["requests_per_s"], results["offline"]["texts_per_s"]
    results["ratio_saturation_over_offline"] = saturation / offline_rate
    results["one_client_p50_minus_engine_ms"] = results["one_client"]["p50_ms"] - results["offline"]["batch1_p50_ms"]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
