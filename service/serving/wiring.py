"""What every process of either layout builds the same way: its log lines and its telemetry.

One process (`--workers 0`) keeps its metrics in its own registry. In the worker layout the supervisor sets
PROMETHEUS_MULTIPROC_DIR before it starts anyone, and every process (the workers, the engine process) writes its
metrics to files there, which a worker's scrape reads together; each process then says which role it plays
(`Telemetry.process_started`), where it knows (after its engine side is bound, for the engine process).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from glassbox.service.settings import Settings

if TYPE_CHECKING:
    from glassbox.telemetry import Telemetry


def process_telemetry(settings: Settings) -> Telemetry | None:
    """This process's telemetry, or None under --no-telemetry."""
    if not settings.telemetry:
        return None
    from glassbox.telemetry import build_telemetry  # only where telemetry is on

    return build_telemetry(settings, multiprocess_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None)


def configure_logging(settings: Settings, process: str = "") -> None:
    """Log lines in the configured format and level (JSON by default), set before anything else logs; `process`
    names this process in each line when the server runs as several."""
    from glassbox.telemetry import configure_logging as configure

    configure(settings, process=process)
