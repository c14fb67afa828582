"""The markdown report of a run: what was done to which target, the verdict table, per-phase latency, the timeline,
and the plots, linked by relative path so the report can be moved with its directory."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from glassbox.chaos.record import Activity, RunRecord, iso
from glassbox.chaos.stats import Estimate

STATUS_WORDS = {"completed": "PASSED", "failed": "FAILED", "aborted": "ABORTED", "skipped": "SKIPPED",
                "interrupted": "INTERRUPTED"}


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f}"


def _estimate(e: Estimate | None) -> str:
    return "n/a" if e is None else f"{e.point:.2f}x (95% CI {e.low:.2f}–{e.high:.2f}, {e.resamples} resamples)"


def _summary(output: object, limit: int = 160) -> str:
    if output is None:
        return ""
    text = json.dumps(output, default=str, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _activities(title: str, activities: Sequence[Activity], origin_wall: float) -> list[str]:
    if not activities:
        return []
    rows = [(a.name, a.type, a.status, f"{a.start - origin_wall:.2f}", f"{(a.end - a.start) * 1000:.0f} ms",
             a.error or _summary(a.output)) for a in activities]
    return ["", f"## {title}", "", *_table(("activity", "type", "status", "t (s)", "took", "output / error"), rows)]


def _attackers(record: RunRecord) -> list[str]:
    """What the slow-client attackers saw, from their reports in the rollback output."""
    reports = [r for a in record.rollbacks if isinstance(a.output, dict)
               for r in a.output.get("reports", ()) if isinstance(r, dict)]
    if not reports:
        return []
    header = ("mode", "connections", "bytes/s each", "opened", "cut by server", "statuses", "held until cut (median)",
              "open at the end")
    rows = [(r.get("mode"), r.get("connections"), r.get("bytes_per_s"), r.get("opened"), r.get("closed_by_server"),
             ", ".join(f"{k}: {v}" for k, v in (r.get("statuses") or {}).items()) or "none",
             _held(r.get("held_s")), r.get("still_open_at_end")) for r in reports]
    return ["", "## Slow-client attackers", "", *_table(header, rows)]


def _held(held: object) -> str:
    median = held.get("median") if isinstance(held, dict) else None
    return f"{median:.1f} s" if isinstance(median, int | float) else "—"


def build_report(record: RunRecord) -> str:
    experiment = record.experiment
    verdict = record.verdict
    target = record.target
    where = f"`{target.url}`"
    if target.local:
        where += f" (started for this run: model `{target.model}`"
        where += f", flags `{' '.join(target.serve_args)}`)" if target.serve_args else ")"
    rates = ", ".join(f"{p.name} {experiment.rate_of(p):g}/s for {p.duration_s:g} s"
                      + ("" if p.profile == "steady" else f" ({p.profile})") for p in experiment.phases)
    lines = [f"# {experiment.title}", ""]
    if experiment.description:
        lines += [f"> {experiment.description}", ""]
    facts = [("status", f"**{STATUS_WORDS[record.status]}** ({record.status}, exit code {record.exit_code})"),
             ("experiment", f"`{experiment.name}`"), ("target", where),
             ("run", f"{iso(record.started_at)}, {record.ended_at - record.started_at:.1f} s"),
             ("load", f"open loop, {experiment.load.protocol}, {experiment.load.connections} connections: {rates}"),
             ("faults", ", ".join(f"`{_summary(a.arm)}`" if a.arm is not None else a.name
                                  for a in experiment.phase("fault").actions))]
    if target.engine:
        facts.append(("engine", f"`{target.engine}` at the start"))
    if record.reason:
        facts.append(("reason", record.reason))
    if target.ignored:
        facts.append(("note", target.ignored))
    lines += _table(("", ""), facts)

    if verdict is not None:
        lines += ["", f"## Verdict: {experiment.hypothesis.title}", ""]
        lines += _table(("group", "check", "measured", "tolerance", "result"),
                        [(c.group, c.name, c.measured, c.tolerance, "pass" if c.ok else "**FAIL**")
                         for c in verdict.checks])
        recovery = verdict.recovery
        lines += ["", f"- P99 regression, fault / baseline: {_estimate(verdict.p99_ratio)}",
                  f"- P99 regression, recovery / baseline: {_estimate(verdict.recovery_p99_ratio)}",
                  "- recovery time after rollback: " + ("not recovered by the end of the run"
                                                        if recovery.total_s is None else f"{recovery.total_s:.2f} s"),
                  f"- deviated (steady state not met after the rollback): {'yes' if verdict.deviated else 'no'}"]
        lines += [f"- note: {note}" for note in verdict.notes]
        lines += ["", "## Phases", ""]
        header = ("phase", "window (s)", "requests", "offered/s", "2xx", "errors", "p50 ms", "p95 ms", "p99 ms",
                  "p99.9 ms")
        lines += _table(header, [(s.name, f"{s.start_s:.1f}–{s.end_s:.1f}", s.requests, f"{s.offered_rate:.1f}", s.ok,
                                  ", ".join(f"{k} {n}" for k, n in s.errors.items() if n) or "none",
                                  _ms(s.p50_s), _ms(s.p95_s), _ms(s.p99_s), _ms(s.p999_s)) for s in verdict.phases])
        lines += ["", "Latency is measured from each request's intended send time (open loop, no coordinated "
                  "omission) over successful requests; failures count against the error budget instead."]

    if record.events:
        lines += ["", "## Timeline", ""]
        lines += _table(("t (s)", "event", "what"), ((f"{record.t(e):.2f}", e.kind, e.text) for e in record.events))
    lines += _activities("Method", record.activities, record.origin_wall)
    lines += _activities("Rollbacks", record.rollbacks, record.origin_wall)
    lines += _attackers(record)
    plots = [(name, path) for name, path in record.files.items() if path.endswith(".png")]
    if plots:
        lines += ["", "## Plots", ""]
        for name, path in plots:
            lines += [f"![{name.replace('_', ' ')}]({path})", ""]
    others = [(name, path) for name, path in record.files.items() if not path.endswith(".png")]
    if others:
        lines += ["", "## Files", ""] + [f"- {name}: [`{path}`]({path})" for name, path in others]
    return "\n".join(lines).rstrip() + "\n"


def write_report(record: RunRecord, path: Path) -> Path:
    path.write_text(build_report(record), encoding="utf-8")
    return path
