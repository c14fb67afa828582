"""The board of armed chaos faults: shared by the event loop, which arms and disarms, and the engine thread, which asks
once per batch what to inject (`begin_batch`).

Every fault has a time-to-live. Expiry is checked lazily on every read and by the app's periodic sweep, so a fault
disarms itself on time even when no traffic arrives. Each arm, disarm and expiry is one FaultChange to every listener
(the app logs it and sets `glassbox_chaos_fault_active{fault}`). Faults that hold device memory hand the board a
Hold, released exactly once when the fault goes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from glassbox.chaos.specs import ErrorSpec, FaultKind, FaultSpec, LatencySpec, OomSpec
from glassbox.service.errors import ChaosFaultNotFoundError, ChaosInvalidFaultError, ChaosTooManyFaultsError

log = logging.getLogger("glassbox.chaos")

ChangeEvent = Literal["armed", "disarmed", "expired", "spent"]  # spent: an oom fault used up its `batches`
MAX_ARMED = 32


class Hold(Protocol):
    """Resources a fault holds while armed (device memory); released once, when it is disarmed or expires."""

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Fault:
    """A snapshot of one armed fault, as the control API shows it."""

    id: str
    spec: FaultSpec
    armed_at: float  # unix seconds
    expires_at: float  # unix seconds
    detail: Mapping[str, Any]  # what the fault did so far, and what a GPU fault reached when armed

    @property
    def kind(self) -> FaultKind:
        return self.spec.kind

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "fault": self.kind, "params": self.spec.params_json(), "armed_at": self.armed_at,
                "expires_at": self.expires_at, "ttl_s": self.spec.ttl_s, "detail": dict(self.detail)}


@dataclass(frozen=True, slots=True)
class FaultChange:
    event: ChangeEvent
    fault: Fault
    kind_active: bool  # after this change, at least one fault of this kind is still armed


@dataclass(frozen=True, slots=True)
class BatchFaults:
    """What the engine thread injects into one primary batch."""

    latency: tuple[tuple[str, LatencySpec], ...]
    errors: tuple[tuple[str, ErrorSpec], ...]
    oom: str | None  # the id of an armed oom raise fault: this batch raises


class _Armed:
    """One armed fault's mutable state; touched only under the board's lock."""

    __slots__ = ("armed_at", "batches_left", "deadline", "detail", "hold", "id", "spec")

    def __init__(self, fault_id: str, spec: FaultSpec, armed_at: float, deadline: float, hold: Hold | None,
                 detail: Mapping[str, Any]) -> None:
        self.id = fault_id
        self.spec = spec
        self.armed_at = armed_at
        self.deadline = deadline  # on the monotonic clock: wall-clock jumps neither shorten nor stretch a TTL
        self.hold = hold
        self.detail: dict[str, Any] = dict(detail)
        self.batches_left = spec.params.batches if isinstance(spec.params, OomSpec) else None
        if self.batches_left is not None:
            self.detail["batches_left"] = self.batches_left

    def snapshot(self) -> Fault:
        return Fault(self.id, self.spec, self.armed_at, self.armed_at + self.spec.ttl_s, dict(self.detail))


Listener = Callable[[FaultChange], None]


class FaultBoard:
    """The armed faults of one server. Thread-safe; `clock` (monotonic) and `wall` (unix) are injectable."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 max_armed: int = MAX_ARMED) -> None:
        self._clock = clock
        self._wall = wall
        self._max_armed = max_armed
        # Reentrant, and held while listeners run: changes reach them in the order they happened, so a gauge set
        # by a listener always ends at the board's true state.
        self._lock = threading.RLock()
        self._armed: dict[str, _Armed] = {}
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def check_room(self) -> None:
        """Refuse early, before a GPU fault spends seconds allocating memory it could not keep."""
        self.expire()
        with self._lock:
            self._refuse_when_full()

    def arm(self, spec: FaultSpec, *, hold: Hold | None = None, detail: Mapping[str, Any] | None = None) -> Fault:
        """Arm `spec`. On refusal (too many armed) `hold` is released before the error propagates."""
        self.expire()
        try:
            with self._lock:
                self._refuse_when_full()
                armed = _Armed(uuid.uuid4().hex[:12], spec, self._wall(), self._clock() + spec.ttl_s, hold,
                               detail or {})
                self._armed[armed.id] = armed
                fault = armed.snapshot()
                self._notify("armed", fault)
        except (ChaosInvalidFaultError, ChaosTooManyFaultsError):
            _release([hold] if hold is not None else [])
            raise
        return fault

    def disarm(self, fault_id: str) -> Fault:
        self.expire()
        with self._lock:
            armed = self._armed.pop(fault_id, None)
            if armed is None:
                raise ChaosFaultNotFoundError(f"no armed fault has id {fault_id[:64]!r} (it may have expired)")
            fault = armed.snapshot()
            self._notify("disarmed", fault)
        _release([armed.hold] if armed.hold is not None else [])
        return fault

    def disarm_all(self) -> list[Fault]:
        self.expire()
        with self._lock:
            gone = list(self._armed.values())  # insertion order: oldest first
            self._armed.clear()
            faults = [armed.snapshot() for armed in gone]
            for fault in faults:
                self._notify("disarmed", fault)
        _release([armed.hold for armed in gone if armed.hold is not None])
        return faults

    def faults(self) -> list[Fault]:
        """The faults still armed, oldest first."""
        self.expire()
        with self._lock:
            return [armed.snapshot() for armed in self._armed.values()]  # insertion order: oldest first

    def expire(self) -> list[Fault]:
        """Disarm every fault whose time-to-live ran out and release what they held; returns them. Every other
        method calls it first, and the app calls it periodically, so faults expire on time even without traffic."""
        if not self._armed:  # a racy peek, but only ever a shortcut: the next read expires what it skipped
            return []
        with self._lock:
            now = self._clock()
            gone = [armed for armed in self._armed.values() if armed.deadline <= now]
            faults = []
            for armed in gone:
                del self._armed[armed.id]
                faults.append(armed.snapshot())
                self._notify("expired", faults[-1])
        _release([armed.hold for armed in gone if armed.hold is not None])
        return faults

    def due(self) -> bool:
        """Whether some fault's time-to-live has run out (cheap: lets a periodic sweep skip the thread hop)."""
        with self._lock:
            now = self._clock()
            return any(armed.deadline <= now for armed in self._armed.values())

    def begin_batch(self) -> BatchFaults | None:
        """Engine thread, once per primary batch: the faults to inject, or None. Counts the batch against every armed
        oom raise fault; one whose `batches` budget is used up is disarmed now ("spent"), this batch still failing."""
        self.expire()
        if not self._armed:
            return None
        with self._lock:
            latency, errors, oom = [], [], None
            for armed in list(self._armed.values()):
                params = armed.spec.params
                if isinstance(params, LatencySpec):
                    latency.append((armed.id, params))
                elif isinstance(params, ErrorSpec):
                    errors.append((armed.id, params))
                elif isinstance(params, OomSpec) and params.mode == "raise":
                    oom = oom or armed.id
                    armed.detail["batches_failed"] = armed.detail.get("batches_failed", 0) + 1
                    if armed.batches_left is not None:
                        armed.batches_left -= 1
                        armed.detail["batches_left"] = armed.batches_left
                        if armed.batches_left <= 0:
                            del self._armed[armed.id]
                            self._notify("spent", armed.snapshot())
        if not (latency or errors or oom):
            return None
        return BatchFaults(tuple(latency), tuple(errors), oom)

    def tally(self, fault_id: str, key: str, amount: float = 1) -> None:
        """Add to a counter in a fault's detail (the engine thread reports what it injected)."""
        with self._lock:
            armed = self._armed.get(fault_id)
            if armed is not None:
                armed.detail[key] = armed.detail.get(key, 0) + amount

    def active_kinds(self) -> set[FaultKind]:
        self.expire()
        with self._lock:
            return {armed.spec.kind for armed in self._armed.values()}

    def _refuse_when_full(self) -> None:
        if len(self._armed) >= self._max_armed:
            raise ChaosTooManyFaultsError(
                f"{self._max_armed} faults are armed already, the most this server holds; disarm some first")

    def _notify(self, event: ChangeEvent, fault: Fault) -> None:
        # Under the lock (see __init__).
        active = any(armed.spec.kind == fault.kind for armed in self._armed.values())
        change = FaultChange(event, fault, active)
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:  # a listener (log, telemetry) must never keep a fault armed or a batch from running
                log.exception("chaos fault listener failed")


def _release(holds: list[Hold]) -> None:
    for hold in holds:
        try:
            hold.release()
        except Exception:
            log.exception("releasing what a chaos fault held failed")
