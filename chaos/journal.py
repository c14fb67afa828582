"""The journal: one JSON document per run, shaped after Chaos Toolkit's journal (status, deviated, steady states
before and after, run, rollbacks) with glassbox's verdict, per-phase figures and timeline added."""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import metadata
from pathlib import Path
from typing import Any

from glassbox.chaos.record import RunRecord, iso
from glassbox.chaos.verdict import Check, Verdict


def glassbox_version() -> str:
    try:
        return metadata.version("glassbox-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


def _steady_state(verdict: Verdict | None, group: str) -> dict[str, Any] | None:
    if verdict is None:
        return None
    checks: list[Check] = [c for c in verdict.checks if c.group == group]
    return {"steady_state_met": all(c.ok for c in checks),
            "probes": [{"name": c.name, "value": c.value, "measured": c.measured, "tolerance": c.tolerance,
                        "tolerance_met": c.ok, "detail": c.detail} for c in checks]}


def build_journal(record: RunRecord) -> dict[str, Any]:
    verdict = record.verdict
    experiment = dataclasses.asdict(record.experiment)
    return {
        "glassbox_version": glassbox_version(),
        "experiment": experiment,
        "status": record.status,
        "reason": record.reason or None,
        "deviated": verdict.deviated if verdict is not None else False,
        "exit_code": record.exit_code,
        "start": iso(record.started_at),
        "end": iso(record.ended_at),
        "duration": record.ended_at - record.started_at,
        "target": record.target.to_json(),
        "steady_states": {"before": _steady_state(verdict, "before"), "during": _steady_state(verdict, "method"),
                          "after": _steady_state(verdict, "after")},
        "run": [a.to_json(record.origin_wall) for a in record.activities],
        "rollbacks": [a.to_json(record.origin_wall) for a in record.rollbacks],
        "verdict": verdict.to_json() if verdict is not None else None,
        "phases": [w.to_json() for w in verdict.phases] if verdict is not None else
                  [{"name": w.name, "start_s": w.start_s, "end_s": w.end_s} for w in record.windows],
        "timeline": [{"t_s": record.t(e), "time": iso(e.wall), "kind": e.kind, "text": e.text, **dict(e.data)}
                     for e in record.events],
        "observations": [{"t_s": o.t_s, "ready": o.ready, "fallback_active": o.fallback_active,
                          "fallback_entries": o.metrics.fallback_entries if o.metrics else None,
                          "chaos_faults": o.metrics.chaos_faults if o.metrics else None, "error": o.error or None}
                         for o in record.observations],
        "load": dict(record.load) if record.load is not None else None,
        "capacity": dict(record.capacity) if record.capacity is not None else None,
        "files": dict(record.files),
    }


def _finite(value: Any) -> Any:
    """JSON has no inf or nan: a ratio over a zero P99, say, becomes null rather than invalid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_journal(record: RunRecord, path: Path) -> dict[str, Any]:
    journal = _finite(build_journal(record))
    # default=str: Paths in the experiment (texts file) and anything else the JSON module does not know
    path.write_text(json.dumps(journal, indent=2, default=str, allow_nan=False) + "\n", encoding="utf-8")
    return dict(journal)
