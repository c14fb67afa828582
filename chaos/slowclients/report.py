"""What a slow-client attack saw: how many connections it held, how the server ended them, and how long that took."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from glassbox.chaos.slowclients.config import Mode, SlowClientConfig

# How the server ended a connection: it answered (headers/body modes: any answer ends the attempt), closed without
# an answer, or reset it.
Cut = Literal["answered", "eof", "reset"]
CUTS: tuple[Cut, ...] = ("answered", "eof", "reset")


@dataclass(frozen=True, slots=True)
class HeldSummary:
    """Seconds from the start of the connect to the server's cut, over the connections the server cut, as the
    attacker's event loop saw them. The clock starts before the connect, so the figure is never shorter than the
    server's own hold; when that loop is saturated (hundreds of slots on a busy machine) it notices the cut late, and
    the figure comes out longer."""

    count: int
    median_s: float | None
    max_s: float | None
    min_s: float | None

    @classmethod
    def of(cls, held: list[float]) -> HeldSummary:
        if not held:
            return cls(0, None, None, None)
        return cls(len(held), statistics.median(held), max(held), min(held))


@dataclass(frozen=True, slots=True)
class SlowClientReport:
    mode: Mode
    target: str
    connections: int  # the concurrency asked for
    bytes_per_s: float  # per connection
    elapsed_s: float  # how long the attack ran (the duration, or less when stopped or when nothing was left to do)
    opened: int  # connections established, reconnections included
    reconnects: int  # of those, openings after the server had cut the slot's previous connection
    closed_by_server: int  # cut by the server: answered, closed or reset
    still_open_at_end: int  # held until the attack ended, then closed by the attacker
    cuts: dict[Cut, int]
    statuses: dict[int, int]  # every status line the server sent, by status
    held: HeldSummary
    bytes_sent: int
    bytes_received: int
    errors: dict[str, int]  # the attacker's own failures: connect_refused, connect_timeout, connect_other

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "target": self.target,
            "connections": self.connections,
            "bytes_per_s": self.bytes_per_s,
            "elapsed_s": round(self.elapsed_s, 6),
            "opened": self.opened,
            "reconnects": self.reconnects,
            "closed_by_server": self.closed_by_server,
            "still_open_at_end": self.still_open_at_end,
            "cuts": dict(self.cuts),
            "statuses": {str(status): n for status, n in sorted(self.statuses.items())},
            "held_s": {"count": self.held.count, "median": self.held.median_s, "max": self.held.max_s,
                       "min": self.held.min_s},
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "errors": dict(sorted(self.errors.items())),
        }


@dataclass
class Tally:
    """The running counts of one attack. Only touched from the attack's own event loop."""

    opened: int = 0
    reconnects: int = 0
    still_open_at_end: int = 0
    cuts: Counter[Cut] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    held: list[float] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def cut(self, how: Cut, held_s: float) -> None:
        self.cuts[how] += 1
        self.held.append(held_s)

    def report(self, config: SlowClientConfig, elapsed_s: float) -> SlowClientReport:
        return SlowClientReport(
            mode=config.mode, target=config.target, connections=config.connections, bytes_per_s=config.bytes_per_s,
            elapsed_s=elapsed_s, opened=self.opened, reconnects=self.reconnects,
            closed_by_server=sum(self.cuts.values()), still_open_at_end=self.still_open_at_end,
            cuts={how: self.cuts[how] for how in CUTS}, statuses=dict(self.statuses), held=HeldSummary.of(self.held),
            bytes_sent=self.bytes_sent, bytes_received=self.bytes_received, errors=dict(self.errors))
