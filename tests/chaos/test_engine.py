"""ChaosEngine on the CPU with a recording inner engine and a fake sleep: what each fault does to a batch, the seeded
draws and their statistics, the timing that puts a delay into the infer stage, warm-up left alone, and how the
injected errors meet the real FallbackEngine."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest
import torch

from glassbox.chaos.engine import ChaosEngine, InjectedError, draw_delay_ms
from glassbox.chaos.faults import FaultBoard
from glassbox.chaos.specs import MAX_DELAY_MS, LatencySpec, parse_spec
from glassbox.service.engines.base import is_concurrent
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.faults import classify
from glassbox.service.types import EngineHealth, EngineResult, EngineTiming, TokenBatch, WarmupReport
from tests.service.engines.doubles import ManualClock

BATCH = TokenBatch(ids=np.array([[2, 7, 3], [2, 9, 3]], dtype=np.int64), lengths=np.array([3, 3], dtype=np.int64),
                   truncated=np.zeros(2, dtype=bool))


class Inner:
    """A CPU engine double: logits [n, 2] of zeros plus `offset`; counts runs and warm-ups."""

    def __init__(self, device: str = "cpu", offset: float = 0.0) -> None:
        self._device = device
        self.offset = offset
        self.runs = 0
        self.warmups = 0
        self.started_ns: list[int] = []

    @property
    def device(self) -> str:
        return self._device

    @property
    def kind(self) -> str:
        return "inner"

    def warmup(self) -> WarmupReport:
        self.warmups += 1
        return WarmupReport(self.device, self.kind, (), 0.0)

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)

    def run(self, batch: TokenBatch) -> EngineResult:
        self.runs += 1
        start = time.perf_counter_ns()
        self.started_ns.append(start)
        logits = np.full((batch.size, 2), self.offset, dtype=np.float32)  # [n, 2]
        timing = EngineTiming(start, time.perf_counter_ns(), self.device, "eager", batch.size, batch.real_tokens,
                              batch.size * batch.max_length, None)
        return EngineResult(logits, timing)


class Sleeps:
    """Records each requested sleep and the perf_counter_ns reading at the call; never sleeps."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.at_ns: list[int] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        self.at_ns.append(time.perf_counter_ns())


def arm(board: FaultBoard, kind: str, **params: Any) -> str:
    return board.arm(parse_spec({"fault": kind, "ttl_s": 60, **params})).id


@pytest.fixture
def board() -> FaultBoard:
    return FaultBoard()


def chaos_engine(board: FaultBoard, inner: Inner | None = None, seed: int = 0) -> tuple[ChaosEngine, Inner, Sleeps]:
    inner = inner or Inner()
    sleeps = Sleeps()
    return ChaosEngine(inner, board, seed=seed, sleep=sleeps), inner, sleeps


def test_without_faults_it_is_the_inner_engine(board: FaultBoard) -> None:
    engine, inner, sleeps = chaos_engine(board)
    result = engine.run(BATCH)
    assert inner.runs == 1 and sleeps.seconds == []
    assert result.timing.start_ns == inner.started_ns[0]
    assert (engine.device, engine.kind, engine.health().kind) == ("cpu", "chaos(inner)", "inner")


def test_it_runs_batches_side_by_side_when_its_inner_engine_may(board: FaultBoard) -> None:
    class Concurrent(Inner):
        concurrent = True

    assert not is_concurrent(chaos_engine(board)[0])
    assert is_concurrent(chaos_engine(board, Concurrent())[0])


def test_whether_a_batch_replays_as_a_graph_is_the_inner_engines_answer(board: FaultBoard) -> None:
    class Replaying(Inner):
        def replays(self, batch: TokenBatch) -> bool:
            return batch.size <= 1

    assert not chaos_engine(board)[0].replays(BATCH)  # an engine without graphs never replays
    engine = chaos_engine(board, Replaying())[0]
    assert not engine.replays(BATCH) and engine.replays(BATCH.select([0]))


def test_warmup_runs_without_faults_even_when_armed(board: FaultBoard) -> None:
    arm(board, "oom")
    arm(board, "error", fraction=1.0)
    arm(board, "latency", delay_ms=100)
    engine, inner, sleeps = chaos_engine(board)
    report = engine.warmup()
    assert inner.warmups == 1 and sleeps.seconds == []
    assert report.kind == "chaos(inner)"


def test_a_fixed_delay_is_slept_before_the_batch_and_counted_in_its_timing(board: FaultBoard) -> None:
    fault_id = arm(board, "latency", delay_ms=40)
    engine, inner, sleeps = chaos_engine(board)
    result = engine.run(BATCH)
    assert sleeps.seconds == [pytest.approx(0.040)]
    # The batch's timing starts before the sleep: the batcher puts the delay into the infer stage, not the queue.
    assert result.timing.start_ns <= sleeps.at_ns[0] <= inner.started_ns[0]
    assert result.timing.end_ns >= inner.started_ns[0]
    assert board.faults()[0].detail == {"batches_delayed": 1, "delay_total_ms": 40.0}
    assert board.disarm(fault_id).detail["batches_delayed"] == 1


def test_delays_of_several_latency_faults_add_up_in_one_sleep(board: FaultBoard) -> None:
    arm(board, "latency", delay_ms=10)
    arm(board, "latency", delay_ms=15)
    engine, _, sleeps = chaos_engine(board)
    engine.run(BATCH)
    assert sleeps.seconds == [pytest.approx(0.025)]


@pytest.mark.parametrize(("params", "check"), [
    ({"distribution": "uniform", "min_ms": 10, "max_ms": 30},
     lambda d: d.min() >= 10 and d.max() <= 30 and abs(d.mean() - 20) < 0.5 and d.std() > 5),
    ({"distribution": "exponential", "delay_ms": 20},
     lambda d: d.min() >= 0 and abs(d.mean() - 20) < 1.0 and abs(np.median(d) - 20 * math.log(2)) < 1.0),
    ({"distribution": "lognormal", "delay_ms": 20, "sigma": 0.5},
     lambda d: d.min() > 0 and abs(np.median(d) - 20) < 0.8 and abs(np.log(d).std() - 0.5) < 0.02),
])
def test_drawn_delays_follow_their_distribution(board: FaultBoard, params: dict[str, Any], check: Any) -> None:
    """5000 seeded draws; the bounds are several standard errors wide, so a correct sampler never fails them."""
    arm(board, "latency", **params)
    engine, _, sleeps = chaos_engine(board, seed=7)
    for _ in range(5000):
        engine.run(BATCH)
    delays_ms = np.array(sleeps.seconds) * 1000
    assert len(delays_ms) == 5000
    assert check(delays_ms), (delays_ms.min(), delays_ms.mean(), np.median(delays_ms), delays_ms.max())


def test_draws_repeat_with_the_seed_and_differ_without_it(board: FaultBoard) -> None:
    arm(board, "latency", distribution="exponential", delay_ms=20)

    def draws(seed: int) -> list[float]:
        engine, _, sleeps = chaos_engine(board, seed=seed)
        for _ in range(20):
            engine.run(BATCH)
        return sleeps.seconds

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_a_long_tail_draw_is_capped() -> None:
    rng = np.random.default_rng(0)
    spec = LatencySpec("lognormal", 50_000.0, sigma=3.0)
    assert max(draw_delay_ms(spec, rng) for _ in range(200)) == MAX_DELAY_MS


def test_the_error_fraction_holds_over_many_batches(board: FaultBoard) -> None:
    fault_id = arm(board, "error", fraction=0.3)
    engine, inner, _ = chaos_engine(board, seed=11)
    n = 4000
    failed = 0
    for _ in range(n):
        try:
            engine.run(BATCH)
        except InjectedError as exc:
            assert fault_id in str(exc) and "glassbox chaos" in str(exc)
            failed += 1
    sigma = math.sqrt(n * 0.3 * 0.7)  # binomial: about 29
    assert abs(failed - 0.3 * n) < 5 * sigma
    assert inner.runs == n - failed  # a failed batch never reaches the engine
    assert board.faults()[0].detail == {"batches_seen": n, "batches_failed": failed}


@pytest.mark.parametrize(("fraction", "expected_failures"), [(0.0, 0), (1.0, 50)])
def test_fractions_zero_and_one_are_exact(board: FaultBoard, fraction: float, expected_failures: int) -> None:
    arm(board, "error", fraction=fraction)
    engine, _, _ = chaos_engine(board)
    failures = 0
    for _ in range(50):
        try:
            engine.run(BATCH)
        except InjectedError:
            failures += 1
    assert failures == expected_failures


def test_an_injected_oom_is_what_the_fallback_engine_calls_an_oom(board: FaultBoard) -> None:
    fault_id = arm(board, "oom", batches=1)
    engine, inner, _ = chaos_engine(board)
    with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
        engine.run(BATCH)
    assert classify(caught.value) == "oom"
    assert "injected by glassbox chaos" in str(caught.value) and fault_id in str(caught.value)
    assert inner.runs == 0
    engine.run(BATCH)  # the budget of one batch is spent
    assert inner.runs == 1


def test_an_injected_error_is_not_a_gpu_fault() -> None:
    assert classify(InjectedError("batch failed on purpose (injected by glassbox chaos, fault x)")) is None


def test_behind_the_fallback_engine_an_oom_is_absorbed_and_an_error_propagates(board: FaultBoard) -> None:
    """The wiring --chaos uses: FallbackEngine(ChaosEngine(primary), secondary)."""
    clock = ManualClock()
    primary, secondary = Inner(offset=1.0), Inner(offset=2.0)
    engine = FallbackEngine(ChaosEngine(primary, board), secondary, clock=clock, release_cache=lambda: None)
    arm(board, "oom", batches=1)
    assert float(engine.run(BATCH).logits[0, 0]) == 2.0  # re-run on the secondary
    assert engine.state().reason == "oom" and engine.state().ooms == 1
    clock.advance(engine.state().breaker.cooldown_s)
    assert float(engine.run(BATCH).logits[0, 0]) == 1.0  # the probe: the budget is spent, the primary is back
    assert engine.state().reason == ""
    arm(board, "error", fraction=1.0)
    with pytest.raises(InjectedError):
        engine.run(BATCH)
    assert engine.state().reason == "" and secondary.runs == 1  # not absorbed: the batch fails as on a healthy GPU
