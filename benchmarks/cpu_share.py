"""Where the CPU goes while the server carries a closed loop: each thread's run time and run-queue wait, per process
and per kind of thread, and the machine's idle and steal time.

    .venv/bin/python -m benchmarks.cpu_share [--connections 8] [--duration 10] [--device cpu|cuda] [--model DIR]
        [--wrk-threads 1] [--serve-arg=--workers=8 ...] [--json OUT] [-- SERVE ARGS...]

Starts `glassbox serve --device DEVICE` (the defaults, plus the serve arguments), warms it up, then runs `wrk` with
`--connections` connections for `--duration` seconds over the model's held-out mix, one text per request. Around the
run it reads, for every thread of the server and of the processes it started (`--workers`: the engine process and
the HTTP workers), `/proc/<pid>/task/<tid>/schedstat` (time on a CPU, time runnable but waiting for one) and the
context switches, and the machine's CPU times (user, system, idle, steal; psutil). Shares are of one core over the
run: 100% is one core busy the whole time; the machine has as many hundreds as it has cores.

Each thread is put in a process and a kind, both inferred from outside, not told by the server. The process (as
benchmarks.frontend tells them apart): `server` (the process started, when it spawned none: one process, the default
on a small host), `supervisor` (the same, when it did), `worker` (a spawned process holding the TCP listener) or
`engine` (one that does not). The kind: `main` (the process's main thread: the event loop in the server, the workers
and the engine process), `engine` (threads at a raised nice value: the engine threads, which `--engine-nice` lowers,
and the threads they start, OpenMP's and, where an engine thread starts them, CUDA's) or `other` (executor, span
export and other threads). With `--engine-nice 0` the engine threads show as `other`.

What it answers: whether the engine threads get less CPU than the offline engine has (and to whom it goes: the event
loop, the load generator, the hypervisor), or wait for something other than a CPU (idle share left on the machine);
on a GPU host, how busy the engine process's event loop is beside its engine thread, which share one GIL.
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

from benchmarks.frontend import server_processes
from benchmarks.serving import stop_on_sigterm, wait_ready, wrk
from glassbox.chaos.local import free_port
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def thread_stats(pid: int) -> dict[int, dict[str, Any]]:
    """Per thread of `pid`: name, ns on a CPU, ns waiting in a run queue, voluntary and involuntary switches, its
    nice value, and the process it belongs to."""
    out: dict[int, dict[str, Any]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended meanwhile
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            on_cpu, waiting, _ = (int(v) for v in Path(f"{base}/schedstat").read_text().split())
            status = dict(line.split(":", 1) for line in Path(f"{base}/status").read_text().splitlines()
                          if ":" in line)
            # /proc/<pid>/task/<tid>/stat: the name in parentheses may hold spaces; nice is the 17th field after it.
            nice = int(Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()[16])
            out[int(tid)] = {"name": status["Name"].strip(), "run_ns": on_cpu, "wait_ns": waiting,
                             "voluntary": int(status["voluntary_ctxt_switches"]),
                             "involuntary": int(status["nonvoluntary_ctxt_switches"]), "nice": nice, "pid": pid}
        except (OSError, KeyError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return out


def tree_stats(root: int) -> dict[int, dict[str, Any]]:
    """`thread_stats` of `root` and of the processes it spawned, each thread with its process's role and its own
    kind (see the module's docstring)."""
    processes = server_processes(root)
    out: dict[int, dict[str, Any]] = {}
    for proc, role in processes:
        pid = proc.pid
        if role == "main":
            role = "supervisor" if len(processes) > 1 else "server"
        threads = thread_stats(pid)
        main_nice = threads[pid]["nice"] if pid in threads else 0
        for tid, row in threads.items():
            row["process"] = role
            row["kind"] = "main" if tid == pid else "engine" if row["nice"] > main_nice else "other"
        out.update(threads)
    return out


def machine_ticks() -> list[float]:
    """The machine's CPU seconds so far, one per STAT_FIELDS entry (psutil reads /proc/stat)."""
    times = psutil.cpu_times()
    return [getattr(times, name) for name in STAT_FIELDS]


def measure(connections: int, duration_s: int, serve_args: list[str], *, device: str = "cpu",
            model_dir: Path | None = None, wrk_threads: int = 1) -> dict[str, Any]:
    model_dir = model_dir or default_model_dir()
    texts = read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts
    work = Path(tempfile.mkdtemp(prefix="glassbox-cpu-share-"))
    bodies = work / "bodies.jsonl"
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    port = free_port()
    with (work / "server.log").open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "glassbox.service", "serve", "--device", device, "--model",
                                   str(model_dir), "--port", str(port), *serve_args],
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    threads_n = min(wrk_threads, connections)
    try:
        wait_ready(url)
        wrk(url, bodies, connections, 3, threads_n)  # warm-up
        ticks, threads, start = machine_ticks(), tree_stats(server.pid), time.monotonic()
        result = wrk(url, bodies, connections, duration_s, threads_n)
        elapsed = time.monotonic() - start
        ticks_after, threads_after = machine_ticks(), tree_stats(server.pid)
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
        rows.append({"tid": tid, "pid": after["pid"], "process": after["process"], "kind": after["kind"],
                     "name": after["name"], "run_share": run,
                     "runqueue_share": (after["wait_ns"] - before["wait_ns"]) / 1e9 / elapsed,
                     "voluntary": after["voluntary"] - before["voluntary"],
                     "involuntary": after["involuntary"] - before["involuntary"]})
    rows.sort(key=lambda row: -row["run_share"])
    rate = max(result["requests_per_s"], 1e-9)
    return {
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device,
        "connections": connections, "duration_s": duration_s, "serve_args": serve_args, "wrk": result,
        "machine_share": {name: cores * n / total for name, n in zip(STAT_FIELDS, spent, strict=True)},
        "threads": rows,
        "by_kind": by_kind(rows, rate),
        "server_cpu_ms_per_request": sum(r["run_share"] for r in rows) * 1e3 / rate,
    }


def by_kind(rows: list[dict[str, Any]], rate: float) -> dict[str, dict[str, float]]:
    """The rows summed per "process/kind" (all workers together): shares of a core, and CPU ms per request."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        key = f"{row['process']}/{row['kind']}"
        sums = out.setdefault(key, {"threads": 0, "run_share": 0.0, "runqueue_share": 0.0})
        sums["threads"] += 1
        sums["run_share"] += row["run_share"]
        sums["runqueue_share"] += row["runqueue_share"]
    for sums in out.values():
        sums["cpu_ms_per_request"] = sums["run_share"] * 1e3 / rate
    return dict(sorted(out.items(), key=lambda item: -item[1]["run_share"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration", type=int, default=10, help="seconds of measured load")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads, where one cannot keep up")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `glassbox serve` flag (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: extra `glassbox serve` arguments")
    args = parser.parse_args(argv)
    serve_args = [*args.serve_arg, *(args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args)]
    stop_on_sigterm()
    result = measure(args.connections, args.duration, serve_args, device=args.device, model_dir=args.model,
                     wrk_threads=args.wrk_threads)
    share = result["machine_share"]
    print(f"{result['wrk']['requests_per_s']:.1f} req/s, mean batch {result['wrk']['mean_batch']:.2f}; machine "
          f"(100% = one core): user {share['user'] + share['nice']:.0%}, system {share['system']:.0%}, "
          f"idle {share['idle'] + share['iowait']:.0%}, steal {share['steal']:.0%}", file=sys.stderr)
    for key, sums in result["by_kind"].items():
        threads = f"{sums['threads']:.0f} thread{'s' if sums['threads'] != 1 else ''}"
        print(f"  {key:<18} {threads:>11}  on a CPU {sums['run_share']:7.1%}  waiting for one "
              f"{sums['runqueue_share']:6.1%}  {sums['cpu_ms_per_request']:.3f} ms a request", file=sys.stderr)
    for row in result["threads"]:
        print(f"  {row['tid']:>7} {row['process'] + '/' + row['kind']:<18} on a CPU {row['run_share']:6.1%}  "
              f"waiting for one {row['runqueue_share']:6.1%}  switches {row['voluntary']} voluntary, "
              f"{row['involuntary']} forced", file=sys.stderr)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
