"""The scheduler slice of the load generator's thread (Linux 6.12+).

Since Linux 6.12 a thread may ask the fair scheduler (EEVDF) for a slice of its own: sched_setattr's sched_runtime,
clamped to 0.1-100 ms, no privilege needed. A thread that wakes with a shorter slice than the running thread's may
preempt it at once, where with equal slices it often waits for the running slice to end or for the next tick. The
slice changes when a thread runs, not how much CPU it gets over time. A generator on the same host as the server it
measures wakes for every due request and every answer while the server keeps the cores busy, and each such wait
counts in every latency it records: on a 2-core host under the overload experiment its release lag P99 was 4.1-4.4 ms
with the kernel's slice and 3.2-3.7 ms with 0.1 ms (docs/benchmarks/2026-12-04-loadgen-scheduler-slice.md).
Threads and processes started by a thread inherit its slice. Elsewhere (another OS or architecture, a 32-bit
interpreter, an older kernel, a sandbox that forbids the call) these functions change nothing and say so. Python's
`os` module has no sched_setattr, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

DEFAULT_SLICE = 0  # sched_runtime 0: the kernel's own slice
RESET_ON_FORK = 0x01  # SCHED_FLAG_RESET_ON_FORK: kept as the thread had it (an unprivileged thread may not clear it)
_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # (sched_setattr, sched_getattr) system call numbers


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64), ("sched_util_min", ctypes.c_uint32),
                ("sched_util_max", ctypes.c_uint32)]


def _calling_thread() -> tuple[ctypes.CDLL, tuple[int, int], _SchedAttr] | None:
    """libc, the system call numbers and the calling thread's attributes; None where they cannot be read."""
    calls = _CALLS.get(platform.machine()) if sys.platform.startswith("linux") else None
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        calls = None  # a 32-bit interpreter on a 64-bit kernel makes the 32-bit ABI's calls, numbered otherwise
    if calls is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _SchedAttr()
    if libc.syscall(calls[1], 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return libc, calls, attr


def thread_slice_ns() -> int | None:
    """The calling thread's scheduler slice in ns (a fair-class thread on Linux 6.12+); None where none is known."""
    found = _calling_thread()
    if found is None or found[2].sched_policy not in (os.SCHED_OTHER, os.SCHED_BATCH):
        return None
    return int(found[2].sched_runtime) or None  # kernels before 6.12 report 0 for fair-class threads


def set_thread_slice(ns: int) -> bool:
    """Ask for a scheduler slice of `ns` for the calling thread (DEFAULT_SLICE: back to the kernel's default, not to
    a custom slice it may have had), keeping its policy and nice value. True when the kernel now reports that slice
    (or, for DEFAULT_SLICE, accepted the call). Threads and processes the calling thread starts afterwards inherit
    the slice."""
    found = _calling_thread()
    if found is None:
        return False
    libc, calls, attr = found
    if attr.sched_policy not in (os.SCHED_OTHER, os.SCHED_BATCH):
        return False  # a real-time thread has no fair slice to change
    attr.size = ctypes.sizeof(attr)
    attr.sched_flags &= RESET_ON_FORK
    attr.sched_runtime = ns
    if libc.syscall(calls[0], 0, ctypes.byref(attr), 0) != 0:
        return False
    return ns == DEFAULT_SLICE or thread_slice_ns() == ns
