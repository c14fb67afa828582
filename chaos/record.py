"""What one experiment run leaves behind, as data: the timeline, the activities and rollbacks, and the run record
that the journal, the report and the plots are written from."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from glassbox.chaos.experiment import Experiment
from glassbox.chaos.metrics_scrape import Observation
from glassbox.chaos.samples import Sample
from glassbox.chaos.stats import PhaseWindow
from glassbox.chaos.verdict import Verdict

# completed: ran and the verdict passed; failed: ran and the verdict failed; aborted: could not run (the target was
# unreachable, refused the fault spec or the token, or the load could not start); skipped: the target cannot inject
# this fault at all (409 chaos_unsupported, e.g. a GPU fault on a CPU server): nothing was judged; interrupted: Ctrl-C.
Status = Literal["completed", "failed", "aborted", "skipped", "interrupted"]
EXIT_CODES: dict[Status, int] = {"completed": 0, "failed": 1, "aborted": 3, "skipped": 4, "interrupted": 130}
EXIT_USAGE = 2  # the command line or the experiment file is wrong; no journal is written
ActivityStatus = Literal["succeeded", "failed"]


@dataclass(frozen=True, slots=True)
class Event:
    mono: float  # time.monotonic()
    wall: float  # time.time()
    kind: str  # server_started, load_started, phase, inject, rollback, fallback_seen, fallback_cleared, ...
    text: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Activity:
    """One action, probe or rollback, in the spirit of a Chaos Toolkit run entry."""

    name: str
    type: Literal["action", "probe", "rollback"]
    start: float  # time.time()
    end: float
    status: ActivityStatus
    output: Any = None  # JSON-able
    error: str = ""

    def to_json(self, origin_wall: float) -> dict[str, Any]:
        return {"activity": {"name": self.name, "type": self.type}, "status": self.status,
                "start": iso(self.start), "end": iso(self.end), "duration": self.end - self.start,
                "t_s": self.start - origin_wall, "output": self.output, "exception": self.error or None}


class Timeline:
    """Events as they happen; times become offsets on the load clock once that clock's origin is known."""

    def __init__(self, on_mark: Callable[[Event], None] | None = None) -> None:
        self.events: list[Event] = []
        self._on_mark = on_mark  # e.g. progress lines on a terminal, as each event happens

    def mark(self, kind: str, text: str, mono: float | None = None, **data: Any) -> Event:
        """An event now, or at an earlier `mono` (e.g. when an observation began rather than when it came back)."""
        now_mono, now_wall = time.monotonic(), time.time()
        at = now_mono if mono is None else mono
        event = Event(at, now_wall - (now_mono - at), kind, text, data)
        self.events.append(event)
        if self._on_mark is not None:
            self._on_mark(event)
        return event


@dataclass(frozen=True, slots=True)
class TargetInfo:
    url: str
    local: bool  # started for this run
    model: str | None = None  # local: the model directory ("default": the built-in one)
    serve_args: tuple[str, ...] = ()
    log_path: str | None = None
    ignored: str = ""  # e.g. the experiment's target section, unused against a remote target
    # What the target said it runs at the start (its /info): the engine kind and the number format, which for a
    # fallback is the CPU's ("fallback(graph-fp16, eager-bf16)"): the fault phase of oom-fallback is served by it.
    engine: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "local": self.local, "model": self.model, "serve_args": list(self.serve_args),
                "log": self.log_path, "note": self.ignored or None, "engine": self.engine or None}


@dataclass(frozen=True, slots=True)
class RunRecord:
    experiment: Experiment
    target: TargetInfo
    status: Status
    reason: str  # why it was aborted, skipped, interrupted or failed ("" when it passed)
    started_at: float  # time.time()
    ended_at: float
    origin_mono: float  # time.monotonic() of the load's start: t = 0 for samples, events and observations
    origin_wall: float
    windows: tuple[PhaseWindow, ...]
    samples: tuple[Sample, ...]
    observations: tuple[Observation, ...]
    events: tuple[Event, ...]
    activities: tuple[Activity, ...]
    rollbacks: tuple[Activity, ...]
    verdict: Verdict | None  # None: the method did not run to the end
    load: Mapping[str, Any] | None = None  # the load generator's own summary
    files: Mapping[str, str] = field(default_factory=dict)  # name -> path, relative to the output directory
    capacity: Mapping[str, Any] | None = None  # the closed-loop capacity run, when the rates were relative to it

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def t(self, event: Event) -> float:
        return event.mono - self.origin_mono

    def fault_spans(self) -> list[tuple[float, float]]:
        """(inject, rollback) pairs on the load clock; an injection without a rollback lasts to the fault's end."""
        spans: list[tuple[float, float]] = []
        start: float | None = None
        for event in self.events:
            if event.kind == "inject" and start is None:
                start = self.t(event)
            elif event.kind == "rollback" and start is not None:
                spans.append((start, self.t(event)))
                start = None
        if start is not None:
            fault = next((w for w in self.windows if w.name == "fault"), None)
            spans.append((start, fault.end_s if fault is not None else start))
        return spans


def iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"
