"""Refusals paced against answers (glassbox.service.http.pacing): the budget's arithmetic on a fake clock."""

from __future__ import annotations

import pytest

from glassbox.service.http import pacing
from glassbox.service.http.pacing import BURST_S, MAX_HOLD_S, RefusalPacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_within_the_budget_is_answered_at_once_then_refusals_take_slots_one_interval_apart() -> None:
    clock = Clock()
    pacer = RefusalPacer(4.0, floor=200.0, clock=clock)
    burst = int(BURST_S * 200)  # 50: nothing answered 200 yet, so the floor alone
    assert [pacer.hold_s() for _ in range(burst + 1)] == [0.0] * (burst + 1)
    held = [pacer.hold_s() for _ in range(3)]
    assert held == pytest.approx([1 / 200, 2 / 200, 3 / 200])
    clock.now += 1.0  # a quiet second: the budget is back
    assert pacer.hold_s() == 0.0


def test_answers_raise_the_budget() -> None:
    clock = Clock()
    pacer = RefusalPacer(4.0, floor=200.0, clock=clock)
    for _ in range(100):
        pacer.answered()
    assert pacer.budget_per_s == pytest.approx(600.0)
    clock.now += 1.0  # the count of answers decays with a one-second time constant
    assert pacer.budget_per_s == pytest.approx(4.0 * 100 / 2.718281828 + 200.0, rel=1e-6)


def test_open_loop_overload_at_three_times_capacity_is_never_held() -> None:
    """The overload experiment's shape: a baseline at under half capacity, then 200 answers and 600 refusals a
    second, interleaved for ten seconds: within 4 per answer plus the floor from the step on."""
    clock = Clock()
    pacer = RefusalPacer(4.0, clock=clock)
    for _ in range(1000):  # 5 s at 100 answers a second, nothing refused
        clock.now += 0.01
        pacer.answered()
    holds = []
    for _ in range(2000):  # 10 s in steps of 5 ms: one answer and three refusals each
        clock.now += 0.005
        pacer.answered()
        holds += [pacer.hold_s() for _ in range(3)]
    assert max(holds) == 0.0


def test_a_step_from_idle_is_held_only_until_the_answers_catch_up() -> None:
    """Overload that starts on an idle server: the answers a second are counted as they come, so refusals beyond
    the floor's burst are held for a while, then never."""
    clock = Clock()
    pacer = RefusalPacer(4.0, clock=clock)
    holds = []
    for _ in range(2000):
        clock.now += 0.005
        pacer.answered()
        holds.append(max(pacer.hold_s() for _ in range(3)))
    assert 0.0 < max(holds) < 0.25
    assert max(holds[400:]) == 0.0  # from two seconds in


def test_a_closed_loop_that_sends_again_at_once_is_slowed_to_the_budget() -> None:
    """64 clients that each send again as soon as their 429 comes back, nothing answered 200: refusals go out at the
    floor's rate once the burst is spent, however many clients there are."""
    clock = Clock()
    pacer = RefusalPacer(4.0, floor=200.0, clock=clock)
    due = [clock.now] * 64  # when each client's next refusal is answered
    answered_at = []
    for _ in range(2000):
        client = min(range(64), key=due.__getitem__)
        clock.now = due[client]
        due[client] = clock.now + pacer.hold_s() + 1e-4  # the client's 0.1 ms turn-around
        answered_at.append(due[client])
    span = max(answered_at) - min(answered_at)
    assert 2000 / span == pytest.approx(200.0, rel=0.1)


def test_a_hold_is_at_most_a_second_and_never_past_the_deadline() -> None:
    clock = Clock()
    pacer = RefusalPacer(4.0, floor=10.0, clock=clock)
    holds = [pacer.hold_s() for _ in range(100)]
    assert max(holds) == MAX_HOLD_S
    assert holds[-1] == MAX_HOLD_S  # later refusals are not pushed beyond the longest hold
    assert pacer.hold_s(deadline_left_s=0.2) == 0.2
    assert pacer.hold_s(deadline_left_s=-1.0) == 0.0


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        RefusalPacer(0.0)
    with pytest.raises(ValueError, match="positive"):
        RefusalPacer(4.0, floor=0.0)


def test_the_floor_default_is_read_when_a_pacer_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "FLOOR_PER_S", 7.0)
    assert RefusalPacer(4.0).budget_per_s == 7.0
