"""Scheduler-slice helpers for the load generator's tests (chaos/loadgen/slice.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice, thread_slice_ns

T = TypeVar("T")
SHORT = 100_000  # ns: the kernel's lower bound, and the generator's slice


def on_fresh_thread(call: Callable[[], T]) -> T:
    """`call` on a new thread, which starts with the kernel's slice whatever the calling thread has asked for."""
    out: list[T] = []

    def body() -> None:
        set_thread_slice(DEFAULT_SLICE)
        out.append(call())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out[0]


def kernel_default() -> int | None:
    return on_fresh_thread(thread_slice_ns)


custom_slices = pytest.mark.skipif(on_fresh_thread(lambda: set_thread_slice(SHORT)) is False,
                                   reason="the kernel takes no custom scheduler slice (Linux 6.12+ only)")
