"""Where the CPU goes while the server carries a closed loop: each thread's run time and run-queue wait, and the
machine's idle and steal time.

    .venv/bin/python -m benchmarks.cpu_share [--connections 8] [--duration 10] [--json OUT] [-- SERVE ARGS...]

Starts `glassbox serve --device cpu` (the defaults, plus SERVE ARGS), warms it up, then runs `wrk -t1` with
`--connections` connections for `--duration` seconds over the default model's mix, one text per request. Around the
run it reads, per thread of the server, `/proc/<pid>/task/<tid>/schedstat` (time on a CPU, time runnable but waiting
for one) and the context switches, and the machine's CPU times (user, system, idle, steal; psutil). Shares are of one
core over the run: 100% is one core busy the whole time; the machine has as many hundreds as it has cores.

What it answers: whether the engine threads get less CPU than the offline engine has (and to whom it goes: the event
loop, the load generator, the hypervisor), or wait for something other than a CPU (idle share left on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.serving import wait_ready, wrk
from chaos.local import free_port
from service.bench.measure import emit, machine
from service.bench.mix import read_mix
from service.model.default import default_model_dir
from service.model.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def thread_stats(pid: int) -> dict[int, dict[str, Any]]:
    """Per thread of `pid`: name, ns on a CPU, ns waiting in a run queue, voluntary and involuntary switches."""
    out: dict[int, dict[str, Any]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            on_cpu, waiting, _ = (int(v) for v in Path(f"{base}/schedstat").read_text().split())
            status = dict(line.split(":", 1) for line in Path(f"{base}/status").read_text().splitlines()
                          if ":" in line)
            out[int(tid)] = {"name": status["Name"].strip(), "run_ns": on_cpu, "wait_ns": waiting,
                             "voluntary": int(status["voluntary_ctxt_switches"]),
                             "involuntary": int(status["nonvoluntary_ctxt_switches"])}
        except (OSError, KeyError, ValueError):  # the thread ended meanwhile
            continue
    return out


def machine_ticks() -> list[float]:
    """The machine's CPU seconds so far, one per STAT_FIELDS entry (psutil reads /proc/stat)."""
    times = psutil.cpu_times()
    return [getattr(times, name) for name in STAT_FIELDS]


def measure(connections: int, duration_s: int, serve_args: list[str]) -> dict[str, Any]:
    model_dir = default_model_dir()
    texts = read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts
    work = Path(tempfile.mkdtemp(prefix="glassbox-cpu-share-"))
    bodies = work / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    port = free_port()
    with (work / "server.log").open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "service", "serve", "--device", "cpu", "--port", str(port),
                                   *serve_args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        wrk(url, bodies, connections, 3)  # warm-up
        ticks, threads, start = machine_ticks(), thread_stats(server.pid), time.monotonic()
        result = wrk(url, bodies, connections, duration_s)
        elapsed = time.monotonic() - start
        ticks_after, threads_after = machine_ticks(), thread_stats(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    cores = os.cpu_count() or 1
    spent = [b - a for a, b in zip(ticks, ticks_after, strict=True)]
    total = sum(spent) or 1
    rows = []
    for tid, after in threads_after.items():
        before = threads.get(tid, {"run_ns": 0, "wait_ns": 0, "voluntary": 0, "involuntary": 0})
        run = (after["run_ns"] - before["run_ns"]) / 1e9 / elapsed
        if run < 0.005:
            continue
        rows.append({"tid": tid, "name": after["name"], "run_share": run,
                     "runqueue_share": (after["wait_ns"] - before["wait_ns"]) / 1e9 / elapsed,
                     "voluntary": after["voluntary"] - before["voluntary"],
                     "involuntary": after["involuntary"] - before["involuntary"]})
    rows.sort(key=lambda row: -row["run_share"])
    return {
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "connections": connections, "duration_s": duration_s, "serve_args": serve_args, "wrk": result,
        "machine_share": {name: cores * n / total for name, n in zip(STAT_FIELDS, spent, strict=True)},
        "threads": rows,
        "server_cpu_ms_per_request": sum(r["run_share"] for r in rows) * 1e3 / max(result["requests_per_s"], 1e-9),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration", type=int, default=10, help="seconds of measured load")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: extra `glassbox serve` arguments")
    args = parser.parse_args(argv)
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    result = measure(args.connections, args.duration, serve_args)
    share = result["machine_share"]
    print(f"{result['wrk']['requests_per_s']:.1f} req/s, mean batch {result['wrk']['mean_batch']:.2f}; machine "
          f"(100% = one core): user {share['user'] + share['nice']:.0%}, system {share['system']:.0%}, "
          f"idle {share['idle'] + share['iowait']:.0%}, steal {share['steal']:.0%}", file=sys.stderr)
    for row in result["threads"]:
        print(f"  {row['tid']:>7} {row['name']:<16} on a CPU {row['run_share']:6.1%}  waiting for one "
              f"{row['runqueue_share']:6.1%}  switches {row['voluntary']} voluntary, {row['involuntary']} forced",
              file=sys.stderr)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
