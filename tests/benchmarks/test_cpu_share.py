"""benchmarks.cpu_share reads per-thread CPU from /proc: its readers see this process's own threads and work."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from benchmarks.cpu_share import STAT_FIELDS, machine_ticks, thread_stats

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_thread_shows_its_cpu_time_and_the_idle_one_none() -> None:
    ready, done = threading.Event(), threading.Event()
    ids: dict[str, int] = {}

    def idle() -> None:
        ids["idle"] = threading.get_native_id()
        ready.set()
        done.wait(10)

    waiter = threading.Thread(target=idle)
    waiter.start()
    ready.wait(10)
    try:
        before = thread_stats(os.getpid())
        spin(0.2)
        after = thread_stats(os.getpid())
    finally:
        done.set()
        waiter.join(10)
    me = threading.get_native_id()
    assert {me, ids["idle"]} <= set(before) & set(after)
    assert after[me]["run_ns"] - before[me]["run_ns"] >= 150_000_000  # 0.2 s of this thread's CPU, less jiffy rounding
    assert after[ids["idle"]]["run_ns"] - before[ids["idle"]]["run_ns"] < 50_000_000
    assert after[me]["name"]


def test_machine_ticks_cover_every_field_and_only_grow() -> None:
    first = machine_ticks()
    spin(0.05)
    second = machine_ticks()
    assert len(first) == len(second) == len(STAT_FIELDS)
    assert all(b >= a for a, b in zip(first, second, strict=True))
    assert sum(second) > sum(first)
