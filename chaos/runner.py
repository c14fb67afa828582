"""Runs one experiment: a target (a local `glassbox serve --chaos` started for the run, or a given URL), one
continuous open-loop load across the three phases, the fault phase's actions, rollbacks that always run, a watch on
/metrics and /readyz, then the verdict and the journal, report, plots and samples in the output directory."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from glassbox.chaos.capacity import Capacity, measure_capacity
from glassbox.chaos.client import ChaosClient
from glassbox.chaos.experiment import Experiment, ExperimentError, Texts
from glassbox.chaos.grafana import GrafanaAnnotator
from glassbox.chaos.journal import write_journal
from glassbox.chaos.loadgen import LoadConfig, LoadGenerator, LoadResult, RatePlan, read_texts
from glassbox.chaos.loadgen.texts import default_mix
from glassbox.chaos.local import LocalServer, ServerStartError
from glassbox.chaos.metrics_scrape import LOOK_TIMEOUT_S
from glassbox.chaos.phases import RunStopped, Session
from glassbox.chaos.plots import write_plots
from glassbox.chaos.record import Event, RunRecord, Status, TargetInfo, Timeline
from glassbox.chaos.report import write_report
from glassbox.chaos.samples import Sample
from glassbox.chaos.stats import PhaseWindow
from glassbox.chaos.verdict import Verdict, judge
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import HELDOUT_FILE

LOAD_START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RunOptions:
    out_dir: Path
    target: str | None = None  # None: start a local server
    token: str | None = None  # the target's chaos token (a local server gets a fresh one)
    model: str | None = None  # overrides the experiment's target.model for a local server
    serve_args: tuple[str, ...] = ()  # appended to the experiment's target.serve_args
    grafana_url: str | None = None
    grafana_token: str | None = None
    scrape_interval_s: float = 0.5
    resamples: int = 2000
    allow_remote: bool = False  # let slow-client attackers aim at a non-loopback target
    port: int | None = None  # the local server's port (None: a free one)
    on_event: Callable[[Event], None] | None = None  # told of each timeline event as it happens (progress)


def plan_for(experiment: Experiment) -> tuple[RatePlan, tuple[PhaseWindow, ...]]:
    """One rate plan for the whole run (each phase's profile at its own rate, back to back) and the phase windows."""
    segments: list[tuple[float, float]] = []
    windows: list[PhaseWindow] = []
    start = experiment.load.warmup_s
    if start > 0:
        segments.append((0.0, experiment.rate_of(experiment.phases[0])))
    for phase in experiment.phases:
        plan = RatePlan.of(phase.profile, experiment.rate_of(phase), phase.duration_s)
        segments += [(start + offset, rate) for offset, rate in plan.segments]
        windows.append(PhaseWindow(phase.name, start, start + phase.duration_s))
        start += phase.duration_s
    return RatePlan(tuple(segments), start), tuple(windows)


def texts_of(texts: Texts, model_dir: Path | None, where: str) -> tuple[str, ...]:
    """The texts a Texts names; `model_dir` is the local server's model (None for a remote target)."""
    if texts.heldout:
        if model_dir is None:
            raise ExperimentError(f"{where}: heldout means the held-out texts of the local server's model; against "
                                  "--target, give a file of texts (file: PATH)")
        path = model_dir / HELDOUT_FILE
    else:
        assert texts.file is not None
        path = texts.file
    try:
        return read_texts(path, texts.label)
    except (OSError, ValueError) as exc:
        raise ExperimentError(f"{where}: {getattr(exc, 'strerror', None) or exc}") from None


def load_config(experiment: Experiment, url: str, plan: RatePlan, windows: Sequence[PhaseWindow],
                model_dir: Path | None) -> LoadConfig:
    load = experiment.load
    texts = texts_of(load.texts, model_dir, "load.texts") if load.texts is not None else None
    fault, fault_window = experiment.phase("fault"), windows[1]
    shifted = texts_of(fault.texts, model_dir, "method[1].texts") if fault.texts is not None else None
    return LoadConfig(target=url, plan=plan, protocol=load.protocol, texts=texts, connections=load.connections,
                      timeout_s=load.timeout_s, seed=load.seed, max_outstanding=load.max_outstanding,
                      shifted_texts=shifted, shifted_window=(fault_window.start_s, fault_window.end_s))


def local_model_dir(model: str) -> Path:
    """The directory of the model a local server serves ("default": the built-in one)."""
    return default_model_dir() if model == "default" else Path(model).expanduser()


async def _until(session: Session, offset_s: float, stop: asyncio.Event, load: asyncio.Task[LoadResult]) -> None:
    """Wait until `offset_s` on the load clock; a stop request or a load that died ends the method."""
    assert session.origin is not None
    remaining = session.origin + offset_s - time.monotonic()
    if remaining > 0:
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({stopped, load}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
    if stop.is_set():
        raise RunStopped("interrupted", "interrupted (SIGINT/SIGTERM); rollbacks ran")
    if load.done() and load.exception() is not None:
        exc = load.exception()
        raise RunStopped("aborted", f"the load generator failed: {type(exc).__name__}: {exc}")


async def _method(session: Session, experiment: Experiment, url: str, windows: Sequence[PhaseWindow],
                  model_dir: Path | None, plan: RatePlan, stop: asyncio.Event, scrape_interval_s: float) -> LoadResult:
    await session.preflight()
    generator = LoadGenerator(load_config(experiment, url, plan, windows, model_dir))
    watching = asyncio.Event()
    # The watch starts first: its process then neither inherits the generator's scheduler slice nor starts up while
    # the generator does; looks before the load's origin land before the warm-up on the load clock, as preflight's.
    watcher = asyncio.create_task(session.watch(scrape_interval_s, watching))
    load = asyncio.create_task(generator.run())
    try:
        deadline = time.monotonic() + LOAD_START_TIMEOUT_S
        while generator.started_at is None and not load.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)  # the generator sets its origin as soon as its client is open
        if generator.started_at is None:
            failure = load.exception() if load.done() else None
            why = f": {type(failure).__name__}: {failure}" if failure is not None else ""
            raise RunStopped("aborted", f"the load generator did not start{why}")
        session.origin = generator.started_at
        session.timeline.events.append(Event(generator.started_at, time.time(), "load_started",
                                             f"open-loop load: {plan.count} requests over {plan.duration_s:g} s"))
        previous = None
        for window, phase in zip(windows, experiment.phases, strict=True):
            await _until(session, window.start_s, stop, load)
            if phase.name == "recovery":
                await session.rollback()
            await session.start_phase(phase, previous)
            previous = phase
        await _until(session, windows[-1].end_s, stop, load)
        result = await load
        session.timeline.mark("load_finished", f"load finished: {result.recorded} requests recorded")
        return result
    finally:
        generator.stop()  # a no-op after a complete run; ends an aborted one without waiting out its plan
        watching.set()
        await watcher
        if not load.done():
            with contextlib.suppress(Exception):
                await load


async def engine_of(http: httpx.AsyncClient, url: str) -> str:
    """"KIND (DTYPE)" from the target's /info (TEI's route, with glassbox's own fields), or "" where it does not say."""
    try:
        info = (await http.get(url + "/info")).json()
        extra = info.get("glassbox") or {}
        return f"{extra['engine']} ({info['model_dtype']} on {extra['device']})"
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return ""


def _reason(verdict: Verdict) -> str:
    failed = [f"{c.name} ({c.measured}, tolerance {c.tolerance})" for c in verdict.checks if not c.ok]
    return "failed: " + "; ".join(failed) if failed else ""


async def run_experiment(experiment: Experiment, options: RunOptions, stop: asyncio.Event | None = None) -> RunRecord:
    """Everything but the command line: returns the record after writing its files into options.out_dir.
    Raises ExperimentError for a problem with the experiment itself (the caller's usage error)."""
    stop = stop or asyncio.Event()
    options.out_dir.mkdir(parents=True, exist_ok=True)
    plan, windows = plan_for(experiment.resolved(1.0))
    model = options.model or experiment.target.model
    model_dir = local_model_dir(model) if options.target is None else None
    # A bad texts file is a usage error, before any server starts.
    load_config(experiment, "http://127.0.0.1", plan, windows, model_dir)
    capacity: Capacity | None = None
    timeline = Timeline(on_mark=options.on_event)
    started = time.time()
    local: LocalServer | None = None
    status: Status = "aborted"
    reason = ""
    result: LoadResult | None = None
    session: Session | None = None
    serve_args = experiment.target.serve_args + options.serve_args
    if options.target is None:
        local = LocalServer(model, serve_args, options.out_dir / "server.log", experiment.target.startup_timeout_s,
                            port=options.port)
        target = TargetInfo(local.url, True, model, serve_args, "server.log")
    else:
        ignored = "the experiment's target section (model, serve_args) applies only to a local server" \
            if experiment.target.serve_args or experiment.target.model != "default" else ""
        target = TargetInfo(options.target.rstrip("/"), False, None, (), None, ignored)
    try:
        if local is not None:
            timeline.mark("server_starting", f"starting glassbox {' '.join(local.argv[3:])}")
            await local.start()
            timeline.mark("server_ready", f"local server ready at {local.url}")
        token = local.token if local is not None else options.token
        annotator = GrafanaAnnotator(options.grafana_url, options.grafana_token) if options.grafana_url else None
        if experiment.load.relative:
            capacity = await _capacity(experiment, target.url, timeline, model_dir)
            experiment = experiment.resolved(capacity.ok_per_s)
            plan, windows = plan_for(experiment)
        async with httpx.AsyncClient(timeout=LOOK_TIMEOUT_S, trust_env=False) as http, \
                ChaosClient(target.url, token) as chaos:
            target = replace(target, engine=await engine_of(http, target.url))
            session = Session(experiment, target.url, chaos, http, timeline, annotator, options.allow_remote)
            try:
                result = await _method(session, experiment, target.url, windows, model_dir, plan, stop,
                                       options.scrape_interval_s)
                status = "completed"
            except RunStopped as exc:
                status, reason = exc.status, exc.reason
                timeline.mark(exc.status, exc.reason)
            finally:
                await session.rollback()
                await session.observe()  # the state the rollback left: "ready after" and the fallback clear
    except (ServerStartError, ExperimentError) as exc:
        status, reason = "aborted", exc.message
        timeline.mark("aborted", reason.splitlines()[0])
    finally:
        if local is not None:
            code = await local.stop()
            timeline.mark("server_stopped", f"local server stopped (exit code {code})")
    return _finish(experiment, options, target, timeline, session, windows, result, status, reason, started, capacity)


async def _capacity(experiment: Experiment, url: str, timeline: Timeline, model_dir: Path | None) -> Capacity:
    """The target's capacity, closed loop, on the experiment's own texts and wire format."""
    load = experiment.load
    texts = texts_of(load.texts, model_dir, "load.texts") if load.texts is not None else default_mix(load.seed)
    timeline.mark("capacity_measuring", f"measuring capacity: {load.capacity_connections} closed-loop clients for "
                                        f"{load.capacity_duration_s:g} s")
    capacity = await measure_capacity(url, texts, load.protocol, connections=load.capacity_connections,
                                      duration_s=load.capacity_duration_s)
    timeline.mark("capacity_measured", f"capacity {capacity.ok_per_s:.1f} requests/s "
                                       f"({capacity.answered} answered, {capacity.failed} not 2xx)")
    return capacity


def _finish(experiment: Experiment, options: RunOptions, target: TargetInfo, timeline: Timeline,
            session: Session | None, windows: tuple[PhaseWindow, ...], result: LoadResult | None, status: Status,
            reason: str, started: float, capacity: Capacity | None = None) -> RunRecord:
    origin = session.origin if session is not None and session.origin is not None else time.monotonic()
    origin_wall = time.time() - (time.monotonic() - origin)
    samples = tuple(sorted(result.samples, key=lambda s: s.intended_s)) if result is not None else ()
    observations = tuple(session.observations_on_load_clock()) if session is not None else ()
    verdict: Verdict | None = None
    if status == "completed" and session is not None:
        verdict = judge(experiment.hypothesis, samples, windows, observations, rollback_s=session.rollback_s(),
                        faults_left=session.faults_left, seed=experiment.load.seed, resamples=options.resamples)
        status = "completed" if verdict.passed else "failed"
        reason = _reason(verdict)
        back = verdict.recovery.total_s
        rollback_s = verdict.recovery.rollback_s
        if back is not None and rollback_s is not None:
            timeline.events.append(Event(origin + rollback_s + back, origin_wall + rollback_s + back, "recovered",
                                         f"recovered {back:.2f} s after the rollback"))
    files: dict[str, str] = {"journal": "journal.json", "report": "report.md"}
    if samples:
        files["samples"] = "samples.csv"
    if target.log_path:
        files["server log"] = target.log_path
    record = RunRecord(
        experiment=experiment, target=target, status=status, reason=reason, started_at=started,
        ended_at=time.time(), origin_mono=origin, origin_wall=origin_wall, windows=windows, samples=samples,
        observations=observations, events=tuple(sorted(timeline.events, key=lambda e: e.mono)),
        activities=tuple(session.activities) if session else (), rollbacks=tuple(session.rollbacks) if session else (),
        verdict=verdict, load=_load_summary(result), files=files,
        capacity=capacity.to_json() if capacity is not None else None,
    )
    if samples:
        record = replace(record, files={**write_plots(record, options.out_dir), **files})
        _write_samples(samples, options.out_dir / "samples.csv")
    write_journal(record, options.out_dir / "journal.json")
    write_report(record, options.out_dir / "report.md")
    return record


def _load_summary(result: LoadResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    summary = result.to_json()
    summary.pop("spectrum", None)  # per phase figures are in the verdict; the whole-run spectrum mixes phases
    return summary


def _write_samples(samples: Sequence[Sample], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(("intended_s", "latency_s", "status", "error"))
        for s in samples:
            writer.writerow((f"{s.intended_s:.6f}", f"{s.latency_s:.6f}", s.status, s.error or ""))
