"""Chaos experiments as YAML: the schema, strict validation with errors that name the field, and test-time scaling.

An experiment is a steady-state hypothesis with tolerances, a method of exactly three phases (baseline, fault,
recovery) under one continuous open-loop load, and rollbacks that always run. Only the fault phase carries actions;
rollbacks run when the fault phase ends (and again on abort or Ctrl-C), so the recovery phase measures the server
after the fault is gone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glassbox.chaos.samples import ERROR_KINDS, ErrorKind
from glassbox.service.errors import GlassboxError

PhaseName = Literal["baseline", "fault", "recovery"]
PHASES: tuple[PhaseName, ...] = ("baseline", "fault", "recovery")
Profile = Literal["steady", "step", "burst"]
Protocol = Literal["json", "frames"]
SlowMode = Literal["headers", "body", "reader"]
Rollback = Literal["disarm_faults", "stop_slow_clients"]
ROLLBACKS: tuple[Rollback, ...] = ("disarm_faults", "stop_slow_clients")

DEFAULT_HYPOTHESIS = "the service stays within its tolerances"
DEFAULT_TTL_MARGIN_S = 30.0  # an arm without ttl_s outlives its phase by this much, so a lost runner still disarms


class ExperimentError(GlassboxError):
    """The experiment file is not valid; the message names the offending field."""

    code = "chaos_invalid_experiment"


@dataclass(frozen=True, slots=True)
class Target:
    """How to start the local server when no --target is given (ignored for a remote target)."""

    model: str = "default"  # "default": the built-in model; else a model directory
    serve_args: tuple[str, ...] = ()  # extra `glassbox serve` flags, e.g. ("--fallback-cooldown-s", "1")
    startup_timeout_s: float = 180.0


@dataclass(frozen=True, slots=True)
class Texts:
    """Where a run's texts come from: a file (one text a line, or JSON lines with "text" and "label" fields), or the
    held-out split of the local server's model (its heldout.jsonl); `label` keeps only the texts labelled so."""

    file: Path | None = None
    heldout: bool = False
    label: str | None = None

    def describe(self) -> str:
        where = "the model's held-out texts" if self.heldout else str(self.file)
        return where + (f" labelled {self.label}" if self.label is not None else "")


@dataclass(frozen=True, slots=True)
class Load:
    rate: float  # requests/s in phases that do not set their own (a multiple of capacity when `relative`)
    protocol: Protocol = "json"
    connections: int = 16
    timeout_s: float = 10.0
    texts: Texts | None = None  # None: the generator's built-in length mix
    seed: int = 0
    max_outstanding: int = 1024
    warmup_s: float = 0.0  # load at the baseline rate before the baseline phase; not judged (cold connections)
    relative: bool = False  # every rate is a multiple of the target's capacity, measured before the run
    capacity_connections: int = 32  # the closed-loop clients that measure it
    capacity_duration_s: float = 5.0


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """Largest fraction of a phase's requests that may end in one of `kinds` (the boundary itself passes)."""

    kinds: tuple[ErrorKind, ...] = ERROR_KINDS
    baseline: float = 0.0
    fault: float = 0.0
    recovery: float = 0.0

    def for_phase(self, phase: PhaseName) -> float:
        value: float = getattr(self, phase)
        return value


@dataclass(frozen=True, slots=True)
class DriftCheck:
    """What the prediction drift gauge (glassbox_prediction_drift{distribution}) must do: stay at or under
    `threshold` through the baseline, cross it within `within_s` of the fault phase's start, and be back at or under
    it by the end of the recovery."""

    distribution: str = "labels"
    threshold: float = 0.25
    within_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """The steady state and how far the fault may push it. Latency checks use the upper bound of the bootstrap 95%
    confidence interval, so a check passes only when the data rule out a worse value, not merely on a lucky sample."""

    title: str = DEFAULT_HYPOTHESIS
    p99_ratio_max: float | None = None  # P99(fault) / P99(baseline)
    p99_max_ms: float | None = None  # P99(fault), absolute, in ms
    refusal_p99_max_ms: float | None = None  # P99 latency of the fault phase's 429 answers, in ms
    recovery_p99_ratio_max: float | None = None  # P99(recovery) / P99(baseline)
    error_budget: ErrorBudget = field(default_factory=ErrorBudget)
    expect_fallback: bool | None = None  # True: must fall back during the fault; False: must not; None: not judged
    recovery_time_max_s: float | None = None  # rollback until latency (and fallback) are back
    recovery_window_s: float = 1.0  # width of the rolling window the recovery time is measured with
    recovery_tolerance: float = 1.5  # a window is back when its P99 <= this x the worst baseline window P99 ...
    recovery_slack_ms: float = 5.0  # ... + this, so a few ms of scheduler jitter on a fast model is not a relapse
    drift: DriftCheck | None = None  # judged only when set


@dataclass(frozen=True, slots=True)
class SlowClients:
    connections: int
    mode: SlowMode = "headers"
    bytes_per_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Action:
    """Exactly one of `arm` (a fault spec for POST /chaos/faults) or `slow_clients`."""

    arm: Mapping[str, Any] | None = None
    slow_clients: SlowClients | None = None

    @property
    def name(self) -> str:
        if self.arm is not None:
            return f"arm {self.arm['fault']}"
        assert self.slow_clients is not None
        return f"start {self.slow_clients.connections} slow clients ({self.slow_clients.mode})"


@dataclass(frozen=True, slots=True)
class Phase:
    name: PhaseName
    duration_s: float
    rate: float | None = None  # None: the load's rate
    profile: Profile = "steady"
    actions: tuple[Action, ...] = ()
    texts: Texts | None = None  # fault phase only: what clients send instead of the load's texts


@dataclass(frozen=True, slots=True)
class Experiment:
    name: str  # the file's stem: used in paths, tags and annotations
    title: str
    description: str
    load: Load
    hypothesis: Hypothesis
    phases: tuple[Phase, Phase, Phase]
    target: Target = field(default_factory=Target)
    tags: tuple[str, ...] = ()
    rollbacks: tuple[Rollback, ...] = ROLLBACKS

    def phase(self, name: PhaseName) -> Phase:
        return next(p for p in self.phases if p.name == name)

    def rate_of(self, phase: Phase) -> float:
        return self.load.rate if phase.rate is None else phase.rate

    def resolved(self, capacity_per_s: float) -> Experiment:
        """This experiment with its capacity-relative rates turned into requests/s at `capacity_per_s`."""
        if not self.load.relative:
            return self
        if capacity_per_s <= 0:
            raise ExperimentError("the target served nothing while its capacity was measured")
        phases = tuple(dataclasses.replace(p, rate=None if p.rate is None else p.rate * capacity_per_s)
                       for p in self.phases)
        load = dataclasses.replace(self.load, rate=self.load.rate * capacity_per_s, relative=False)
        return dataclasses.replace(self, phases=phases, load=load)  # type: ignore[arg-type]

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @property
    def faults(self) -> tuple[str, ...]:
        return tuple(str(a.arm["fault"]) for p in self.phases for a in p.actions if a.arm is not None)

    def scaled(self, duration: float = 1.0, rate: float = 1.0) -> Experiment:
        """Shorter (or longer) phases and warm-up, and a lower (or higher) rate, e.g. for tests. Tolerances in
        seconds (recovery_time_max_s, recovery_window_s) stay: they measure the server, not the length of the run."""
        if not (math.isfinite(duration) and math.isfinite(rate) and duration > 0 and rate > 0):
            raise ExperimentError("scale factors must be positive and finite")  # nan <= 0 is False
        phases = tuple(dataclasses.replace(p, duration_s=p.duration_s * duration,
                                           rate=None if p.rate is None else p.rate * rate) for p in self.phases)
        load = dataclasses.replace(self.load, rate=self.load.rate * rate, warmup_s=self.load.warmup_s * duration,
                                   capacity_duration_s=self.load.capacity_duration_s * duration)
        return dataclasses.replace(self, phases=phases, load=load)  # type: ignore[arg-type]
