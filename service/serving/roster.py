"""Which process of a multi-process server is which, for the scrape: the supervisor writes the roster (role to pid)
into the server's runtime folder whenever a child starts, and the HTTP worker that answers `/metrics` reads it to
export every process's CPU, memory and file descriptors (telemetry/processes.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

ROSTER = "processes.json"


def write_roster(folder: Path, processes: Mapping[str, int]) -> None:
    """Replace the roster at once (a reader never sees half of it)."""
    staged = folder / f".{ROSTER}.{os.getpid()}"
    staged.write_text(json.dumps(dict(processes)))
    os.replace(staged, folder / ROSTER)


def read_roster(folder: Path) -> dict[str, int]:
    """The roster, or nothing when it cannot be read (the server is starting or stopping)."""
    try:
        loaded = json.loads((folder / ROSTER).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(role): pid for role, pid in loaded.items() if isinstance(pid, int) and not isinstance(pid, bool)}
