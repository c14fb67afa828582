"""The circuit breaker over a clock the test moves: trip, cooldown, one probe, doubling, ceiling, reset, settling."""

from __future__ import annotations

import pytest

from glassbox.service.engines.breaker import SETTLE_S, CircuitBreaker
from tests.service.engines.doubles import ManualClock


def test_a_trip_opens_for_the_first_cooldown_and_a_probe_is_due_exactly_then() -> None:
    clock = ManualClock(50.0)
    breaker = CircuitBreaker(5.0, 300.0, clock)
    assert breaker.closed and not breaker.probe_due()
    state = breaker.trip()
    assert (state.phase, state.cooldown_s, state.opened_at_s, state.failures) == ("open", 5.0, 50.0, 1)
    assert state.probe_at_s == 55.0
    clock.advance(4.999)
    assert not breaker.probe_due()
    clock.advance(0.001)
    assert breaker.probe_due()


def test_a_successful_probe_closes_and_resets_the_cooldown() -> None:
    clock = ManualClock()
    breaker = CircuitBreaker(2.0, 300.0, clock)
    breaker.trip()
    clock.advance(2.0)
    breaker.begin_probe()
    assert breaker.state.phase == "probing"
    assert not breaker.probe_due()  # one probe at a time
    breaker.probe_failed()
    clock.advance(4.0)
    breaker.begin_probe()
    state = breaker.probe_succeeded()
    assert (state.phase, state.cooldown_s, state.failures) == ("closed", 2.0, 0)
    clock.advance(SETTLE_S)
    assert breaker.trip().cooldown_s == 2.0  # after the GPU settled, the next outage starts from the first cooldown


def test_a_failure_soon_after_recovering_doubles_on_from_the_last_cooldown() -> None:
    """A flapping GPU (the probe passes, real batches fail again) is not retried at the first cooldown each time."""
    clock = ManualClock()
    breaker = CircuitBreaker(1.0, 5.0, clock, settle_s=60.0)
    seen = []
    for _ in range(4):
        state = breaker.trip()
        seen.append(state.cooldown_s)
        clock.advance(state.cooldown_s)
        breaker.begin_probe()
        breaker.probe_succeeded()
        clock.advance(59.9)  # the next failure comes just short of the settling time
    assert seen == [1.0, 2.0, 4.0, 5.0]
    clock.advance(0.1 + 60.0)
    assert breaker.trip().cooldown_s == 1.0


def test_each_failed_probe_doubles_the_cooldown_up_to_the_ceiling() -> None:
    clock = ManualClock()
    breaker = CircuitBreaker(5.0, 30.0, clock)
    breaker.trip()
    seen = []
    for _ in range(4):
        clock.advance(breaker.state.cooldown_s)
        breaker.begin_probe()
        state = breaker.probe_failed()
        seen.append(state.cooldown_s)
        assert state.opened_at_s == clock.now  # the wait counts from the failed probe
    assert seen == [10.0, 20.0, 30.0, 30.0]
    assert breaker.state.failures == 5
    clock.advance(29.9)
    assert not breaker.probe_due()


def test_transitions_out_of_order_are_refused() -> None:
    breaker = CircuitBreaker(1.0, 1.0, ManualClock())
    with pytest.raises(RuntimeError, match="no probe is due"):
        breaker.begin_probe()
    with pytest.raises(RuntimeError, match="cannot close"):
        breaker.probe_succeeded()
    breaker.trip()
    with pytest.raises(RuntimeError, match="cannot trip"):
        breaker.trip()
    with pytest.raises(RuntimeError, match="cannot re-open"):
        breaker.probe_failed()


def test_a_negative_settling_time_is_refused() -> None:
    with pytest.raises(ValueError, match="settle_s"):
        CircuitBreaker(1.0, 2.0, settle_s=-1.0)


@pytest.mark.parametrize(("first", "ceiling"), [(0.0, 1.0), (-1.0, 1.0), (5.0, 4.0)])
def test_bad_cooldowns_are_refused(first: float, ceiling: float) -> None:
    with pytest.raises(ValueError, match="cooldown"):
        CircuitBreaker(first, ceiling)
