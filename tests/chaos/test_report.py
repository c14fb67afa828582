"""Journal, markdown report, PNG plots and Grafana annotations, from a synthetic run record."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glassbox.chaos.grafana import GrafanaAnnotator
from glassbox.chaos.journal import build_journal, write_journal
from glassbox.chaos.local import free_port
from glassbox.chaos.metrics_scrape import MetricsSnapshot, Observation
from glassbox.chaos.plots import write_plots
from glassbox.chaos.record import Activity, Event, RunRecord, TargetInfo
from glassbox.chaos.report import build_report
from glassbox.chaos.samples import Sample
from glassbox.chaos.schema import parse_experiment
from glassbox.chaos.stats import PhaseWindow
from glassbox.chaos.verdict import judge

PNG = b"\x89PNG\r\n\x1a\n"
WINDOWS = (PhaseWindow("baseline", 1.0, 4.0), PhaseWindow("fault", 4.0, 7.0), PhaseWindow("recovery", 7.0, 10.0))


def experiment_raw() -> dict[str, Any]:
    return {
        "title": "OOM drill", "description": "A synthetic run.", "load": {"rate": 50, "warmup_s": 1},
        "hypothesis": {"p99_ratio_max": 2.5, "expect_fallback": True, "recovery_time_max_s": 2,
                       "error_budget": {"fault": 0.01}},
        "method": [{"phase": "baseline", "duration_s": 3},
                   {"phase": "fault", "duration_s": 3, "actions": [{"arm": {"fault": "oom", "mode": "raise"}}]},
                   {"phase": "recovery", "duration_s": 3}],
    }


def synthetic_record(status: str = "completed", with_verdict: bool = True) -> RunRecord:
    experiment = parse_experiment(experiment_raw(), "oom-drill")
    rng = np.random.default_rng(0)
    times = np.arange(0.0, 10.0, 0.02)
    latencies = np.exp(rng.normal(np.log(0.01), 0.3, times.size)) * np.where((times >= 4) & (times < 7), 1.2, 1.0)
    data = [Sample(float(t), float(lat), 200, None) for t, lat in zip(times, latencies, strict=True)]
    data[260] = Sample(data[260].intended_s, 0.002, 503, "http_5xx")
    observations = (Observation(-0.1, MetricsSnapshot(0.0, 0.0, 0.0, {}), "ready"),
                    Observation(4.5, MetricsSnapshot(1.0, 1.0, 0.0, {"oom": 1.0}), "degraded"),
                    Observation(7.5, MetricsSnapshot(0.0, 1.0, 1.0, {"oom": 0.0}), "ready"),
                    Observation(10.2, MetricsSnapshot(0.0, 1.0, 1.0, {"oom": 0.0}), "ready"))
    origin_mono, origin_wall = 1000.0, time.time() - 12
    events = tuple(Event(origin_mono + t, origin_wall + t, kind, text) for t, kind, text in [
        (0.0, "load_started", "load"), (4.0, "inject", "oom armed"), (4.5, "fallback_seen", "fallback active"),
        (7.0, "rollback", "rolled back"), (7.5, "fallback_cleared", "fallback off")])
    verdict = judge(experiment.hypothesis, data, WINDOWS, observations, rollback_s=7.0, faults_left=0,
                    resamples=300) if with_verdict else None
    arm = Activity("arm oom", "action", origin_wall + 4.0, origin_wall + 4.01, "succeeded", {"id": "abc"})
    disarm = Activity("disarm all faults", "rollback", origin_wall + 7.0, origin_wall + 7.01, "succeeded",
                      {"disarmed": ["abc"], "left": 0})
    return RunRecord(experiment=experiment, target=TargetInfo("http://127.0.0.1:1", True, "default", ("--x",)),
                     status=status, reason="" if status == "completed" else "because",  # type: ignore[arg-type]
                     started_at=origin_wall - 2,
                     ended_at=origin_wall + 11, origin_mono=origin_mono, origin_wall=origin_wall, windows=WINDOWS,
                     samples=tuple(data), observations=observations, events=events, activities=(arm,),
                     rollbacks=(disarm,), verdict=verdict, load={"achieved_rate": 50.0},
                     files={"journal": "journal.json", "report": "report.md"})


def test_plots_are_pngs(tmp_path: Path) -> None:
    record = synthetic_record()
    files = write_plots(record, tmp_path)
    assert set(files) == {"latency_over_time", "latency_cdf"}
    for name in files.values():
        content = (tmp_path / name).read_bytes()
        assert content.startswith(PNG) and len(content) > 10_000, name  # a real picture, not an empty canvas


def test_plots_survive_a_run_without_successes(tmp_path: Path) -> None:
    record = synthetic_record()
    failed = tuple(Sample(s.intended_s, s.latency_s, 500, "http_5xx") for s in record.samples)
    from dataclasses import replace

    files = write_plots(replace(record, samples=failed), tmp_path)
    assert all((tmp_path / f).read_bytes().startswith(PNG) for f in files.values())


def test_report_holds_the_verdict_table_phases_and_timeline() -> None:
    record = synthetic_record()
    assert record.verdict is not None
    text = build_report(record)
    assert text.startswith("# OOM drill\n")
    assert "| group | check | measured | tolerance | result |" in text
    for check in record.verdict.checks:
        assert f"| {check.name} |" in text
    assert "| phase | window (s) | requests | offered/s | 2xx | errors | p50 ms | p95 ms | p99 ms | p99.9 ms |" in text
    assert "| fault | 4.0–7.0 |" in text and "http_5xx 1" in text
    assert "| 4.00 | inject | oom armed |" in text
    assert "P99 regression, fault / baseline: " in text and "95% CI" in text
    assert record.verdict.passed, [c for c in record.verdict.checks if not c.ok]
    assert "**PASSED** (completed, exit code 0)" in text


def test_report_links_plots_when_present(tmp_path: Path) -> None:
    record = synthetic_record()
    from dataclasses import replace

    record = replace(record, files={**write_plots(record, tmp_path), **record.files})
    text = build_report(record)
    assert "![latency over time](latency-over-time.png)" in text and "![latency cdf](latency-cdf.png)" in text


def test_journal_shape(tmp_path: Path) -> None:
    record = synthetic_record()
    journal = json.loads(json.dumps(write_journal(record, tmp_path / "journal.json")))
    on_disk = json.loads((tmp_path / "journal.json").read_text())
    assert on_disk == journal
    for key in ("glassbox_version", "experiment", "status", "deviated", "steady_states", "run", "rollbacks",
                "start", "end", "duration", "verdict", "phases", "timeline", "target", "exit_code"):
        assert key in journal, key
    assert journal["status"] == "completed" and journal["exit_code"] == 0
    assert journal["experiment"]["title"] == "OOM drill"
    before = journal["steady_states"]["before"]
    assert before["steady_state_met"] is True and {p["name"] for p in before["probes"]} == {
        "ready before", "baseline error budget"}
    assert journal["run"][0]["activity"] == {"name": "arm oom", "type": "action"}
    assert journal["rollbacks"][0]["output"] == {"disarmed": ["abc"], "left": 0}
    assert [p["name"] for p in journal["phases"]] == ["baseline", "fault", "recovery"]
    assert journal["timeline"][1]["kind"] == "inject" and journal["timeline"][1]["t_s"] == pytest.approx(4.0)


def test_journal_of_an_aborted_run_has_no_verdict(tmp_path: Path) -> None:
    record = synthetic_record(status="aborted", with_verdict=False)
    journal = build_journal(record)
    assert journal["status"] == "aborted" and journal["exit_code"] == 3 and journal["reason"] == "because"
    assert journal["verdict"] is None and journal["steady_states"]["before"] is None
    assert "**ABORTED**" in build_report(record) and "because" in build_report(record)


def test_journal_replaces_non_finite_numbers(tmp_path: Path) -> None:
    from dataclasses import replace

    record = replace(synthetic_record(), load={"achieved_rate": float("inf")})
    journal = write_journal(record, tmp_path / "journal.json")
    assert journal["load"]["achieved_rate"] is None
    json.loads((tmp_path / "journal.json").read_text())  # strict JSON: no Infinity


# --- Grafana ---------------------------------------------------------------------------------------------------------
async def _receiver(replies: list[int]) -> tuple[asyncio.Server, int, list[dict[str, Any]]]:
    """A tiny HTTP server that records each POST's path, auth header and JSON body and answers from `replies`."""
    received: list[dict[str, Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        received.append({"line": lines[0], "auth": headers.get("authorization"), "body": json.loads(body)})
        status = replies.pop(0) if replies else 200
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], received


def test_grafana_annotations_are_posted_and_failures_reported() -> None:
    async def scenario() -> None:
        server, port, received = await _receiver([200, 500])
        async with server:
            annotator = GrafanaAnnotator(f"http://127.0.0.1:{port}/", "secret")
            assert await annotator.annotate(1700000000.5, ["glassbox", "chaos", "oom"], "inject oom") == ""
            problem = await annotator.annotate(1700000001.0, ["glassbox"], "rollback")
            assert problem.startswith("HTTP 500")
        assert received[0]["line"] == "POST /api/annotations HTTP/1.1"
        assert received[0]["auth"] == "Bearer secret"
        assert received[0]["body"] == {"time": 1700000000500, "tags": ["glassbox", "chaos", "oom"],
                                       "text": "inject oom"}
        unreachable = GrafanaAnnotator(f"http://127.0.0.1:{free_port()}", None, timeout_s=2.0)
        assert "ConnectError" in await unreachable.annotate(1.0, [], "x")  # reported, never raised

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_grafana_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_GRAFANA_TOKEN", "from-env")
    assert GrafanaAnnotator("http://g").token == "from-env"
    assert GrafanaAnnotator("http://g", "given").token == "given"
    monkeypatch.delenv("GLASSBOX_GRAFANA_TOKEN")
    assert GrafanaAnnotator("http://g").token is None
