"""The verdict of one experiment run: each hypothesis tolerance becomes a Check with the measured value beside it.

Checks fall into three groups, after Chaos Toolkit: `before` (the steady state before the fault: readiness, the
baseline's errors), `method` (the cost of the fault: P99 regression, errors, fallback), and `after` (the steady state
after the rollback: recovery errors and latency, recovery time, readiness). The run deviated when an `after` check
failed. A latency tolerance is met only when the upper bound of its bootstrap 95% confidence interval is within it,
so too few samples to tell fail rather than pass by luck.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from glassbox.chaos.experiment import DriftCheck, Hypothesis
from glassbox.chaos.metrics_scrape import Observation
from glassbox.chaos.samples import Sample
from glassbox.chaos.stats import (
    Estimate,
    PhaseStats,
    PhaseWindow,
    bootstrap_percentile,
    bootstrap_ratio,
    errors,
    fallback_cleared_at,
    fallback_seen,
    latency_recovered_at,
    ok_latencies,
    phase_stats,
    rolling_p99,
    split_phases,
)

Group = Literal["before", "method", "after"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    group: Group
    ok: bool
    measured: str  # for people: the value with its unit (and CI where there is one)
    tolerance: str
    value: float | None = None  # for machines: the number compared with the tolerance
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "group": self.group, "ok": self.ok, "measured": self.measured,
                "tolerance": self.tolerance, "value": self.value, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Recovery:
    rollback_s: float | None  # when the rollback finished, on the load clock
    latency_s: float | None  # rollback until latency was back (None: never, or not measured)
    fallback_s: float | None  # rollback until the fallback was off and /readyz not degraded
    judged_fallback: bool  # whether fallback_s is part of the recovery time
    threshold_s: float | None  # the rolling-window P99 that counts as back

    @property
    def total_s(self) -> float | None:
        parts = [self.latency_s] + ([self.fallback_s] if self.judged_fallback else [])
        return None if any(p is None for p in parts) else max(p for p in parts if p is not None)

    def to_json(self) -> dict[str, object]:
        return {"rollback_s": self.rollback_s, "latency_s": self.latency_s, "fallback_s": self.fallback_s,
                "total_s": self.total_s, "latency_threshold_s": self.threshold_s}


@dataclass(frozen=True, slots=True)
class Verdict:
    checks: tuple[Check, ...]
    phases: tuple[PhaseStats, ...]
    p99_ratio: Estimate | None  # fault / baseline
    recovery_p99_ratio: Estimate | None  # recovery / baseline
    fault_p99: Estimate | None
    fallback_first_s: float | None
    recovery: Recovery
    notes: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def deviated(self) -> bool:
        return any(not c.ok for c in self.checks if c.group == "after")

    def group(self, name: Group) -> list[Check]:
        return [c for c in self.checks if c.group == name]

    def to_json(self) -> dict[str, object]:
        def est(e: Estimate | None) -> object:
            return None if e is None else e.to_json()

        return {"passed": self.passed, "deviated": self.deviated, "checks": [c.to_json() for c in self.checks],
                "p99_ratio": est(self.p99_ratio), "recovery_p99_ratio": est(self.recovery_p99_ratio),
                "fault_p99_s": est(self.fault_p99), "fallback_first_s": self.fallback_first_s,
                "recovery": self.recovery.to_json(), "notes": list(self.notes)}


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def _ratio_check(name: str, group: Group, estimate: Estimate | None, limit: float) -> Check:
    if estimate is None:
        return Check(name, group, False, "n/a", f"CI high <= {limit:g}", None, "no successful requests to compare")
    measured = f"{estimate.point:.2f}x (95% CI {estimate.low:.2f}-{estimate.high:.2f})"
    return Check(name, group, estimate.high <= limit, measured, f"CI high <= {limit:g}x", estimate.high)


def _budget_check(phase: str, group: Group, samples: Sequence[Sample], hypothesis: Hypothesis) -> Check:
    budget = hypothesis.error_budget
    count = errors(samples, budget.kinds)
    limit = budget.for_phase(phase)  # type: ignore[arg-type]
    shown = ", ".join(f"{k} {n}" for k, n in count.by_kind.items() if n) or "none"
    ok = count.total > 0 and count.fraction <= limit
    detail = f"errors by kind: {shown}; counted kinds: {', '.join(budget.kinds)}"
    if count.total == 0:
        detail = "no requests in this phase"
    return Check(f"{phase} error budget", group, ok, f"{count.counted}/{count.total} = {count.fraction:.2%}",
                 f"<= {limit:.2%}", count.fraction, detail)


def _refusal_check(samples: Sequence[Sample], limit_ms: float, resamples: int, seed: int) -> Check:
    """Overload is shed fast: the fault phase's 429 answers, P99 within `limit_ms` (upper CI bound). A run in which
    nothing was refused fails this check: the load never reached the point where shedding is judged."""
    refused = np.array([s.latency_s for s in samples if s.status == 429], dtype=np.float64)
    estimate = bootstrap_percentile(refused, resamples=resamples, seed=seed)
    tolerance = f"CI high <= {limit_ms:g} ms"
    if estimate is None:
        return Check("429 P99", "method", False, "no 429 answers", tolerance, None,
                     "nothing was refused during the fault phase")
    measured = f"{_ms(estimate.point)} (95% CI {_ms(estimate.low)}-{_ms(estimate.high)}), {refused.size} refused"
    return Check("429 P99", "method", estimate.high <= limit_ms / 1000, measured, tolerance, estimate.high)


def _ready_check(name: str, group: Group, obs: Observation | None) -> Check:
    status = None if obs is None else obs.ready
    detail = obs.error if obs is not None else "not observed"
    return Check(name, group, status == "ready", str(status), "ready", None, detail)


def judge(
    hypothesis: Hypothesis,
    samples: Sequence[Sample],
    windows: Sequence[PhaseWindow],  # baseline, fault, recovery
    observations: Sequence[Observation],  # in time order: the first before the load, the last after it
    *,
    rollback_s: float | None,
    faults_left: int | None = None,  # faults still armed after the rollback (None: unknown)
    seed: int = 0,
    resamples: int = 2000,
) -> Verdict:
    baseline_w, fault_w, recovery_w = windows
    by_phase = split_phases(samples, windows)
    stats = tuple(phase_stats(w, by_phase[w.name]) for w in windows)
    base, fault, recovery = (ok_latencies(by_phase[w.name]) for w in windows)
    ratio = bootstrap_ratio(fault, base, resamples=resamples, seed=seed)
    recovery_ratio = bootstrap_ratio(recovery, base, resamples=resamples, seed=seed + 1)
    fault_p99 = bootstrap_percentile(fault, resamples=resamples, seed=seed + 2)
    checks: list[Check] = [_ready_check("ready before", "before", observations[0] if observations else None),
                           _budget_check("baseline", "before", by_phase[baseline_w.name], hypothesis)]

    if hypothesis.p99_ratio_max is not None:
        checks.append(_ratio_check("P99 ratio fault/baseline", "method", ratio, hypothesis.p99_ratio_max))
    if hypothesis.p99_max_ms is not None:
        limit_s = hypothesis.p99_max_ms / 1000
        measured = "n/a" if fault_p99 is None else \
            f"{_ms(fault_p99.point)} (95% CI {_ms(fault_p99.low)}-{_ms(fault_p99.high)})"
        checks.append(Check("fault P99", "method", fault_p99 is not None and fault_p99.high <= limit_s, measured,
                            f"CI high <= {hypothesis.p99_max_ms:g} ms", None if fault_p99 is None else fault_p99.high))
    if hypothesis.refusal_p99_max_ms is not None:
        checks.append(_refusal_check(by_phase[fault_w.name], hypothesis.refusal_p99_max_ms, resamples, seed + 3))
    checks.append(_budget_check("fault", "method", by_phase[fault_w.name], hypothesis))
    drift = _drift_checks(hypothesis.drift, observations, windows) if hypothesis.drift is not None else []
    checks[2:2] = [c for c in drift if c.group == "before"]
    checks += [c for c in drift if c.group == "method"]
    seen, first_s = fallback_seen(observations, fault_w.start_s)
    if hypothesis.expect_fallback is not None:
        want = hypothesis.expect_fallback
        measured = {True: f"yes, first at t={first_s:.2f}s" if first_s is not None else "yes", False: "no",
                    None: "not observable"}[seen]
        detail = "" if seen is not None else "the target's /metrics has no glassbox_fallback_active series"
        checks.append(Check("fallback observed", "method", seen is want, measured, "yes" if want else "no",
                            None, detail))

    checks.append(_budget_check("recovery", "after", by_phase[recovery_w.name], hypothesis))
    if hypothesis.recovery_p99_ratio_max is not None:
        checks.append(_ratio_check("P99 ratio recovery/baseline", "after", recovery_ratio,
                                   hypothesis.recovery_p99_ratio_max))
    windows_p99 = rolling_p99(by_phase[baseline_w.name], baseline_w.start_s, baseline_w.end_s,
                              hypothesis.recovery_window_s)
    recovery_state = _recovery(hypothesis, by_phase[recovery_w.name], recovery_w, observations, rollback_s,
                               max(windows_p99) if windows_p99 else None, bool(seen))
    if hypothesis.recovery_time_max_s is not None:
        total = recovery_state.total_s
        shown = "not recovered" if total is None else f"{total:.2f} s"
        detail = f"rolling P99 back under {_ms(recovery_state.threshold_s)} after {_s(recovery_state.latency_s)}"
        if recovery_state.judged_fallback:
            detail += f"; fallback off and /readyz ready after {_s(recovery_state.fallback_s)}"
        checks.append(Check("recovery time", "after", total is not None and total <= hypothesis.recovery_time_max_s,
                            shown, f"<= {hypothesis.recovery_time_max_s:g} s", total, detail))
    checks += [c for c in drift if c.group == "after"]
    checks.append(_ready_check("ready after", "after", observations[-1] if observations else None))
    if faults_left is not None:
        checks.append(Check("faults disarmed", "after", faults_left == 0, f"{faults_left} armed", "0 armed",
                            float(faults_left)))
    notes = tuple(f"{s.name}: only {s.ok} successful requests; its P99 is close to its maximum"
                  for s in stats if 0 < s.ok < 100)
    return Verdict(tuple(checks), stats, ratio, recovery_ratio, fault_p99, first_s, recovery_state, notes)


def _drift_checks(drift: DriftCheck, observations: Sequence[Observation], windows: Sequence[PhaseWindow]
                  ) -> list[Check]:
    """The prediction drift gauge against its threshold: never over it in the baseline, over it within `within_s`
    of the fault's start, at or under it again at the end of the recovery."""
    name, limit = drift.distribution, drift.threshold

    def figures(window: PhaseWindow) -> list[tuple[float, float]]:
        return [(o.t_s, o.metrics.drift[name]) for o in observations
                if o.metrics is not None and name in o.metrics.drift and window.start_s <= o.t_s <= window.end_s]

    unseen = (f"no glassbox_prediction_drift{{distribution=\"{name}\"}} figure in this phase: the target needs a "
              "reference and enough texts in its window (300)")
    baseline_w, fault_w, recovery_w = windows
    checks = []
    seen = figures(baseline_w)
    worst = max((value for _, value in seen), default=None)
    checks.append(Check(f"{name} drift in the baseline", "before", worst is not None and worst <= limit,
                        "n/a" if worst is None else f"max {worst:.3f}", f"<= {limit:g}", worst,
                        "" if seen else unseen))
    seen = figures(fault_w)
    crossed = next((t - fault_w.start_s for t, value in seen if value > limit), None)
    peak = max((value for _, value in seen), default=None)
    measured = "never" if crossed is None else f"after {crossed:.1f} s"
    if peak is not None:
        measured += f" (peak {peak:.3f})"
    checks.append(Check(f"{name} drift detected", "method", crossed is not None and crossed <= drift.within_s,
                        measured, f"over {limit:g} within {drift.within_s:g} s", crossed, "" if seen else unseen))
    seen = figures(recovery_w)
    last = seen[-1][1] if seen else None
    checks.append(Check(f"{name} drift cleared", "after", last is not None and last <= limit,
                        "n/a" if last is None else f"{last:.3f} at the end", f"<= {limit:g}", last,
                        "" if seen else unseen))
    return checks


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _recovery(hypothesis: Hypothesis, samples: Sequence[Sample], window: PhaseWindow,
              observations: Sequence[Observation], rollback_s: float | None, baseline_worst_p99: float | None,
              fallback_seen: bool) -> Recovery:
    """Latency is back when a rolling window's P99 is within `recovery_tolerance` x the worst rolling-window P99 of
    the baseline, plus `recovery_slack_ms`: windows of the same width hold as few samples as the baseline's did, so
    the baseline's own window-to-window noise sets the bar rather than its whole-phase P99."""
    judged_fallback = bool(hypothesis.expect_fallback) or fallback_seen
    if rollback_s is None or baseline_worst_p99 is None:
        return Recovery(rollback_s, None, None, judged_fallback, None)
    budget = hypothesis.error_budget
    threshold = hypothesis.recovery_tolerance * baseline_worst_p99 + hypothesis.recovery_slack_ms / 1000
    back = latency_recovered_at(samples, rollback_s, window.end_s, threshold,
                                hypothesis.recovery_window_s, budget.kinds, budget.recovery)
    cleared = fallback_cleared_at(observations, rollback_s)
    return Recovery(rollback_s, None if back is None else max(0.0, back - rollback_s),
                    None if cleared is None else max(0.0, cleared - rollback_s), judged_fallback, threshold)
