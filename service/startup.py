"""What `glassbox serve` says when it cannot start: one line on stderr, in the log format in effect. Where the log
lines are text (a person at a terminal, or --log-format text) it is the plain `glassbox serve: cannot start: ...`
line; where they are JSON (a container's log driver, CI, a pipe) it is one JSON log line with the same message, so a
collector that reads every line as JSON reads this one too."""

from __future__ import annotations

import logging
import sys
from typing import IO

log = logging.getLogger("glassbox")


def resolved_format(log_format: str, stream: IO[str]) -> str:
    """"json" or "text". `auto` is text for a person at a terminal and JSON for anything that stores or ships the
    lines (a container's log driver, CI, a file, a pipe), as uvicorn and most servers choose."""
    if log_format != "auto":
        return log_format
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def cannot_start(log_format: str, message: str) -> int:
    """Say why the server cannot start, once, and return the exit code (1)."""
    if resolved_format(log_format, sys.stderr) == "json":
        log.error("cannot start: %s", message)
    else:
        print(f"glassbox serve: cannot start: {message}", file=sys.stderr)
    return 1
