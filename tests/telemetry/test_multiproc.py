"""telemetry/multiproc.py's cached pid: metrics built by build_telemetry in multiprocess mode take the value class
that reads the pid from memory, and a forked child still writes its own file. Multiprocess mode is chosen per
process when prometheus_client is imported, so each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
from prometheus_client import values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client import CollectorRegistry
from glassbox.service.settings import Settings
from glassbox.telemetry import build_telemetry
import glassbox.telemetry.multiproc as multiproc

telemetry = build_telemetry(Settings(), multiprocess_dir=os.environ["PROMETHEUS_MULTIPROC_DIR"])
fast = values.ValueClass is multiproc._cached_pid_values and multiproc._cached_pid_values is not None
counter = telemetry.metrics.span_export_failures
counter.inc()
child = os.fork()
if child == 0:
    counter.inc(10)  # the child's own file, as the library does after a fork
    os._exit(0)
os.waitpid(child, 0)
counter.inc(100)
registry = CollectorRegistry()
MultiProcessCollector(registry, os.environ["PROMETHEUS_MULTIPROC_DIR"])
total = registry.get_sample_value("glassbox_span_export_failures_total")
files = sorted(os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
print(json.dumps({"fast": fast, "total": total, "files": files, "pid": os.getpid(), "child": child}))
"""


def run_script(script: str, metrics_dir: Path) -> Any:
    """Run `script` in a fresh interpreter with its multiprocess folder set; the JSON of its last line."""
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_workers_write_metrics_under_a_cached_pid_and_a_fork_gets_its_own_file(tmp_path: Path) -> None:
    result = run_script(SCRIPT, tmp_path)
    assert result["fast"]
    assert result["total"] == 111.0  # parent 1 + 100, child 10: nothing lost to two writers of one file
    assert f"counter_{result['pid']}.db" in result["files"]
    assert f"counter_{result['child']}.db" in result["files"]


RETIRE_SCRIPT = """
import json, os, sys, threading
from prometheus_client import CollectorRegistry
from glassbox.service.settings import Settings
from glassbox.telemetry import build_telemetry
import glassbox.telemetry.multiproc as multiproc

path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
metrics = build_telemetry(Settings(), multiprocess_dir=path).metrics
children = []
for i in range(20):  # processes that wrote their counts and died, as restarted workers and engines do
    child = os.fork()
    if child == 0:
        metrics.span_export_failures.inc(i + 1)
        metrics.event_loop_lag.observe(0.001 * (i + 1))
        os._exit(0)
    os.waitpid(child, 0)
    children.append(child)
metrics.span_export_failures.inc(1000)  # a live process's own file stays as it is


def totals():
    registry = CollectorRegistry()
    registry.register(multiproc.MultiProcessExposition(path, multiproc.ExemplarBook()))
    return [registry.get_sample_value("glassbox_span_export_failures_total"),
            registry.get_sample_value("glassbox_event_loop_lag_seconds_count"),
            registry.get_sample_value("glassbox_event_loop_lag_seconds_bucket", {"le": "0.01"})]


before = totals()
files_before = len(os.listdir(path))
seen, errors, stop = [], [], threading.Event()


def scrape():
    while not stop.is_set():
        try:
            seen.append(totals())
        except Exception as exc:
            errors.append(repr(exc))


scraper = threading.Thread(target=scrape)
scraper.start()
try:
    for child in children:
        multiproc.retire_process(child, path)
finally:
    stop.set()
    scraper.join()
print(json.dumps({"before": before, "after": totals(), "seen": sorted({tuple(s) for s in seen}), "errors": errors,
                  "files_before": files_before, "files": sorted(f for f in os.listdir(path) if f.endswith(".db")),
                  "pid": os.getpid()}))
"""


def test_retired_processes_fold_into_one_file_per_kind_and_no_scrape_sees_a_count_change(tmp_path: Path) -> None:
    # Each worker or engine restart leaves a counter and a histogram file of ~64-128 KiB, and every scrape reads
    # them all: measured ~2 ms of scrape per dead process, 2 s of scrape and 190 MiB of /tmp after 1000 restarts.
    result = run_script(RETIRE_SCRIPT, tmp_path)
    assert result["before"] == [1210.0, 20.0, 10.0]  # 1000 + 1 + ... + 20; 20 observations, 10 of them <= 10 ms
    assert result["after"] == result["before"]
    assert result["errors"] == []
    assert result["seen"] in ([], [result["before"]])  # a scrape during retirement sees the same counts, never more
    assert result["files_before"] >= 40
    pid = result["pid"]
    assert result["files"] == sorted(["counter_retired.db", "histogram_retired.db", f"counter_{pid}.db",
                                      f"histogram_{pid}.db", f"gauge_livemax_{pid}.db"])
