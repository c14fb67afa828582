"""The load generator's scheduler slice (chaos/loadgen/slice.py). The checks that need a kernel which takes custom
slices skip elsewhere; what every host must do (claim nothing where nothing is known) runs everywhere."""

from __future__ import annotations

import threading

import pytest

from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice, thread_slice_ns
from tests.chaos.slices import SHORT, custom_slices, kernel_default, on_fresh_thread


@custom_slices
def test_a_thread_gets_the_slice_it_asks_for_and_gives_it_back() -> None:
    default = kernel_default()
    assert default is not None and default != SHORT

    def ask() -> tuple[int | None, bool, int | None, bool, int | None]:
        return (thread_slice_ns(), set_thread_slice(SHORT), thread_slice_ns(), set_thread_slice(DEFAULT_SLICE),
                thread_slice_ns())

    assert on_fresh_thread(ask) == (default, True, SHORT, True, default)


@custom_slices
def test_a_slice_the_kernel_clamps_is_reported_as_not_taken() -> None:
    assert on_fresh_thread(lambda: (set_thread_slice(SHORT // 2), thread_slice_ns())) == (False, SHORT)


@custom_slices
def test_threads_started_afterwards_inherit_the_slice() -> None:
    def parent() -> list[int | None]:
        set_thread_slice(2 * SHORT)
        seen: list[int | None] = []
        child = threading.Thread(target=lambda: seen.append(thread_slice_ns()))
        child.start()
        child.join()
        return seen

    assert on_fresh_thread(parent) == [2 * SHORT]


def test_where_no_slice_is_known_nothing_is_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another architecture (or OS): no system call is made and nothing claims a slice was taken."""
    monkeypatch.setattr("glassbox.chaos.loadgen.slice.platform.machine", lambda: "riscv64")
    assert thread_slice_ns() is None
    assert set_thread_slice(SHORT) is False


@custom_slices
def test_an_attacker_started_mid_run_takes_the_kernels_slice_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow-client attackers start from the runner's thread while the generator holds its short slice, and inherit
    it: the attacker's process gives it back before attacking."""
    import glassbox.chaos.attacker

    seen: list[int | None] = []

    class Report:
        def to_json(self) -> dict[str, str]:
            return {}

    async def record(config: object, stop: object) -> Report:
        seen.append(thread_slice_ns())
        return Report()

    monkeypatch.setattr(glassbox.chaos.attacker, "run_slow_clients", record)
    spec = ('{"target": "http://127.0.0.1:1", "connections": 1, "mode": "headers", "bytes_per_s": 1, '
            '"duration_s": 1}')

    set_thread_slice(SHORT)  # as the runner's thread has it during a run (the attacker's signal handlers need the
    try:  # main thread, so this one)
        assert glassbox.chaos.attacker.main([spec]) == 0
    finally:
        set_thread_slice(DEFAULT_SLICE)
    assert seen == [kernel_default()] and seen != [SHORT]
