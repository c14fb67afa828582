"""The CPUs this process may use, for the engine's threads and the worker count: a module of its own, so that
processes that never run the engine (the supervisor, HTTP workers) can ask without importing torch."""

from __future__ import annotations

import math
import os
from pathlib import Path


def available_cores() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota (a container's CPU limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, math.ceil(int(quota) / int(period))))
