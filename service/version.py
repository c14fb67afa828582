"""The installed glassbox version: what `glassbox --version`, `glassbox_build_info`, `/info` and `/v2` all report."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "glassbox-serve"


def version() -> str:
    """The distribution's version, or "unknown" when glassbox runs from a tree that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
