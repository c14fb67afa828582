"""Batch formation as pure logic on a fake clock: when the free engine starts, and how long it may hold."""

from __future__ import annotations

import pytest

from glassbox.service.batching.formation import GO, BatchFormer, FormationPolicy

MS = 1_000_000


def warmed(batch_ms: float = 20.0, fixed_ms: float = 8.0) -> BatchFormer:
    """A former whose engine has been running batches of `batch_ms` each, `fixed_ms` of which is its fixed cost."""
    former = BatchFormer()
    for _ in range(10):
        former.ran(int(batch_ms * MS), fixed_ms * MS)
    return former


def test_nothing_measured_yet_means_start_at_once() -> None:
    former = BatchFormer()
    former.arrived(0, occupancy=1)
    former.arrived(10, occupancy=5)
    assert former.hold_limit_ns == 0
    assert former.decide(20, queued_rows=1, max_rows=32, hold_start_ns=20) == GO


def test_a_lone_request_on_an_idle_server_starts_at_once() -> None:
    former = warmed()
    for i in range(8):  # a burst long ago
        former.arrived(i * 100_000, occupancy=i + 1)
    now = 10_000 * MS  # ten seconds later: the old occupancy is forgotten
    former.arrived(now, occupancy=1)
    assert former.expected_rows(now) == 1
    assert former.decide(now, queued_rows=1, max_rows=32, hold_start_ns=now) == GO


def test_one_closed_loop_client_never_waits() -> None:
    former = warmed(5.0)
    now = 0
    for _ in range(50):
        former.arrived(now, occupancy=1)
        assert former.decide(now, queued_rows=1, max_rows=32, hold_start_ns=now) == GO
        now += 6 * MS  # its batch ran, the answer went out, the next request came


def test_a_burst_on_its_way_is_held_for_until_the_expected_rows_are_queued() -> None:
    former = warmed(20.0)
    # Eight clients were in the system a batch ago (occupancy 8 at the last arrival of the previous burst).
    for i in range(8):
        former.arrived(i * 200_000, occupancy=i + 1)
    start = 25 * MS  # the batch ran; its answers went out; the first client is back
    former.arrived(start, occupancy=1)
    assert former.expected_rows(start) == 8
    wait = former.decide(start, queued_rows=1, max_rows=32, hold_start_ns=start)
    assert 0 < wait <= 8 * MS  # at most the engine's 8 ms fixed cost per batch
    for k in range(2, 8):
        now = start + (k - 1) * 200_000
        former.arrived(now, occupancy=k)
        assert former.decide(now, queued_rows=k, max_rows=32, hold_start_ns=start) > 0
    now = start + 7 * 200_000
    former.arrived(now, occupancy=8)
    assert former.decide(now, queued_rows=8, max_rows=32, hold_start_ns=start) == GO


def test_the_hold_never_outlasts_the_fixed_cost_it_saves_nor_half_a_batch() -> None:
    former = warmed(20.0, fixed_ms=8.0)
    former.arrived(0, occupancy=16)
    assert former.hold_limit_ns == 8 * MS  # merging saves one fixed cost: no point waiting longer
    assert former.decide(1 * MS, queued_rows=2, max_rows=32, hold_start_ns=0) == 7 * MS
    assert former.decide(8 * MS, queued_rows=2, max_rows=32, hold_start_ns=0) == GO
    assert warmed(20.0, fixed_ms=15.0).hold_limit_ns == 10 * MS  # and never more than half the batch time


def test_an_engine_without_a_fixed_cost_never_holds() -> None:
    former = warmed(20.0, fixed_ms=0.0)  # a cost all per token: a bigger batch saves nothing
    former.arrived(0, occupancy=16)
    assert former.decide(0, queued_rows=1, max_rows=32, hold_start_ns=0) == GO


def test_the_hold_bound_has_a_ceiling_for_slow_engines() -> None:
    former = warmed(1000.0, fixed_ms=400.0)  # one-second batches
    assert former.hold_limit_ns == FormationPolicy().max_hold_ns


def test_a_burst_that_stopped_arriving_is_not_waited_for() -> None:
    former = warmed(20.0)
    for i in range(8):  # arrivals 100 us apart teach the in-burst gap
        former.arrived(i * 100_000, occupancy=i + 1)
    start = 30 * MS
    former.arrived(start + 100_000, occupancy=1)  # the burst begins to arrive after the hold started
    for i in range(1, 5):
        former.arrived(start + (i + 1) * 100_000, occupancy=i + 1)
    last = start + 500_000
    # Quiet for a quarter of the 8 ms bound (2 ms; longer than three 100 us gaps) ends the burst: long before the
    # bound itself.
    assert 0 < former.decide(last + 1 * MS, queued_rows=5, max_rows=32, hold_start_ns=start) <= 1 * MS
    assert former.decide(last + 2 * MS, queued_rows=5, max_rows=32, hold_start_ns=start) == GO


def test_before_the_first_arrival_only_the_bound_ends_a_hold() -> None:
    # The engine just finished: its clients are still reading their answers, so nothing arrives for a while.
    former = warmed(20.0)
    for i in range(8):
        former.arrived(i * 100_000, occupancy=i + 1)
    start = 30 * MS  # long after the last arrival
    assert former.decide(start + 3 * MS, queued_rows=4, max_rows=32, hold_start_ns=start) == 5 * MS


def test_a_full_batch_starts_whatever_is_expected() -> None:
    former = warmed(20.0)
    former.arrived(0, occupancy=100)
    assert former.decide(1000, queued_rows=32, max_rows=32, hold_start_ns=0) == GO


def test_a_zero_share_policy_never_holds() -> None:
    former = BatchFormer(FormationPolicy(hold_share=0.0))
    for _ in range(5):
        former.ran(20 * MS, 8.0 * MS)
    former.arrived(0, occupancy=8)
    assert former.decide(0, queued_rows=1, max_rows=32, hold_start_ns=0) == GO


@pytest.mark.parametrize("changes", [{"hold_share": 1.5}, {"max_hold_ns": -1}, {"window_batches": 0},
                                     {"gap_factor": 0}, {"ewma": 0.0}])
def test_policies_that_cannot_work_are_refused(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FormationPolicy(**changes)  # type: ignore[arg-type]


def test_rows_another_engine_thread_runs_come_off_what_a_free_one_holds_for() -> None:
    former = warmed(20.0)
    for i in range(8):  # eight closed-loop clients; another engine thread now runs four of them
        former.arrived(i * 200_000, occupancy=i + 1)
    now = 25 * MS
    former.arrived(now, occupancy=8)
    assert former.expected_rows(now) == 8
    # Four can never join this batch: with the other four queued there is nothing left to wait for.
    assert former.decide(now, queued_rows=4, max_rows=32, hold_start_ns=now, in_engine_rows=4) == GO
    assert former.decide(now, queued_rows=3, max_rows=32, hold_start_ns=now, in_engine_rows=4) > 0
    assert former.decide(now, queued_rows=4, max_rows=32, hold_start_ns=now) > 0  # alone, it would hold for 8
    # However many run elsewhere, one queued row is enough to go when nothing else is expected.
    assert former.decide(now, queued_rows=1, max_rows=32, hold_start_ns=now, in_engine_rows=20) == GO
