"""Slow clients as an attacker: connections that trickle headers or bodies, or read answers slowly (issue 6, part C)."""

from glassbox.chaos.slowclients.attack import run_slow_clients
from glassbox.chaos.slowclients.config import (
    CLASSIFY_PATH,
    DEFAULT_PIPELINE_DEPTH,
    DEFAULT_TEXTS_PER_REQUEST,
    MAX_CONNECTIONS,
    MAX_DURATION_S,
    MODES,
    Mode,
    RemoteTargetError,
    SlowClientConfig,
)
from glassbox.chaos.slowclients.report import CUTS, Cut, HeldSummary, SlowClientReport

__all__ = [
    "CLASSIFY_PATH",
    "CUTS",
    "DEFAULT_PIPELINE_DEPTH",
    "DEFAULT_TEXTS_PER_REQUEST",
    "MAX_CONNECTIONS",
    "MAX_DURATION_S",
    "MODES",
    "Cut",
    "HeldSummary",
    "Mode",
    "RemoteTargetError",
    "SlowClientConfig",
    "SlowClientReport",
    "run_slow_clients",
]
