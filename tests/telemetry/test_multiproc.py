"""telemetry/multiproc.py's cached pid: metrics built by build_telemetry in multiprocess mode take the value class
that reads the pid from memory, and a forked child still writes its own file. Multiprocess mode is chosen per
process when prometheus_client is imported, so each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
from prometheus_client import values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client import CollectorRegistry
from service.settings import Settings
from telemetry import build_telemetry
import telemetry.multiproc as multiproc

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


def test_workers_write_metrics_under_a_cached_pid_and_a_fork_gets_its_own_file(tmp_path: Path) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["fast"]
    assert result["total"] == 111.0  # parent 1 + 100, child 10: nothing lost to two writers of one file
    assert f"counter_{result['pid']}.db" in result["files"]
    assert f"counter_{result['child']}.db" in result["files"]
