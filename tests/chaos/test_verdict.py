"""Verdict statistics on synthetic samples: bootstrap CIs, error budgets, recovery time, fallback, the judge."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from glassbox.chaos.experiment import ErrorBudget, Hypothesis
from glassbox.chaos.metrics_scrape import (
    WANTED_SAMPLES,
    MetricsSnapshot,
    Observation,
    observe,
    parse_metrics,
    wanted_lines,
)
from glassbox.chaos.samples import Sample, error_kind_for_status
from glassbox.chaos.stats import (
    PhaseWindow,
    bootstrap_percentile,
    bootstrap_ratio,
    errors,
    fallback_cleared_at,
    fallback_seen,
    latency_recovered_at,
    phase_stats,
    resampled_percentiles,
    split_phases,
)
from glassbox.chaos.verdict import judge

WINDOWS = (PhaseWindow("baseline", 0.0, 10.0), PhaseWindow("fault", 10.0, 20.0), PhaseWindow("recovery", 20.0, 30.0))


def lognormal(n: int, median_s: float, seed: int, sigma: float = 0.4) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(np.log(median_s), sigma, size=n))


def samples(start: float, end: float, latencies: np.ndarray, status: int = 200) -> list[Sample]:
    """Evenly spaced requests over [start, end) with the given latencies."""
    times = np.linspace(start, end, num=latencies.size, endpoint=False)
    error = error_kind_for_status(status)
    return [Sample(float(t), float(lat), status, error) for t, lat in zip(times, latencies, strict=True)]


def ok_obs(t: float, active: bool = False, entries: float = 0.0, ready: str = "ready") -> Observation:
    return Observation(t, MetricsSnapshot(1.0 if active else 0.0, entries, 0.0, {}), ready)


# --- bootstrap -----------------------------------------------------------------------------------------------------
def test_known_regression_ratio_ci_covers_the_truth() -> None:
    # Scaling every latency by 2 scales every percentile by 2: the true P99 ratio is exactly 2.
    base = lognormal(3000, 0.010, seed=1)
    fault = 2.0 * lognormal(3000, 0.010, seed=2)
    estimate = bootstrap_ratio(fault, base, seed=7)
    assert estimate is not None
    assert estimate.low <= 2.0 <= estimate.high
    assert estimate.low > 1.5 and estimate.high < 2.6  # tight enough to tell a 2x regression from none
    assert estimate.low <= estimate.point <= estimate.high
    assert (estimate.confidence, estimate.resamples) == (0.95, 2000)


def test_ratio_ci_coverage_over_many_draws() -> None:
    # A 95% interval should contain the truth in most repetitions; a broken one (e.g. resampling only one side,
    # or returning the point twice) would not.
    hits = 0
    for seed in range(40):
        base = lognormal(400, 0.010, seed=2 * seed)
        fault = 1.5 * lognormal(400, 0.010, seed=2 * seed + 1)
        estimate = bootstrap_ratio(fault, base, resamples=400, seed=seed)
        assert estimate is not None
        hits += estimate.low <= 1.5 <= estimate.high
    assert hits >= 34  # 85% of 40: a 95% interval falls below this with negligible probability


def test_no_regression_covers_one_and_is_seeded() -> None:
    base = lognormal(2000, 0.010, seed=3)
    same = lognormal(2000, 0.010, seed=4)
    first = bootstrap_ratio(same, base, seed=11)
    again = bootstrap_ratio(same, base, seed=11)
    other = bootstrap_ratio(same, base, seed=12)
    assert first is not None and other is not None
    assert first.low <= 1.0 <= first.high
    assert first == again and first != other


def test_bootstrap_edges() -> None:
    assert bootstrap_ratio(np.array([]), np.array([0.1])) is None
    assert bootstrap_percentile(np.array([])) is None
    constant = bootstrap_percentile(np.full(50, 0.02))
    assert constant is not None and constant.low == constant.high == constant.point == pytest.approx(0.02)


def test_resampling_is_chunked_without_changing_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    import glassbox.chaos.stats

    monkeypatch.setattr(glassbox.chaos.stats, "MAX_CELLS", 1000)  # force many small chunks
    values = lognormal(300, 0.01, seed=5)
    draws = resampled_percentiles(values, 99, 97, np.random.default_rng(0))
    assert draws.shape == (97,)
    assert values.min() <= draws.min() and draws.max() <= values.max()


# --- phases, errors --------------------------------------------------------------------------------------------------
def test_split_phases_by_intended_time_and_stats() -> None:
    data = [Sample(0.0, 0.01, 200, None), Sample(9.999, 0.02, 200, None), Sample(10.0, 0.5, 500, "http_5xx"),
            Sample(30.0, 0.03, 200, None), Sample(30.5, 0.03, 200, None)]
    by_phase = split_phases(data, WINDOWS)
    assert [len(by_phase[w.name]) for w in WINDOWS] == [2, 1, 1]  # 30.0 is the last phase's end: kept; 30.5 is not
    stats = phase_stats(WINDOWS[1], by_phase["fault"])
    assert (stats.requests, stats.ok, stats.errors["http_5xx"], stats.p99_s) == (1, 0, 1, None)
    base = phase_stats(WINDOWS[0], by_phase["baseline"])
    assert base.p50_s == pytest.approx(0.015) and base.offered_rate == pytest.approx(0.2)


@pytest.mark.parametrize(("failed", "budget", "ok"), [(0, 0.0, True), (5, 0.05, True), (6, 0.05, False),
                                                      (1, 0.0, False), (100, 1.0, True)])
def test_error_budget_boundary(failed: int, budget: float, ok: bool) -> None:
    fault = samples(10, 20, np.full(100 - failed, 0.01)) + samples(10, 20, np.full(failed, 0.01), status=500)
    base = samples(0, 10, np.full(100, 0.01))
    hypothesis = Hypothesis(error_budget=ErrorBudget(fault=budget))
    verdict = judge(hypothesis, base + fault + samples(20, 30, np.full(100, 0.01)), WINDOWS,
                    [ok_obs(-1), ok_obs(31)], rollback_s=20.0, resamples=200)
    check = next(c for c in verdict.checks if c.name == "fault error budget")
    assert check.ok is ok and check.value == pytest.approx(failed / 100)


def test_error_budget_counts_only_its_kinds() -> None:
    shed = samples(10, 20, np.full(30, 0.001), status=429) + samples(10, 20, np.full(70, 0.01))
    assert errors(shed, ("http_5xx",)).fraction == 0.0
    assert errors(shed, ("http_429", "http_5xx")).fraction == pytest.approx(0.3)
    assert errors(shed, ("http_5xx",)).by_kind["http_429"] == 30


# --- recovery and fallback -----------------------------------------------------------------------------------------
def test_latency_recovery_time() -> None:
    # Slow (200 ms) until 21.0 s, then back to 10 ms: with 1 s windows stepping 0.25 s, the first window clear of
    # the slow requests starts at 21.0 s.
    slow = samples(20, 21, np.full(50, 0.2))
    fast = samples(21, 30, np.full(450, 0.01))
    back = latency_recovered_at(slow + fast, 20.0, 30.0, threshold_s=0.02, window_s=1.0, kinds=("http_5xx",),
                                budget=0.0)
    assert back == pytest.approx(21.0)
    never = samples(20, 30, np.full(500, 0.2))
    assert latency_recovered_at(never, 20.0, 30.0, 0.02, 1.0, ("http_5xx",), 0.0) is None
    relapse = fast[:200] + samples(29, 30, np.full(50, 0.2))  # fine, then slow again at the end: not recovered
    assert latency_recovered_at(relapse, 20.0, 30.0, 0.02, 1.0, ("http_5xx",), 0.0) is None
    failing = samples(20, 30, np.full(500, 0.01), status=500)  # fast failures are not a recovery
    assert latency_recovered_at(failing, 20.0, 30.0, 0.02, 1.0, ("http_5xx",), 0.0) is None


def test_fallback_seen_and_cleared() -> None:
    timeline = [ok_obs(5), ok_obs(12, active=True, entries=1, ready="degraded"),
                ok_obs(18, active=True, entries=2, ready="degraded"), ok_obs(21, active=True, entries=2,
                                                                               ready="degraded"),
                ok_obs(22.5, entries=2), ok_obs(25, entries=2)]
    assert fallback_seen(timeline, 10.0) == (True, 12)
    assert fallback_cleared_at(timeline, 20.0) == 22.5
    # a switch and its recovery between two looks still shows in the counter
    blink = [ok_obs(5, entries=0), ok_obs(15, entries=1)]
    assert fallback_seen(blink, 10.0) == (True, 15)
    assert fallback_seen([ok_obs(5), ok_obs(15)], 10.0) == (False, None)
    unreadable = [Observation(5, None, "ready"), Observation(15, MetricsSnapshot(), "ready")]
    assert fallback_seen(unreadable, 10.0) == (None, None)
    relapse = [ok_obs(21), ok_obs(22, active=True, ready="degraded")]
    assert fallback_cleared_at(relapse, 20.0) is None


def test_parse_metrics() -> None:
    text = "\n".join([
        "# TYPE glassbox_fallback_active gauge", "glassbox_fallback_active 1.0",
        "# TYPE glassbox_fallback_events_total counter",
        'glassbox_fallback_events_total{reason="oom"} 2.0', 'glassbox_fallback_events_total{reason="probe_failed"} 1.0',
        'glassbox_fallback_events_total{reason="recovered"} 1.0',
        "# TYPE glassbox_chaos_fault_active gauge", 'glassbox_chaos_fault_active{fault="oom"} 1.0',
        'glassbox_chaos_fault_active{fault="latency"} 0.0', "",
    ])
    snapshot = parse_metrics(text)
    assert snapshot == MetricsSnapshot(1.0, 3.0, 1.0, {"oom": 1.0, "latency": 0.0})
    assert parse_metrics("# TYPE glassbox_fallback_active gauge\nglassbox_fallback_active 0\n").fallback_entries == 0
    assert parse_metrics("# TYPE other gauge\nother 1\n") == MetricsSnapshot()


def test_parse_metrics_reads_the_wanted_families_among_many_others() -> None:
    """Only the wanted families' lines reach the parser; what they say is read as from the whole exposition."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    registry = CollectorRegistry(support_collectors_without_names=True)
    stage = Histogram("glassbox_stage_duration_seconds", "a stage's time", ["stage"], registry=registry)
    for value in (0.001, 0.02, 0.3):
        stage.labels(stage="infer").observe(value)
    Gauge("glassbox_fallback_active", "1 while on the fallback \\ with a \"quoted\" help", registry=registry).set(1)
    events = Counter("glassbox_fallback_events", "switches", ["reason"], registry=registry)
    events.labels(reason="oom").inc(2)
    events.labels(reason="recovered").inc()
    Gauge("glassbox_fallback_activeness_other", "not wanted, same prefix", registry=registry).set(7)
    Gauge("glassbox_chaos_fault_active", "armed faults", ["fault"], registry=registry).labels(fault="oom").set(1)
    text = generate_latest(registry).decode()
    assert len(wanted_lines(text).splitlines()) < len(text.splitlines()) / 2
    assert parse_metrics(text) == MetricsSnapshot(1.0, 2.0, 1.0, {"oom": 1.0})
    # The samples the watch asks the server for (`?name[]=`) are all it needs to read the same.
    restricted = generate_latest(registry.restricted_registry(WANTED_SAMPLES)).decode()
    assert "glassbox_stage_duration_seconds" not in restricted
    assert parse_metrics(restricted) == parse_metrics(text)


def test_the_watch_asks_only_for_the_samples_it_reads() -> None:
    asked: list[httpx.URL] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="# TYPE glassbox_fallback_active gauge\nglassbox_fallback_active 1.0\n")
        return httpx.Response(200, json={"status": "degraded"})

    async def look() -> Observation:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await observe(client, "http://target", 1.5)

    seen = asyncio.run(look())
    assert asked[0].path == "/metrics" and asked[0].params.get_list("name[]") == list(WANTED_SAMPLES)
    assert seen.metrics is not None and seen.metrics.fallback_active == 1.0 and seen.ready == "degraded"


# --- the judge -------------------------------------------------------------------------------------------------------
def run_of(fault_scale: float, fault_status: int = 200) -> list[Sample]:
    return (samples(0, 10, lognormal(500, 0.01, 1)) + samples(10, 20, fault_scale * lognormal(500, 0.01, 2),
                                                              fault_status)
            + samples(20, 30, lognormal(500, 0.01, 3)))


FALLBACK_RUN = [ok_obs(-0.5), ok_obs(11, active=True, entries=1, ready="degraded"), ok_obs(20.5, entries=1),
                ok_obs(30.5, entries=1)]
HYPOTHESIS = Hypothesis(p99_ratio_max=1.5, recovery_p99_ratio_max=1.5, expect_fallback=True, recovery_time_max_s=2)


def test_judge_passes_a_run_within_tolerances() -> None:
    verdict = judge(HYPOTHESIS, run_of(1.0), WINDOWS, FALLBACK_RUN, rollback_s=20.0, faults_left=0, resamples=500)
    assert verdict.passed and not verdict.deviated, [c for c in verdict.checks if not c.ok]
    names = [c.name for c in verdict.checks]
    assert names == ["ready before", "baseline error budget", "P99 ratio fault/baseline", "fault error budget",
                     "fallback observed", "recovery error budget", "P99 ratio recovery/baseline", "recovery time",
                     "ready after", "faults disarmed"]
    assert verdict.recovery.fallback_s == pytest.approx(0.5)
    assert verdict.recovery.total_s is not None and verdict.recovery.total_s <= 2
    assert [s.name for s in verdict.phases] == ["baseline", "fault", "recovery"]


def test_judge_fails_a_regression_and_names_it() -> None:
    verdict = judge(HYPOTHESIS, run_of(3.0), WINDOWS, FALLBACK_RUN, rollback_s=20.0, faults_left=0, resamples=500)
    failed = [c.name for c in verdict.checks if not c.ok]
    assert failed == ["P99 ratio fault/baseline"]
    assert verdict.p99_ratio is not None and verdict.p99_ratio.low > 2.5
    assert not verdict.passed and not verdict.deviated  # the steady state after the rollback held


def test_judge_deviates_when_the_after_state_is_bad() -> None:
    stuck = [ok_obs(-0.5), ok_obs(11, active=True, entries=1, ready="degraded"),
             ok_obs(30.5, active=True, entries=1, ready="degraded")]
    verdict = judge(HYPOTHESIS, run_of(1.0), WINDOWS, stuck, rollback_s=20.0, faults_left=1, resamples=300)
    failed = {c.name for c in verdict.checks if not c.ok}
    assert failed == {"recovery time", "ready after", "faults disarmed"}
    assert verdict.deviated


def test_judge_without_fallback_or_successes() -> None:
    hypothesis = Hypothesis(p99_ratio_max=2, p99_max_ms=50, expect_fallback=True)
    verdict = judge(hypothesis, run_of(1.0, fault_status=500), WINDOWS, [ok_obs(-1), ok_obs(31)], rollback_s=20.0)
    by_name = {c.name: c for c in verdict.checks}
    assert not by_name["P99 ratio fault/baseline"].ok and by_name["P99 ratio fault/baseline"].measured == "n/a"
    assert not by_name["fault P99"].ok
    assert not by_name["fault error budget"].ok and by_name["fault error budget"].value == 1.0
    assert not by_name["fallback observed"].ok and by_name["fallback observed"].measured == "no"
    blind = judge(hypothesis, run_of(1.0), WINDOWS, [Observation(-1, None, "ready")], rollback_s=20.0)
    assert next(c for c in blind.checks if c.name == "fallback observed").measured == "not observable"


def test_the_refusal_check_judges_the_fault_phases_429_latency_and_needs_some() -> None:
    base = samples(0.0, 10.0, lognormal(400, 0.010, seed=11))
    fault_ok = samples(10.0, 20.0, lognormal(400, 0.012, seed=12))
    fast_refusals = samples(10.0, 20.0, lognormal(800, 0.0015, seed=13, sigma=0.2), status=429)
    slow_refusals = samples(10.0, 20.0, lognormal(800, 0.020, seed=14, sigma=0.2), status=429)
    recovery = samples(20.0, 30.0, lognormal(400, 0.010, seed=15))
    budget = ErrorBudget(kinds=("http_5xx",))
    hypothesis = Hypothesis(refusal_p99_max_ms=5.0, error_budget=budget)

    def check(fault: list[Sample]) -> object:
        verdict = judge(hypothesis, [*base, *fault, *recovery], WINDOWS, [ok_obs(0.0), ok_obs(30.0)],
                        rollback_s=20.0, resamples=500)
        [found] = [c for c in verdict.checks if c.name == "429 P99"]
        return found

    fast = check([*fault_ok, *fast_refusals])
    assert fast.ok and fast.value is not None and fast.value < 0.005 and "800 refused" in fast.measured
    slow = check([*fault_ok, *slow_refusals])
    assert not slow.ok and slow.value is not None and slow.value > 0.005
    none = check(fault_ok)
    assert not none.ok and none.measured == "no 429 answers"
