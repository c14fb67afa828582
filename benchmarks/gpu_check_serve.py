"""e2e_server: `glassbox serve` on the device under the open-loop load of `glassbox bench`, at rising rates.

The server runs in a child process through the `serve` command's own module (glassbox.service.server: `add_arguments`
and `run`, what `glassbox serve` calls), so nothing else of the CLI is imported there; it serves a BERT-base-sized
random model written to a temporary directory. The load comes from glassbox.chaos.loadgen, the engine of `glassbox
bench`, in this process: requests are timed from their intended send time. Each rate runs for a few seconds; the result
is each rate's latency and errors and the highest rate whose P99 stayed within 10 ms. The server runs with
--profiling: engine_trace then asks it for a one-second torch profiler trace under load and counts what it holds.

The server and the load generator need what a bare GPU host may lack (starlette, uvicorn, msgspec, httptools,
hdrhistogram...): a child process probes for them first, and the check is skipped, naming them, when they are
missing. `prepare-carry --serve-deps` (gpu_check_carry.py) brings them.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_book import CheckBook

P99_LIMIT_MS = 10.0
GPU_RATES = (100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0)
REHEARSAL_RATES = (5.0, 10.0)
READY_TIMEOUT_S = 240.0
PROFILE_TOKEN = "gpu-check-profile-token-0123456789"
SERVE_MODULES = ("glassbox.service.server", "glassbox.service.app", "glassbox.chaos.loadgen.generator")
SERVE = ("import argparse, sys\n"
         "from glassbox.service import server\n"
         "parser = argparse.ArgumentParser(prog='glassbox serve')\n"
         "server.add_arguments(parser)\n"
         "sys.exit(server.run(parser.parse_args(sys.argv[1:])))\n")


def child_env(extra_path: Path | None) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    parts = [str(Path(root) / ".pythonpath"), root,
             *([str(extra_path)] if extra_path is not None and extra_path.is_dir() else []),
             *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def missing_modules(extra_path: Path | None) -> list[str]:
    """What the server and the load generator would fail to import here, asked of a fresh interpreter."""
    probe = ("import importlib, json\nmissing = []\n"
             f"for name in {SERVE_MODULES!r}:\n"
             "    try:\n        importlib.import_module(name)\n"
             "    except ImportError as exc:\n        missing.append(exc.name or str(exc))\n"
             "print(json.dumps(missing))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env(extra_path),
                          timeout=120, check=False)
    if done.returncode != 0:
        return [f"probe failed: {done.stderr.strip()[-300:]}"]
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server was not ready within {timeout_s:.0f}s")


def offer(target: str, rate: float, seconds: float) -> dict[str, Any]:
    from glassbox.chaos.loadgen.generator import LoadConfig, LoadGenerator
    from glassbox.chaos.loadgen.plan import RatePlan

    config = LoadConfig(target=target, plan=RatePlan.of("steady", rate, seconds), connections=64, timeout_s=10.0,
                        keep_samples=False)
    result = asyncio.run(LoadGenerator(config).run(progress=False))
    latency = result.percentiles()
    return {"rate": rate, "seconds": seconds, "achieved_rate": result.achieved_rate, "ok": result.ok,
            "errors": sum(result.errors.values()), "p50_ms": latency.get("p50"), "p99_ms": latency.get("p99")}


def serve_check(book: CheckBook, rehearsal: bool, model_dir: Path, extra_path: Path | None,
                seconds_per_rate: float) -> None:
    missing = missing_modules(extra_path)
    if missing:
        reason = (f"cannot import {', '.join(sorted(set(missing)))} here: run prepare-carry --serve-deps where "
                  "glassbox is installed and bring out/gpu-carry/site along")
        book.skip("e2e_server", reason)
        book.skip("engine_trace", reason)
        return
    if extra_path is not None and str(extra_path) not in sys.path:
        sys.path.insert(0, str(extra_path))  # the load generator runs here, after the import check at start
    log_dir = Path(tempfile.mkdtemp(prefix="gpu-check-serve-"))
    port = free_port()
    command = [sys.executable, "-c", SERVE, "--model", str(model_dir), "--device", "cpu" if rehearsal else "cuda",
               "--host", "127.0.0.1", "--port", str(port), "--log-format", "text", "--log-level", "warning",
               "--profiling"]
    with (log_dir / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                  env={**child_env(extra_path), "GLASSBOX_PROFILE_TOKEN": PROFILE_TOKEN})
    target = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(target, server, READY_TIMEOUT_S)
        steps = []
        for rate in REHEARSAL_RATES if rehearsal else GPU_RATES:
            step = offer(target, rate, seconds_per_rate)
            steps.append(step)
            if step["errors"] or step["p99_ms"] is None or step["p99_ms"] > P99_LIMIT_MS:
                break  # past the knee: higher rates only queue up
        within = [s["rate"] for s in steps if not s["errors"] and s["p99_ms"] is not None
                  and s["p99_ms"] <= P99_LIMIT_MS]
        ok = bool(steps) and steps[0]["errors"] == 0 and steps[0]["ok"] > 0
        book.record("e2e_server", ok, device="cpu" if rehearsal else "cuda", ready_s=ready_s, steps=steps,
                    best_rate_within_p99_ms={"limit_ms": P99_LIMIT_MS, "rate": max(within) if within else None},
                    model="BERT-base-sized, random weights" if not rehearsal else "rehearsal stand-in")
    except Exception as exc:
        book.error("e2e_server", exc, server_log=_tail(log_dir / "server.log"))
    try:
        if server.poll() is None:
            trace_check(book, target, rehearsal)
        else:
            book.error("engine_trace", RuntimeError(f"the server exited with code {server.returncode}"))
    except Exception as exc:
        book.error("engine_trace", exc, server_log=_tail(log_dir / "server.log"))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(log_dir, ignore_errors=True)


def trace_check(book: CheckBook, target: str, rehearsal: bool) -> None:
    """A one-second trace of the engine while the first rate's load runs; on a GPU it must hold CUDA kernels, on
    the CPU the model's operators on an engine thread."""
    load = threading.Thread(target=offer, args=(target, (REHEARSAL_RATES if rehearsal else GPU_RATES)[0], 4.0),
                            name="gpu-check-trace-load")
    load.start()
    try:
        time.sleep(0.5)  # the load is flowing
        request = urllib.request.Request(target + "/debug/trace?seconds=1", method="POST",
                                         headers={"Authorization": f"Bearer {PROFILE_TOKEN}"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=120) as answer:
            body = answer.read()
        answer_s = time.monotonic() - started
    finally:
        load.join()
    trace = json.loads(gzip.decompress(body))
    events = trace.get("traceEvents", [])
    threads = {e.get("tid"): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    kernels = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")
    engine_ops = sum(1 for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("aten::")
                     and str(threads.get(e.get("tid"), "")).startswith("glassbox-engine"))
    graph_launches = sum(1 for e in events if e.get("name") == "cudaGraphLaunch")
    ok = engine_ops > 0 if rehearsal else kernels > 0
    book.record("engine_trace", ok, gzipped_bytes=len(body), answer_s=round(answer_s, 2), events=len(events),
                kernels=kernels, engine_thread_ops=engine_ops, graph_launches=graph_launches)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
