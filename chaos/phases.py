"""The live side of one experiment run: the fault phase's actions, the rollbacks, and the watch on /metrics.

A Session is used by the runner on one event loop. Times are kept as time.monotonic() while the run is live and
moved onto the load generator's clock (seconds from its start) when the record is built.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any

import httpx

from glassbox.chaos.attacker import Attacker
from glassbox.chaos.client import ChaosClient, ChaosClientError
from glassbox.chaos.experiment import DEFAULT_TTL_MARGIN_S, Experiment, Phase
from glassbox.chaos.grafana import GrafanaAnnotator
from glassbox.chaos.metrics_scrape import Observation, look_every, observe
from glassbox.chaos.record import Activity, ActivityStatus, Status, Timeline
from glassbox.chaos.slowclients import MAX_DURATION_S, SlowClientConfig
from glassbox.chaos.slowclients.config import resolve_target
from glassbox.chaos.watch import WatchProcess

ATTACK_MARGIN_S = 5.0  # an attack outlives its phase by this much unless the rollback stops it first
ATTACK_STOP_TIMEOUT_S = 15.0
UNSUPPORTED = "chaos_unsupported"


class RunStopped(Exception):
    """The method cannot go on: why, and the status the run ends with."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason


def refusal(exc: ChaosClientError, what: str, token_given: bool = True) -> RunStopped:
    """A control-API refusal as a stop: unsupported faults skip the experiment, anything else aborts it."""
    if exc.code == UNSUPPORTED:
        return RunStopped("skipped", f"the target cannot {what}: {exc.message} ({exc.code}); nothing was judged")
    unauthorized = ("the chaos token was refused: pass the target's token with --token-file or GLASSBOX_CHAOS_TOKEN"
                    if token_given else "no chaos token was given: pass --token-file or set GLASSBOX_CHAOS_TOKEN")
    hints = {401: unauthorized,
             404: "no chaos control API: run the target with `glassbox serve --chaos`"}
    hint = hints.get(exc.status, "")
    reason = f"{what}: HTTP {exc.status} {exc.code}: {exc.message}"
    return RunStopped("aborted", reason + (f" ({hint})" if hint else ""))


class Session:
    def __init__(self, experiment: Experiment, url: str, chaos: ChaosClient, http: httpx.AsyncClient,
                 timeline: Timeline, annotator: GrafanaAnnotator | None = None, allow_remote: bool = False) -> None:
        self.experiment = experiment
        self.url = url
        self.chaos = chaos
        self.http = http
        self.timeline = timeline
        self.annotator = annotator
        self.allow_remote = allow_remote
        self.origin: float | None = None  # monotonic time of the load's start
        self.observations: list[Observation] = []  # t_s in monotonic seconds until moved onto the load clock
        self.activities: list[Activity] = []
        self.rollbacks: list[Activity] = []
        self.armed: list[dict[str, Any]] = []
        self.attacks: list[Attacker] = []
        self.rollback_mono: float | None = None
        self.faults_left: int | None = None
        self.rolled_back = False

    # --- watching ---------------------------------------------------------------------------------------------------
    async def observe(self) -> Observation:
        """One look from this event loop (before and after the load; during it, `watch` looks from a process)."""
        return self.record(await observe(self.http, self.url, time.monotonic()))

    def record(self, obs: Observation) -> Observation:
        previous = self.observations[-1] if self.observations else None
        self.observations.append(obs)
        if previous is not None and obs.metrics is not None and previous.metrics is not None:
            rose = (obs.metrics.fallback_entries or 0.0) > (previous.metrics.fallback_entries or 0.0)
            switches = obs.metrics.fallback_entries
            if obs.fallback_active and not previous.fallback_active:
                self.timeline.mark("fallback_seen", f"fallback active, /readyz {obs.ready}", obs.t_s,
                                   switches=switches)
            elif rose and obs.fallback_active:
                self.timeline.mark("fallback_again", "still on the fallback: a probe of the primary failed",
                                   obs.t_s, switches=switches)
            elif rose:
                self.timeline.mark("fallback_seen", "fell back and recovered between two looks (switch counter rose)",
                                   obs.t_s, switches=switches)
            if previous.fallback_active and obs.fallback_active is False:
                self.timeline.mark("fallback_cleared", f"fallback off, /readyz {obs.ready}", obs.t_s)
        return obs

    async def watch(self, interval_s: float, stop: asyncio.Event) -> None:
        """Look every `interval_s` until `stop`, from a process of its own (glassbox.chaos.watch), so that the looks
        take no time from the load generator's event loop; from this loop only where that process cannot start."""
        process = WatchProcess(self.url, interval_s)
        try:
            await process.start()
        except OSError as exc:
            self.timeline.mark("watch_inline", f"the watch process did not start ({exc}); looking from the runner")
            await self._watch_inline(interval_s, stop)
            return

        async def record_all() -> None:
            async for obs in process.observations():
                self.record(obs)

        reader = asyncio.create_task(record_all())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({reader, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await process.stop()
            await reader
        if not stop.is_set():
            self.timeline.mark("watch_inline", "the watch process ended early; looking from the runner")
            await self._watch_inline(interval_s, stop)

    async def _watch_inline(self, interval_s: float, stop: asyncio.Event) -> None:
        await look_every(self.http, self.url, interval_s, stop, self.record)

    async def preflight(self) -> Observation:
        """The target is up and ready, its chaos API answers with no fault armed, and attackers may aim at it."""
        first = await self.observe()
        if first.ready is None:
            raise RunStopped("aborted", f"target {self.url} unreachable: {first.error}")
        if first.ready not in ("ready", "degraded"):
            raise RunStopped("aborted", f"target {self.url} is not ready (/readyz says {first.ready})")
        try:
            armed = await self.chaos.faults()
        except ChaosClientError as exc:
            raise refusal(exc, "list faults", self.chaos.has_token) from None
        except httpx.HTTPError as exc:
            raise RunStopped("aborted", f"chaos control API unreachable: {type(exc).__name__}: {exc}") from None
        if armed:
            kinds = ", ".join(str(f.get("fault")) for f in armed)
            raise RunStopped("aborted", f"faults already armed on the target ({kinds}); disarm them first "
                                        "(DELETE /chaos/faults) so the baseline is a baseline")
        for phase in self.experiment.phases:
            for action in phase.actions:
                if action.slow_clients is not None:
                    try:
                        await resolve_target(self._attack_config(phase, action.slow_clients))
                    except ValueError as exc:
                        raise RunStopped("aborted", f"slow clients cannot aim at {self.url}: {exc} "
                                                    "(--allow-remote lets them, for your own staging)") from None
        return first

    # --- the fault phase --------------------------------------------------------------------------------------------
    def _attack_config(self, phase: Phase, slow: Any) -> SlowClientConfig:
        # All connections open within the first quarter of the phase (at most 1 s), so the attack is at full
        # strength for most of it even in a shortened run.
        return SlowClientConfig(target=self.url, connections=slow.connections, mode=slow.mode,
                                bytes_per_s=slow.bytes_per_s, allow_remote=self.allow_remote,
                                duration_s=min(MAX_DURATION_S, phase.duration_s + ATTACK_MARGIN_S),
                                ramp_s=min(1.0, phase.duration_s / 4))

    def _activity(self, name: str, kind: Any, start: float, status: ActivityStatus, output: Any = None,
                  error: str = "") -> Activity:
        activity = Activity(name, kind, start, time.time(), status, output, error)
        (self.rollbacks if kind == "rollback" else self.activities).append(activity)
        return activity

    async def _annotate(self, text: str, *tags: str) -> None:
        if self.annotator is None:
            return
        problem = await self.annotator.annotate(time.time(), ["glassbox", "chaos", self.experiment.name, *tags], text)
        if problem:
            self.timeline.mark("annotation_failed", f"grafana annotation not posted: {problem}")

    async def start_phase(self, phase: Phase, previous: Phase | None) -> None:
        rate = self.experiment.rate_of(phase)
        self.timeline.mark("phase", f"{phase.name}: {rate:g} req/s ({phase.profile}) for {phase.duration_s:g} s")
        if previous is not None and rate != self.experiment.rate_of(previous):
            # The load plan already holds the new rate; this records it, and in the fault phase it is the fault.
            self._activity(f"change rate to {rate:g} req/s", "action", time.time(), "succeeded",
                           {"from": self.experiment.rate_of(previous), "to": rate, "profile": phase.profile})
            if phase.name == "fault":
                self.timeline.mark("inject", f"rate raised to {rate:g} req/s", fault="rate")
                await self._annotate(f"chaos {self.experiment.name}: rate {rate:g} req/s", "rate", "inject")
        for action in phase.actions:
            if action.arm is not None:
                await self._arm(phase, dict(action.arm))
            elif action.slow_clients is not None:
                start = time.time()
                attacker = Attacker(self._attack_config(phase, action.slow_clients))
                config = attacker.config
                output = {"connections": config.connections, "mode": config.mode,
                          "bytes_per_s": config.bytes_per_s, "duration_s": config.duration_s}
                try:
                    await attacker.start()
                except OSError as exc:
                    self._activity(action.name, "action", start, "failed", output, f"{type(exc).__name__}: {exc}")
                    raise RunStopped("aborted", f"could not start the slow-client attacker: {exc}") from None
                self.attacks.append(attacker)
                self.timeline.mark("inject", action.name, attack="slow_clients")
                self._activity(action.name, "action", start, "succeeded", output)
                await self._annotate(f"chaos {self.experiment.name}: {action.name}", "slow_clients")

    async def _arm(self, phase: Phase, spec: dict[str, Any]) -> None:
        spec.setdefault("ttl_s", phase.duration_s + DEFAULT_TTL_MARGIN_S)
        name = f"arm {spec['fault']}"
        start = time.time()
        try:
            fault = await self.chaos.arm(spec)
        except ChaosClientError as exc:
            self._activity(name, "action", start, "failed", spec, f"{exc.status} {exc.code}: {exc.message}")
            raise refusal(exc, f"arm {spec['fault']}", self.chaos.has_token) from None
        except httpx.HTTPError as exc:
            self._activity(name, "action", start, "failed", spec, f"{type(exc).__name__}: {exc}")
            raise RunStopped("aborted", f"arming {spec['fault']} failed: {type(exc).__name__}: {exc}") from None
        self.armed.append(fault)
        self._activity(name, "action", start, "succeeded", fault)
        self.timeline.mark("inject", f"{spec['fault']} armed: {_params(fault)}", fault_id=fault.get("id"))
        await self._annotate(f"chaos {self.experiment.name}: inject {spec['fault']} {_params(fault)}",
                             str(spec["fault"]), "inject")

    # --- rollbacks --------------------------------------------------------------------------------------------------
    async def rollback(self) -> None:
        """Disarm every fault and stop every attacker. Runs once; each step is recorded even when it fails."""
        if self.rolled_back:
            return
        self.rolled_back = True
        wanted = set(self.experiment.rollbacks)
        if "disarm_faults" in wanted or self.armed:  # whatever the file says, a fault this run armed is disarmed
            await self._disarm()
        if "stop_slow_clients" in wanted or self.attacks:
            await self._stop_attacks()
        self.rollback_mono = time.monotonic()
        self.timeline.mark("rollback", f"rolled back: faults left armed {self.faults_left}, "
                                       f"{len(self.attacks)} attack(s) stopped", self.rollback_mono)
        await self._annotate(f"chaos {self.experiment.name}: rollback", *self.experiment.faults, "rollback")

    async def _disarm(self) -> None:
        start = time.time()
        try:
            disarmed = await self.chaos.disarm_all()
            self.faults_left = len(await self.chaos.faults())
        except (ChaosClientError, httpx.HTTPError) as exc:
            self._activity("disarm all faults", "rollback", start, "failed", None, f"{type(exc).__name__}: {exc}")
            return
        self._activity("disarm all faults", "rollback", start, "succeeded",
                       {"disarmed": [f.get("id") for f in disarmed], "left": self.faults_left})

    async def _stop_attacks(self) -> None:
        start = time.time()
        outcomes = await asyncio.gather(*(a.stop(ATTACK_STOP_TIMEOUT_S) for a in self.attacks),
                                        return_exceptions=True)
        reports = [o for o in outcomes if isinstance(o, dict)]
        problems = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
        self._activity("stop slow clients", "rollback", start, "failed" if problems else "succeeded",
                       {"attacks": len(self.attacks), "reports": reports}, "; ".join(problems))

    # --- the record -------------------------------------------------------------------------------------------------
    def observations_on_load_clock(self) -> list[Observation]:
        origin = self.origin if self.origin is not None else 0.0
        return [dataclasses.replace(o, t_s=o.t_s - origin) for o in self.observations]

    def rollback_s(self) -> float | None:
        if self.rollback_mono is None or self.origin is None:
            return None
        return self.rollback_mono - self.origin


def _params(fault: dict[str, Any]) -> str:
    params = fault.get("params") or {}
    ttl = fault.get("ttl_s")
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    if isinstance(ttl, int | float) and math.isfinite(ttl):
        shown += f"{', ' if shown else ''}ttl {ttl:g} s"
    return shown
