"""The FaultBoard: time-to-live on an injected clock, the oom batch budget, listeners in order, holds released exactly
once, the cap on armed faults, and consistency under threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from glassbox.chaos.faults import MAX_ARMED, FaultBoard, FaultChange
from glassbox.chaos.specs import parse_spec
from glassbox.service.errors import ChaosFaultNotFoundError, ChaosTooManyFaultsError

EPOCH = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CountingHold:
    def __init__(self) -> None:
        self.releases = 0

    def release(self) -> None:
        self.releases += 1


def spec(kind: str = "latency", ttl_s: float = 10.0, **params: Any) -> Any:
    defaults: dict[str, dict[str, Any]] = {"latency": {"delay_ms": 5}, "error": {"fraction": 0.5}, "oom": {},
                                           "fragmentation": {"inactive_mib": 8}}
    return parse_spec({"fault": kind, "ttl_s": ttl_s, **(params or defaults[kind])})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def board(clock: Clock) -> FaultBoard:
    return FaultBoard(clock=clock, wall=lambda: EPOCH + clock.now)


@pytest.fixture
def changes(board: FaultBoard) -> list[FaultChange]:
    seen: list[FaultChange] = []
    board.add_listener(seen.append)
    return seen


def events(changes: list[FaultChange]) -> list[tuple[str, str, bool]]:
    return [(c.event, c.fault.kind, c.kind_active) for c in changes]


def test_a_fault_expires_when_its_ttl_runs_out(board: FaultBoard, clock: Clock, changes: list[FaultChange]) -> None:
    fault = board.arm(spec(ttl_s=2.0))
    assert fault.armed_at == EPOCH + 100.0 and fault.expires_at == EPOCH + 102.0
    assert fault.to_json() == {"id": fault.id, "fault": "latency", "params": {"distribution": "fixed", "delay_ms": 5.0},
                               "armed_at": EPOCH + 100.0, "expires_at": EPOCH + 102.0, "ttl_s": 2.0, "detail": {}}
    clock.advance(1.999)
    assert [f.id for f in board.faults()] == [fault.id]
    assert not board.due()
    clock.advance(0.001)
    assert board.due()
    assert board.faults() == []
    assert events(changes) == [("armed", "latency", True), ("expired", "latency", False)]


def test_expire_without_any_read_is_what_the_periodic_sweep_calls(board: FaultBoard, clock: Clock,
                                                                  changes: list[FaultChange]) -> None:
    short, long = board.arm(spec(ttl_s=1.0)), board.arm(spec(ttl_s=5.0))
    clock.advance(1.0)
    assert [f.id for f in board.expire()] == [short.id]
    assert events(changes)[-1] == ("expired", "latency", True)  # the other latency fault is still armed
    assert board.expire() == []
    clock.advance(4.0)
    assert [f.id for f in board.expire()] == [long.id]
    assert events(changes)[-1] == ("expired", "latency", False)


def test_the_engine_thread_sees_expiry_without_any_other_read(board: FaultBoard, clock: Clock) -> None:
    board.arm(spec("error", ttl_s=1.0))
    assert board.begin_batch() is not None
    clock.advance(1.0)
    assert board.begin_batch() is None


def test_an_oom_batch_budget_counts_down_and_disarms_the_fault(board: FaultBoard,
                                                               changes: list[FaultChange]) -> None:
    fault = board.arm(spec("oom", batches=2))
    assert fault.detail == {"batches_left": 2}
    first = board.begin_batch()
    assert first is not None and first.oom == fault.id
    assert board.faults()[0].detail == {"batches_left": 1, "batches_failed": 1}
    second = board.begin_batch()
    assert second is not None and second.oom == fault.id  # the last budgeted batch still fails
    assert board.faults() == []
    assert board.begin_batch() is None
    assert events(changes) == [("armed", "oom", True), ("spent", "oom", False)]
    assert changes[-1].fault.detail == {"batches_left": 0, "batches_failed": 2}


def test_an_oom_fault_without_a_budget_fails_every_batch_until_it_expires(board: FaultBoard, clock: Clock) -> None:
    fault = board.arm(spec("oom"))
    for _ in range(5):
        faults = board.begin_batch()
        assert faults is not None and faults.oom == fault.id
    assert board.faults()[0].detail == {"batches_failed": 5}
    clock.advance(10.0)
    assert board.begin_batch() is None


def test_a_batch_gets_every_engine_fault_and_none_of_the_memory_ones(board: FaultBoard) -> None:
    latency_a, latency_b = board.arm(spec(delay_ms=1)), board.arm(spec(delay_ms=2))
    error = board.arm(spec("error"))
    board.arm(spec("fragmentation"), hold=CountingHold())
    faults = board.begin_batch()
    assert faults is not None
    assert [fault_id for fault_id, _ in faults.latency] == [latency_a.id, latency_b.id]
    assert [fault_id for fault_id, _ in faults.errors] == [error.id]
    assert faults.oom is None


def test_memory_faults_alone_leave_batches_alone(board: FaultBoard) -> None:
    board.arm(spec("oom", mode="fill", free_mib=10), hold=CountingHold())
    assert board.begin_batch() is None


def test_tally_adds_to_an_armed_faults_detail_and_ignores_gone_ones(board: FaultBoard) -> None:
    fault = board.arm(spec("error"))
    board.tally(fault.id, "batches_seen")
    board.tally(fault.id, "batches_seen", 2)
    assert board.faults()[0].detail == {"batches_seen": 3}
    board.disarm(fault.id)
    board.tally(fault.id, "batches_seen")  # the engine may report on a fault disarmed meanwhile
    assert board.faults() == []


def test_disarm_one_and_all(board: FaultBoard, changes: list[FaultChange]) -> None:
    latency, error, oom = board.arm(spec()), board.arm(spec("error")), board.arm(spec("oom"))
    assert board.disarm(error.id).id == error.id
    with pytest.raises(ChaosFaultNotFoundError, match="no armed fault"):
        board.disarm(error.id)
    assert [f.id for f in board.disarm_all()] == [latency.id, oom.id]
    assert board.disarm_all() == []
    assert events(changes)[3:] == [("disarmed", "error", False), ("disarmed", "latency", False),
                                   ("disarmed", "oom", False)]


def test_kind_active_stays_true_while_another_fault_of_the_kind_is_armed(board: FaultBoard,
                                                                          changes: list[FaultChange]) -> None:
    first, second = board.arm(spec("error")), board.arm(spec("error"))
    board.disarm(first.id)
    assert changes[-1].kind_active is True
    assert board.active_kinds() == {"error"}
    board.disarm(second.id)
    assert changes[-1].kind_active is False
    assert board.active_kinds() == set()


@pytest.mark.parametrize("ending", ["disarm", "disarm_all", "expire"])
def test_a_hold_is_released_exactly_once(board: FaultBoard, clock: Clock, ending: str) -> None:
    hold = CountingHold()
    fault = board.arm(spec("fragmentation", ttl_s=3.0), hold=hold)
    assert hold.releases == 0
    if ending == "disarm":
        board.disarm(fault.id)
    elif ending == "disarm_all":
        board.disarm_all()
    else:
        clock.advance(3.0)
        board.expire()
    board.disarm_all()
    clock.advance(10.0)
    board.expire()
    assert hold.releases == 1


def test_at_most_max_armed_faults_and_a_refused_hold_is_released(board: FaultBoard, clock: Clock) -> None:
    for _ in range(MAX_ARMED):
        board.arm(spec(ttl_s=5.0))
    with pytest.raises(ChaosTooManyFaultsError, match=f"{MAX_ARMED} faults are armed"):
        board.check_room()
    hold = CountingHold()
    with pytest.raises(ChaosTooManyFaultsError):
        board.arm(spec("fragmentation"), hold=hold)
    assert hold.releases == 1
    clock.advance(5.0)  # they all expire: room again
    board.check_room()
    board.arm(spec())
    assert len(board.faults()) == 1


def test_a_failing_listener_neither_blocks_the_change_nor_other_listeners(board: FaultBoard) -> None:
    def broken(change: FaultChange) -> None:
        raise RuntimeError("listener bug")

    seen: list[str] = []
    board.add_listener(broken)
    board.add_listener(lambda change: seen.append(change.event))
    fault = board.arm(spec())
    board.disarm(fault.id)
    assert seen == ["armed", "disarmed"]


def test_threads_arming_disarming_and_reading_leave_a_consistent_board_and_gauge(board: FaultBoard) -> None:
    """Listeners run in the order of changes: the last value a gauge was set to is the board's true state."""
    gauge: dict[str, bool] = {}
    board.add_listener(lambda change: gauge.__setitem__(change.fault.kind, change.kind_active))
    start = threading.Barrier(5)
    errors: list[BaseException] = []

    def churn(kind: str) -> None:
        try:
            start.wait()
            for _ in range(200):
                fault = board.arm(spec(kind))
                board.faults()
                board.disarm(fault.id)
        except BaseException as exc:
            errors.append(exc)

    def engine() -> None:
        try:
            start.wait()
            for _ in range(1000):
                board.begin_batch()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(kind,)) for kind in ("latency", "error", "latency", "oom")]
    threads.append(threading.Thread(target=engine))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert board.faults() == []
    assert gauge == {"latency": False, "error": False, "oom": False}
