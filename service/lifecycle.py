"""The service's readiness state machine: loading -> ready -> draining -> stopped (degraded beside ready).

In an HTTP worker process the engine lives in another process: the worker mirrors what the engine process reports
(its device, degradation and liveness) and is ready only while the engine is reachable and ready itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

# Exit statuses, the same in both layouts (0: stopped after a drain; 1: could not start, or a crash; 2: bad usage).
# A process that left because it had been dead for --exit-when-dead-s (see DeadClock): a process manager restarts it.
EXIT_DEAD = 3
# A process of the worker layout whose model or settings cannot work (EX_CONFIG): the supervisor does not restart it.
EXIT_CONFIG = 78

# "restarting" is only reported, never set: a ready worker process whose engine process is down reads as it.
Phase = Literal["loading", "ready", "restarting", "draining", "stopped"]


@dataclass(frozen=True, slots=True)
class Readiness:
    phase: Phase
    ready: bool
    degraded: bool
    device: str
    reason: str


class Lifecycle:
    """Shared between the event loop, the engine thread and the signal handler; every change is locked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase: Phase = "loading"
        self._device = ""
        self._degraded_reason = ""
        self._live = True
        self._not_live_reason = ""
        self._engine_down = ""  # why the engine process cannot serve now; "" while it can (or runs in-process)

    def mark_ready(self, device: str) -> None:
        with self._lock:
            if self._phase == "loading":
                self._phase = "ready"
            self._device = device

    def begin_drain(self) -> bool:
        """Readiness turns false at once. Returns False when already draining or stopped."""
        with self._lock:
            if self._phase in ("draining", "stopped"):
                return False
            self._phase = "draining"
            return True

    def mark_stopped(self) -> None:
        with self._lock:
            self._phase = "stopped"

    def set_degraded(self, device: str, reason: str) -> None:
        with self._lock:
            self._device = device
            self._degraded_reason = reason

    def clear_degraded(self, device: str) -> None:
        with self._lock:
            self._device = device
            self._degraded_reason = ""

    def mark_not_live(self, reason: str) -> None:
        with self._lock:
            self._live = False
            self._not_live_reason = reason

    def set_live(self, live: bool, reason: str = "") -> None:
        """Worker processes: liveness as the engine process (or the supervisor's restart budget) reports it."""
        with self._lock:
            self._live = live
            self._not_live_reason = "" if live else reason

    def set_engine_down(self, reason: str) -> None:
        """Worker processes: the engine process is unreachable or not ready; readiness is false until it is back."""
        with self._lock:
            self._engine_down = reason or "the engine is not available"

    def set_engine_up(self) -> None:
        with self._lock:
            self._engine_down = ""

    @property
    def live(self) -> tuple[bool, str]:
        with self._lock:
            return self._live, self._not_live_reason

    def readiness(self) -> Readiness:
        with self._lock:
            degraded = bool(self._degraded_reason)
            if self._phase == "ready" and self._engine_down:
                return Readiness("restarting", False, degraded, self._device, self._engine_down)
            reason = self._degraded_reason or {
                "loading": "loading the model and warming up",
                "ready": "",
                "restarting": "",
                "draining": "draining: finishing in-flight requests before exit",
                "stopped": "stopped",
            }[self._phase]
            return Readiness(self._phase, self._phase == "ready", degraded, self._device, reason)


class DeadClock:
    """--exit-when-dead-s: whether liveness has been false for `after_s` seconds without a break (never when
    `after_s` is 0). Fed by whoever polls liveness, on the clock it passes."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: float | None = None

    def expired(self, live: bool, now: float) -> bool:
        if live or self.after_s <= 0:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= self.after_s
