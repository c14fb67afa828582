"""The CPUs this process may use, for the engine's threads and the worker count: a module of its own, so that
processes that never run the engine (the supervisor, HTTP workers) can ask without importing torch."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import psutil


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


# --- OpenMP teams -------------------------------------------------------------------------------------------------
# torch's CPU kernels parallelise with GNU OpenMP, which gives every thread that opens a parallel region a team of
# its own, and keeps a team's workers spinning between regions only while all the threads it manages number no more
# than the CPUs; past that they sleep after a few spins and every region pays a wake-up (~30 µs here, measured in
# docs/benchmarks/2026-12-04-openmp-teams.md, "A faster day, and OpenMP teams on engine threads"). The main thread's
# team, sized when torch is imported, would take that whole allowance, so a process that runs engine threads starts
# torch with one thread on its main thread and lets each engine thread size its own team (service/runtime.py).
OMP_THREADS_ENV = "OMP_NUM_THREADS"
USER_OMP_THREADS_ENV = "GLASSBOX_USER_OMP_NUM_THREADS"  # what the user had set, for this process and its children
SPIN_ENV = "GOMP_SPINCOUNT"  # a user's own setting is kept
SPIN_COUNT = "4000"


def serial_main_thread() -> bool:
    """Before torch is first imported in a process that will run engine threads: its main thread gets one OpenMP
    thread, so it owns no team. What the user had set (if anything) is kept in USER_OMP_THREADS_ENV, where
    `intra_op_threads` reads it, and travels to child processes with the environment. Once torch is imported
    (libgomp read its environment then) it changes nothing and says whether an earlier call had kept it serial."""
    if "torch" in sys.modules:
        return serial_main_kept()
    os.environ.setdefault(USER_OMP_THREADS_ENV, os.environ.get(OMP_THREADS_ENV, ""))
    os.environ[OMP_THREADS_ENV] = "1"
    # Unslowed, a team's workers spin 300000 times before they sleep: a second engine thread's batch then shares the
    # cores with workers spinning at a barrier for their descheduled partner (at 8 connections the time outside the
    # engine went from 7-9 to 23-45 ms). Another process on the same cores (a second replica) does the same to them:
    # two servers side by side answered one client each at P50 39-40 ms with 10000 spins, 15-16 ms with 1000
    # (docs/benchmarks/2026-12-04-afternoon.md). Too few spins and the workers sleep between the regions of one
    # forward pass: on an Intel Xeon (AMX) a lone batch-1 request took 7.4 ms with 1000, 4.9 with 2000 and 3.7 with
    # 4000 or more, as on the main thread; two such processes at once 8.1 ms with 1000, 10.4 with 4000 and 19 with
    # 10000 (docs/benchmarks/2026-12-04-xeon-amx-spin-count.md). 4000 serves a lone server on both kinds of host.
    os.environ.setdefault(SPIN_ENV, SPIN_COUNT)
    return True


def serial_main_kept() -> bool:
    """Whether this process started torch with one OpenMP thread on its main thread (`serial_main_thread`)."""
    return USER_OMP_THREADS_ENV in os.environ and os.environ.get(OMP_THREADS_ENV) == "1"


def intra_op_threads(setting: int, torch_default: Callable[[], int]) -> int:
    """The intra-op threads an engine thread running a batch alone uses: `setting` when positive; in a process that
    kept its main thread serial, the user's own OMP_NUM_THREADS if they set one, else the physical cores this process
    may use (torch's own default, capped by the affinity and a CPU quota); otherwise `torch_default()`."""
    if setting > 0:
        return setting
    if not serial_main_kept():
        return torch_default()
    user = os.environ.get(USER_OMP_THREADS_ENV, "").strip()
    if user.isdigit() and int(user) > 0:
        return int(user)
    physical = psutil.cpu_count(logical=False) or available_cores()
    return max(1, min(physical, available_cores()))
